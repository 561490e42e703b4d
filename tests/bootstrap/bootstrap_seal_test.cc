// bootstrap_seal_test.cc: the MAC every bootstrap UCX message carries
// (mep_bs_seal / mep_bs_sealed), against its definition computed here from
// the HMAC primitive: key = HMAC-SHA-256(job token, "moe-ep message key"
// with its NUL), MAC = HMAC-SHA-256(key, "moe-ep message" with its NUL,
// the header with its MAC field zeroed, the payload). Any changed byte of
// header or payload, or another token, is refused.
#include <stddef.h>
#include <string.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

extern "C" {
#include "runtime/bootstrap_types.h"
}
#include "runtime/hmac.h"

namespace {

std::unique_ptr<mep_bootstrap_t> WithToken(const char *token) {
  std::unique_ptr<mep_bootstrap_t> bs(new mep_bootstrap_t());
  snprintf(bs->token, sizeof(bs->token), "%s", token);
  mep_bs_msg_key_init(bs.get());
  return bs;
}

// A CONTRIB of rank 1 with `n` payload bytes, laid out as the wire has it.
std::vector<unsigned char> Message(const mep_bootstrap_t *bs, size_t n) {
  mep_bs_hdr_t h;
  mep_bs_hdr_init(bs, &h, MEP_BS_MSG_CONTRIB);
  h.src = 1;
  h.seq = 3;
  h.op = MEP_BS_OP_ALLGATHER;
  h.bytes = n;
  h.payload_len = n;
  std::vector<unsigned char> m(sizeof(h) + n);
  memcpy(m.data(), &h, sizeof(h));
  for (size_t i = 0; i < n; i++) m[sizeof(h) + i] = (unsigned char)(i * 7 + 1);
  return m;
}

std::vector<unsigned char> Expected(const char *token, const std::vector<unsigned char> &m) {
  static const char kKeyLabel[] = "moe-ep message key", kLabel[] = "moe-ep message";
  unsigned char key[MEP_SHA256_BYTES], mac[MEP_SHA256_BYTES];
  const void *kp[1] = {kKeyLabel};
  const size_t kl[1] = {sizeof(kKeyLabel)};
  mep_hmac_sha256(token, strlen(token), 1, kp, kl, key);
  std::vector<unsigned char> hdr(m.begin(), m.begin() + sizeof(mep_bs_hdr_t));
  memset(hdr.data() + offsetof(mep_bs_hdr_t, mac), 0, MEP_SHA256_BYTES);
  const void *parts[3] = {kLabel, hdr.data(), m.data() + sizeof(mep_bs_hdr_t)};
  const size_t lens[3] = {sizeof(kLabel), hdr.size(), m.size() - sizeof(mep_bs_hdr_t)};
  mep_hmac_sha256(key, sizeof(key), m.size() > hdr.size() ? 3 : 2, parts, lens, mac);
  return std::vector<unsigned char>(mac, mac + sizeof(mac));
}

bool Sealed(const mep_bootstrap_t *bs, const std::vector<unsigned char> &m) {
  mep_bs_hdr_t h;
  memcpy(&h, m.data(), sizeof(h));
  return mep_bs_sealed(bs, &h, m.data() + sizeof(h), m.size() - sizeof(h)) != 0;
}

TEST(BootstrapSeal, MacIsTheDefinitionsAndChecks) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{200}}) {
    auto bs = WithToken("job-token-1");
    std::vector<unsigned char> m = Message(bs.get(), n);
    mep_bs_seal(bs.get(), m.data());
    std::vector<unsigned char> got(m.begin() + offsetof(mep_bs_hdr_t, mac),
                                   m.begin() + offsetof(mep_bs_hdr_t, mac) + MEP_SHA256_BYTES);
    EXPECT_EQ(got, Expected("job-token-1", m)) << "payload " << n << " bytes";
    EXPECT_TRUE(Sealed(bs.get(), m)) << "payload " << n << " bytes";
  }
}

TEST(BootstrapSeal, EveryChangedByteIsRefused) {
  auto bs = WithToken("job-token-1");
  std::vector<unsigned char> m = Message(bs.get(), 64);
  mep_bs_seal(bs.get(), m.data());
  for (size_t i = 0; i < m.size(); i++) {
    std::vector<unsigned char> bad = m;
    bad[i] ^= 0x01;
    if (i >= offsetof(mep_bs_hdr_t, payload_len) &&
        i < offsetof(mep_bs_hdr_t, payload_len) + sizeof(uint64_t)) {
      continue;  // the length is checked against what arrived before the MAC
    }
    EXPECT_FALSE(Sealed(bs.get(), bad)) << "byte " << i << " of " << m.size() << " changed";
  }
}

TEST(BootstrapSeal, AnotherTokensKeyIsRefused) {
  auto mine = WithToken("job-token-1"), theirs = WithToken("job-token-2");
  std::vector<unsigned char> m = Message(theirs.get(), 16);
  mep_bs_seal(theirs.get(), m.data());
  EXPECT_TRUE(Sealed(theirs.get(), m));
  EXPECT_FALSE(Sealed(mine.get(), m)) << "a message sealed under another job token was taken";
}

}  // namespace
