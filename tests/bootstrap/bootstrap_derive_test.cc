// bootstrap_derive_test.cc: mep_bootstrap_derive, the keys a group's ranks
// derive from the job token for what else they must authenticate, against
// its definition computed here from the hash primitive:
//   key = HMAC-SHA-256(job token, "moe-ep derived key" with its NUL,
//       label with its NUL, the group's nonce, ctx).
// The same inputs give the same key; another label, ctx, group nonce or
// token another; a label and ctx cannot be shifted into each other. Real
// groups: the two ranks of one group agree, two groups of one never meet.
#include <string.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

extern "C" {
#include "runtime/bootstrap_types.h"
}
#include "runtime/error.h"
#include "runtime/hmac.h"
#include "tests/common/ports.h"

namespace {

using Bytes = std::vector<uint8_t>;

// A formed group's bootstrap as far as derive reads it.
std::unique_ptr<mep_bootstrap_t> Group(const char *token, uint8_t nonce_byte) {
  std::unique_ptr<mep_bootstrap_t> bs(new mep_bootstrap_t());
  snprintf(bs->token, sizeof(bs->token), "%s", token);
  memset(bs->group_nonce, nonce_byte, sizeof(bs->group_nonce));
  bs->world_size = 2;
  return bs;
}

Bytes Derive(const mep_bootstrap_t *bs, const char *label, const std::string &ctx) {
  Bytes out(MEP_BOOTSTRAP_KEY_BYTES, 0);
  EXPECT_EQ(mep_bootstrap_derive(bs, label, ctx.data(), ctx.size(), out.data()), MOE_EP_OK)
      << mep_last_error();
  return out;
}

Bytes Definition(const char *token, uint8_t nonce_byte, const char *label,
                 const std::string &ctx) {
  const char domain[] = "moe-ep derived key";
  const Bytes nonce(MEP_BS_NONCE_BYTES, nonce_byte);
  const void *parts[4] = {domain, label, nonce.data(), ctx.data()};
  const size_t lens[4] = {sizeof(domain), strlen(label) + 1, nonce.size(), ctx.size()};
  Bytes out(MEP_SHA256_BYTES);
  mep_hmac_sha256(token, strlen(token), 4, parts, lens, out.data());
  return out;
}

TEST(BootstrapDerive, IsItsDefinition) {
  auto bs = Group("job token", 7);
  EXPECT_EQ(Derive(bs.get(), "a label", "some context"),
            Definition("job token", 7, "a label", "some context"));
  EXPECT_EQ(Derive(bs.get(), "a label", ""), Definition("job token", 7, "a label", ""));
  Bytes none(MEP_BOOTSTRAP_KEY_BYTES, 0);
  ASSERT_EQ(mep_bootstrap_derive(bs.get(), "a label", nullptr, 0, none.data()), MOE_EP_OK);
  EXPECT_EQ(none, Definition("job token", 7, "a label", ""));
}

TEST(BootstrapDerive, SameInputsSameKeyOtherInputsOtherKeys) {
  auto bs = Group("job token", 7);
  const Bytes base = Derive(bs.get(), "label", "ctx");
  EXPECT_EQ(Derive(bs.get(), "label", "ctx"), base);
  EXPECT_EQ(Derive(Group("job token", 7).get(), "label", "ctx"), base);
  const std::vector<std::pair<std::string, Bytes>> others = {
      {"another label", Derive(bs.get(), "label2", "ctx")},
      {"another ctx", Derive(bs.get(), "label", "ctx2")},
      {"ctx one byte longer", Derive(bs.get(), "label", std::string("ctx\0", 4))},
      {"label and ctx shifted", Derive(bs.get(), "labelc", "tx")},
      {"another group's nonce", Derive(Group("job token", 8).get(), "label", "ctx")},
      {"another token", Derive(Group("job tokem", 7).get(), "label", "ctx")},
  };
  for (size_t i = 0; i < others.size(); i++) {
    EXPECT_NE(others[i].second, base) << others[i].first;
    for (size_t j = 0; j < i; j++) {
      EXPECT_NE(others[i].second, others[j].second) << others[i].first << " / "
                                                    << others[j].first;
    }
  }
  // Not the bootstrap's own connection key, whatever the label.
  mep_bs_peer_t peer{};
  const std::string addr = "worker";
  mep_bs_peer_keys(bs.get(), &peer, 1, addr.data(), addr.size());
  int32_t rank = 1;
  std::string ctx(reinterpret_cast<const char *>(&rank), 4);
  ctx += addr;
  for (const char *label : {"moe-ep message key, rank to rank 0",
                            "moe-ep message key, rank 0 to rank"}) {
    const Bytes k = Derive(bs.get(), label, ctx);
    EXPECT_NE(k, Bytes(peer.key_in, peer.key_in + MEP_SHA256_BYTES)) << label;
    EXPECT_NE(k, Bytes(peer.key_out, peer.key_out + MEP_SHA256_BYTES)) << label;
  }
}

TEST(BootstrapDerive, RefusesMissingArgumentsWithoutWriting) {
  auto bs = Group("job token", 7);
  Bytes out(MEP_BOOTSTRAP_KEY_BYTES, 0xaa);
  EXPECT_EQ(mep_bootstrap_derive(nullptr, "l", "c", 1, out.data()), MOE_EP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(mep_bootstrap_derive(bs.get(), nullptr, "c", 1, out.data()),
            MOE_EP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(mep_bootstrap_derive(bs.get(), "l", nullptr, 1, out.data()),
            MOE_EP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(mep_last_error()).find("bootstrap_derive"), std::string::npos)
      << mep_last_error();
  EXPECT_EQ(mep_bootstrap_derive(bs.get(), "l", "c", 1, nullptr), MOE_EP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(out, Bytes(MEP_BOOTSTRAP_KEY_BYTES, 0xaa));
}

mep_bootstrap_params_t Params(int rank, int world, const std::string &address) {
  mep_bootstrap_params_t p = {};
  p.rank = rank;
  p.world_size = world;
  p.address = address.c_str();
  p.timeout_ms = 30000;
  p.token = "derive test token";
  return p;
}

// Two ranks of a real group (each on a thread of its own, the bootstrap
// being collective) derive the same key; another group with the same
// token, another.
TEST(BootstrapDerive, RanksOfOneGroupAgreeAndGroupsDiffer) {
  Bytes key[2][2];
  for (int g = 0; g < 2; g++) {
    const std::string address =
        "127.0.0.1:" + std::to_string(moe_ep_test::free_loopback_port());
    mep_bootstrap_t *bs[2] = {nullptr, nullptr};
    moe_ep_status_t st[2];
    std::string msg[2];
    std::thread root([&] {
      const mep_bootstrap_params_t p = Params(0, 2, address);
      st[0] = mep_bootstrap_create(&p, &bs[0]);
      if (st[0] != MOE_EP_OK) msg[0] = mep_last_error();
    });
    const mep_bootstrap_params_t p = Params(1, 2, address);
    st[1] = mep_bootstrap_create(&p, &bs[1]);
    if (st[1] != MOE_EP_OK) msg[1] = mep_last_error();
    root.join();
    for (int r = 0; r < 2; r++) {
      EXPECT_EQ(st[r], MOE_EP_OK) << "group " << g << " rank " << r << ": " << msg[r];
      if (st[r] == MOE_EP_OK) key[g][r] = Derive(bs[r], "moe-ep test key", "pair 0 1");
    }
    for (int r = 0; r < 2; r++) mep_bootstrap_destroy(bs[r]);
  }
  ASSERT_EQ(key[0][0].size(), MEP_BOOTSTRAP_KEY_BYTES);
  EXPECT_EQ(key[0][0], key[0][1]);
  EXPECT_EQ(key[1][0], key[1][1]);
  EXPECT_NE(key[0][0], key[1][0]);
}

// A group of one has no gate to learn a nonce from and may have no token:
// it draws its own nonce, so two such groups derive different keys.
TEST(BootstrapDerive, GroupsOfOneDrawTheirOwnNonce) {
  Bytes key[2];
  for (int g = 0; g < 2; g++) {
    const std::string address = "127.0.0.1:1";
    mep_bootstrap_params_t p = Params(0, 1, address);
    p.token = nullptr;
    mep_bootstrap_t *bs = nullptr;
    ASSERT_EQ(mep_bootstrap_create(&p, &bs), MOE_EP_OK) << mep_last_error();
    EXPECT_NE(Bytes(bs->group_nonce, bs->group_nonce + MEP_BS_NONCE_BYTES),
              Bytes(MEP_BS_NONCE_BYTES, 0));
    key[g] = Derive(bs, "moe-ep test key", "self");
    mep_bootstrap_destroy(bs);
  }
  EXPECT_NE(key[0], key[1]);
}

}  // namespace
