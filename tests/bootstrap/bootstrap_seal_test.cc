// bootstrap_seal_test.cc: the MAC and number every bootstrap UCX message
// carries (mep_bs_peer_keys, mep_bs_seal, mep_bs_sealed, mep_bs_fresh),
// against their definitions computed here from the hash primitives:
//   key(direction) = HMAC-SHA-256(job token, label with its NUL, the
//       group's nonce, the joiner's rank as int32, the joiner's worker
//       address), the label "moe-ep message key, rank to rank 0" or
//       "moe-ep message key, rank 0 to rank";
//   digest = SHA-256 of the payload, a field of the header;
//   MAC = HMAC-SHA-256(key, "moe-ep message" with its NUL, the header
//       with its MAC field zeroed).
// Any changed byte of header or payload, another token, group, rank,
// address or direction is refused; a number already taken is refused; a
// payload is read only for a sealed header of a new number.
#include <stddef.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

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

using Bytes = std::vector<unsigned char>;

const Bytes kAddr = {'w', 'o', 'r', 'k', 'e', 'r', ' ', '1', 0, 7};

struct Side {
  std::unique_ptr<mep_bootstrap_t> bs{new mep_bootstrap_t()};
  mep_bs_peer_t peer{};
};

// One end of the connection between rank 0 and rank `joiner`: rank 0's
// when `root`, else the joiner's.
std::unique_ptr<Side> End(bool root, const char *token, unsigned char group, int joiner = 1,
                          const Bytes &addr = kAddr) {
  std::unique_ptr<Side> s(new Side());
  snprintf(s->bs->token, sizeof(s->bs->token), "%s", token);
  memset(s->bs->group_nonce, group, sizeof(s->bs->group_nonce));
  s->bs->rank = root ? 0 : joiner;
  s->bs->world_size = 4;
  mep_bs_peer_keys(s->bs.get(), &s->peer, joiner, addr.data(), addr.size());
  return s;
}

// A CONTRIB with `n` payload bytes: header, then payload, as the wire has it.
Bytes Message(const mep_bootstrap_t *bs, size_t n) {
  mep_bs_hdr_t h;
  mep_bs_hdr_init(bs, &h, MEP_BS_MSG_CONTRIB);
  h.seq = 3;
  h.op = MEP_BS_OP_ALLGATHER;
  h.bytes = n;
  h.payload_len = n;
  Bytes m(sizeof(h) + n);
  memcpy(m.data(), &h, sizeof(h));
  for (size_t i = 0; i < n; i++) m[sizeof(h) + i] = (unsigned char)(i * 7 + 1);
  return m;
}

void Seal(Side *from, Bytes *m) {
  mep_bs_hdr_t h;
  memcpy(&h, m->data(), sizeof(h));
  uint8_t digest[MEP_SHA256_BYTES];
  mep_sha256(m->data() + sizeof(h), m->size() - sizeof(h), digest);
  mep_bs_seal(&from->peer, &h, digest);
  memcpy(m->data(), &h, sizeof(h));
}

bool Sealed(const Side &to, const Bytes &m) {
  mep_bs_hdr_t h;
  memcpy(&h, m.data(), sizeof(h));
  return mep_bs_sealed(&to.peer, &h, m.data() + sizeof(h), m.size() - sizeof(h)) != 0;
}

Bytes Key(const char *token, const char *label, unsigned char group, int32_t rank,
          const Bytes &addr) {
  Bytes nonce(MEP_BS_NONCE_BYTES, group), key(MEP_SHA256_BYTES);
  const void *parts[4] = {label, nonce.data(), &rank, addr.data()};
  const size_t lens[4] = {strlen(label) + 1, nonce.size(), sizeof(rank), addr.size()};
  mep_hmac_sha256(token, strlen(token), 4, parts, lens, key.data());
  return key;
}

Bytes DigestOf(const Bytes &m) {
  return Bytes(m.begin() + offsetof(mep_bs_hdr_t, digest),
               m.begin() + offsetof(mep_bs_hdr_t, digest) + MEP_SHA256_BYTES);
}

Bytes PayloadDigest(const Bytes &m) {
  Bytes digest(MEP_SHA256_BYTES);
  mep_sha256_t sha;
  mep_sha256_init(&sha);
  mep_sha256_update(&sha, m.data() + sizeof(mep_bs_hdr_t), m.size() - sizeof(mep_bs_hdr_t));
  mep_sha256_final(&sha, digest.data());
  return digest;
}

Bytes Expected(const Bytes &key, const Bytes &m) {
  static const char kLabel[] = "moe-ep message";
  Bytes hdr(m.begin(), m.begin() + sizeof(mep_bs_hdr_t)), mac(MEP_SHA256_BYTES);
  memset(hdr.data() + offsetof(mep_bs_hdr_t, mac), 0, MEP_SHA256_BYTES);
  const void *parts[2] = {kLabel, hdr.data()};
  const size_t lens[2] = {sizeof(kLabel), hdr.size()};
  mep_hmac_sha256(key.data(), key.size(), 2, parts, lens, mac.data());
  return mac;
}

Bytes MacOf(const Bytes &m) {
  return Bytes(m.begin() + offsetof(mep_bs_hdr_t, mac),
               m.begin() + offsetof(mep_bs_hdr_t, mac) + MEP_SHA256_BYTES);
}

uint64_t CtrOf(const Bytes &m) {
  mep_bs_hdr_t h;
  memcpy(&h, m.data(), sizeof(h));
  return h.ctr;
}

TEST(BootstrapSeal, MacIsTheDefinitionsBothWays) {
  const Bytes up = Key("job-token-1", "moe-ep message key, rank to rank 0", 0x11, 1, kAddr);
  const Bytes down = Key("job-token-1", "moe-ep message key, rank 0 to rank", 0x11, 1, kAddr);
  for (size_t n : {size_t{0}, size_t{1}, size_t{200}}) {
    auto root = End(true, "job-token-1", 0x11), joiner = End(false, "job-token-1", 0x11);
    Bytes m = Message(joiner->bs.get(), n);
    Seal(joiner.get(), &m);
    EXPECT_EQ(CtrOf(m), 1u) << "the connection's first message is number 1";
    EXPECT_EQ(DigestOf(m), PayloadDigest(m)) << "payload " << n << " bytes";
    EXPECT_EQ(MacOf(m), Expected(up, m)) << "rank 1 to rank 0, payload " << n << " bytes";
    EXPECT_TRUE(Sealed(*root, m)) << "payload " << n << " bytes";
    Bytes r = Message(root->bs.get(), n);
    Seal(root.get(), &r);
    EXPECT_EQ(MacOf(r), Expected(down, r)) << "rank 0 to rank 1, payload " << n << " bytes";
    EXPECT_TRUE(Sealed(*joiner, r)) << "payload " << n << " bytes";
  }
}

TEST(BootstrapSeal, MessagesAreNumberedInOrder) {
  auto joiner = End(false, "job-token-1", 0x11);
  for (uint64_t want = 1; want <= 5; want++) {
    Bytes m = Message(joiner->bs.get(), 8);
    Seal(joiner.get(), &m);
    EXPECT_EQ(CtrOf(m), want);
  }
}

TEST(BootstrapSeal, EveryChangedByteIsRefused) {
  auto root = End(true, "job-token-1", 0x11), joiner = End(false, "job-token-1", 0x11);
  Bytes m = Message(joiner->bs.get(), 64);
  Seal(joiner.get(), &m);
  for (size_t i = 0; i < m.size(); i++) {
    Bytes bad = m;
    bad[i] ^= 0x01;
    if (i >= offsetof(mep_bs_hdr_t, payload_len) &&
        i < offsetof(mep_bs_hdr_t, payload_len) + sizeof(uint64_t)) {
      continue;  // the length is checked against what arrived before the MAC
    }
    EXPECT_FALSE(Sealed(*root, bad)) << "byte " << i << " of " << m.size() << " changed";
  }
}

TEST(BootstrapSeal, AnotherConnectionsKeysAreRefused) {
  auto joiner = End(false, "job-token-1", 0x11);
  Bytes m = Message(joiner->bs.get(), 16);
  Seal(joiner.get(), &m);
  const Bytes other_addr = {'w', 'o', 'r', 'k', 'e', 'r', ' ', '2', 0, 7};
  struct Case {
    const char *what;
    std::unique_ptr<Side> root;
  } cases[] = {
      {"the same connection", End(true, "job-token-1", 0x11)},
      {"another job token", End(true, "job-token-2", 0x11)},
      {"another group (rank 0's nonce)", End(true, "job-token-1", 0x12)},
      {"another rank's connection", End(true, "job-token-1", 0x11, 2)},
      {"another process as rank 1", End(true, "job-token-1", 0x11, 1, other_addr)},
  };
  EXPECT_TRUE(Sealed(*cases[0].root, m)) << cases[0].what;
  for (size_t i = 1; i < sizeof(cases) / sizeof(cases[0]); i++) {
    EXPECT_FALSE(Sealed(*cases[i].root, m)) << "a message of rank 1's connection was taken under "
                                            << cases[i].what << "'s key";
  }
}

TEST(BootstrapSeal, AMessageSentBackTheWayItCameIsRefused) {
  auto root = End(true, "job-token-1", 0x11), joiner = End(false, "job-token-1", 0x11);
  Bytes down = Message(root->bs.get(), 16);
  Seal(root.get(), &down);
  EXPECT_FALSE(Sealed(*root, down)) << "rank 0 took back its own message as rank 1's";
  Bytes up = Message(joiner->bs.get(), 16);
  Seal(joiner.get(), &up);
  EXPECT_FALSE(Sealed(*joiner, up)) << "rank 1 took back its own message as rank 0's";
}

TEST(BootstrapSeal, EachNumberIsTakenOnce) {
  mep_bs_peer_t p{};
  EXPECT_FALSE(mep_bs_fresh(&p, 0)) << "number 0 is never sent";
  for (uint64_t c = 1; c <= 3; c++) {
    EXPECT_TRUE(mep_bs_fresh(&p, c)) << "number " << c << " in order";
    EXPECT_FALSE(mep_bs_fresh(&p, c)) << "number " << c << " again";
  }
  // Out of order within the window: each once.
  EXPECT_TRUE(mep_bs_fresh(&p, 10));
  EXPECT_TRUE(mep_bs_fresh(&p, 7));
  EXPECT_FALSE(mep_bs_fresh(&p, 7));
  EXPECT_FALSE(mep_bs_fresh(&p, 3));
  EXPECT_TRUE(mep_bs_fresh(&p, 4));
  EXPECT_FALSE(mep_bs_fresh(&p, 10));
  // 64 or more below the highest: too old to tell, refused.
  EXPECT_TRUE(mep_bs_fresh(&p, 73));
  EXPECT_FALSE(mep_bs_fresh(&p, 9)) << "64 below the highest";
  EXPECT_TRUE(mep_bs_fresh(&p, 11)) << "62 below the highest, not taken yet";
  EXPECT_FALSE(mep_bs_fresh(&p, 73));
  // A jump past the window forgets what lies below it: every number of
  // the new window but the top is fresh once (no bit of the old window
  // survives the jump), and the window is 64 wide: 63 below the top is
  // taken, 64 below is not.
  EXPECT_TRUE(mep_bs_fresh(&p, 1000));
  EXPECT_FALSE(mep_bs_fresh(&p, 73));
  EXPECT_FALSE(mep_bs_fresh(&p, 936)) << "64 below the highest after the jump";
  for (uint64_t c = 937; c < 1000; c++) {
    EXPECT_TRUE(mep_bs_fresh(&p, c)) << "number " << c << " after the jump to 1000";
    EXPECT_FALSE(mep_bs_fresh(&p, c)) << "number " << c << " again";
  }
  EXPECT_FALSE(mep_bs_fresh(&p, 1000));
  // A step of one past a full window keeps the 63 below it taken.
  EXPECT_TRUE(mep_bs_fresh(&p, 1001));
  for (uint64_t c = 938; c <= 1000; c++) {
    EXPECT_FALSE(mep_bs_fresh(&p, c)) << "number " << c << " after the step to 1001";
  }
  EXPECT_FALSE(mep_bs_fresh(&p, 937)) << "64 below 1001";
}

// mep_bs_take, the check every received message passes before anything in
// it is believed: shape, then MAC, then number. A message a broken check
// would take shows here at once (in a running group a wrong message that
// happens to carry correct values would only show as a stall later).
mep_bs_taken_t Take(Side *to, const Bytes &m, int rndv = 0, size_t longest = 1 << 16,
                    size_t header_length = sizeof(mep_bs_hdr_t)) {
  mep_bs_hdr_t h;
  return mep_bs_take(&to->peer, m.data(), header_length, m.data() + sizeof(mep_bs_hdr_t),
                     m.size() - sizeof(mep_bs_hdr_t), rndv, longest, &h);
}

TEST(BootstrapSeal, TakeChecksShapeThenSealThenNumber) {
  auto root = End(true, "job-token-1", 0x11), joiner = End(false, "job-token-1", 0x11);
  Bytes m = Message(joiner->bs.get(), 40);
  Seal(joiner.get(), &m);
  // Not shaped like this message: none of these may use up its number.
  Bytes bad_magic = m;
  bad_magic[offsetof(mep_bs_hdr_t, magic)] ^= 1;
  Bytes short_payload(m.begin(), m.end() - 1);
  Bytes altered = m;
  altered.back() ^= 0x40;
  EXPECT_EQ(Take(root.get(), bad_magic), MEP_BS_UNSEALED);
  EXPECT_EQ(Take(root.get(), short_payload), MEP_BS_UNSEALED) << "payload_len must be the length";
  EXPECT_EQ(Take(root.get(), altered), MEP_BS_UNSEALED) << "a changed payload byte";
  EXPECT_EQ(Take(root.get(), m, /*rndv=*/1), MEP_BS_UNSEALED) << "a rendezvous message";
  EXPECT_EQ(Take(root.get(), m, 0, /*longest=*/39), MEP_BS_UNSEALED) << "longer than the bound";
  EXPECT_EQ(Take(root.get(), m, 0, 1 << 16, sizeof(mep_bs_hdr_t) - 1), MEP_BS_UNSEALED)
      << "a header of another size";
  // The real message is then taken once; a copy of it is a replay.
  EXPECT_EQ(Take(root.get(), m), MEP_BS_TAKEN);
  EXPECT_EQ(Take(root.get(), m), MEP_BS_REPLAYED);
  // A copy numbered ahead (as someone who saw it might resend it) is not
  // sealed: the number is under the MAC.
  Bytes ahead = m;
  mep_bs_hdr_t h;
  memcpy(&h, ahead.data(), sizeof(h));
  h.ctr += 1000;
  memcpy(ahead.data(), &h, sizeof(h));
  EXPECT_EQ(Take(root.get(), ahead), MEP_BS_UNSEALED);
  // The joiner's next message is still taken (nothing above used its number).
  Bytes next = Message(joiner->bs.get(), 0);
  Seal(joiner.get(), &next);
  EXPECT_EQ(Take(root.get(), next), MEP_BS_TAKEN);
}

// A payload no read may touch: `n` bytes ending at an inaccessible page.
class Unreadable {
 public:
  explicit Unreadable(size_t n) : page_((size_t)sysconf(_SC_PAGESIZE)), n_(n) {
    len_ = (n + page_ - 1) / page_ * page_;
    base_ = mmap(nullptr, len_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  }
  ~Unreadable() {
    if (ok()) munmap(base_, len_);
  }
  bool ok() const { return base_ != MAP_FAILED; }
  const void *data() const { return base_; }
  size_t size() const { return n_; }

 private:
  size_t page_, n_, len_;
  void *base_;
};

mep_bs_taken_t TakeWith(Side *to, const Bytes &header, const Unreadable &payload) {
  mep_bs_hdr_t h;
  return mep_bs_take(&to->peer, header.data(), sizeof(mep_bs_hdr_t), payload.data(),
                     payload.size(), 0, 1 << 20, &h);
}

// What an outsider sends (a header the key did not seal) and a replay of a
// real header are refused on the header alone: their payload, here in
// pages no read may touch, is never hashed (a read would crash the test).
// Only then is a real message's payload read.
TEST(BootstrapSeal, PayloadIsReadOnlyForASealedNewHeader) {
  auto root = End(true, "job-token-1", 0x11), joiner = End(false, "job-token-1", 0x11);
  Unreadable junk(256 << 10);
  ASSERT_TRUE(junk.ok());
  Bytes forged = Message(joiner->bs.get(), 0);
  mep_bs_hdr_t h;
  memcpy(&h, forged.data(), sizeof(h));
  h.payload_len = junk.size();
  h.ctr = 1;
  memcpy(forged.data(), &h, sizeof(h));
  EXPECT_EQ(TakeWith(root.get(), forged, junk), MEP_BS_UNSEALED) << "a header the key did not seal";
  auto outsider = End(false, "another-token", 0x11);
  Bytes other = Message(outsider->bs.get(), 0);
  memcpy(&h, other.data(), sizeof(h));
  h.payload_len = junk.size();
  memcpy(other.data(), &h, sizeof(h));
  Seal(outsider.get(), &other);
  EXPECT_EQ(TakeWith(root.get(), other, junk), MEP_BS_UNSEALED) << "sealed under another token";
  // A real message, then its header again with a payload of the same length
  // that cannot be read: a replay, refused before its payload.
  Bytes m = Message(joiner->bs.get(), 0);
  memcpy(&h, m.data(), sizeof(h));
  h.payload_len = junk.size();
  h.bytes = junk.size();
  memcpy(m.data(), &h, sizeof(h));
  m.resize(sizeof(h) + junk.size(), 0x5a);
  Seal(joiner.get(), &m);
  EXPECT_EQ(Take(root.get(), m, 0, 1 << 20), MEP_BS_TAKEN);
  EXPECT_EQ(TakeWith(root.get(), m, junk), MEP_BS_REPLAYED) << "a replayed header";
  // A sealed header of a new number whose payload differs from its digest
  // is refused without using up the number: the real one is still taken.
  Bytes next = Message(joiner->bs.get(), 24);
  Seal(joiner.get(), &next);
  Bytes changed = next;
  changed.back() ^= 1;
  EXPECT_EQ(Take(root.get(), changed), MEP_BS_UNSEALED) << "a payload that is not the digest's";
  EXPECT_EQ(Take(root.get(), next), MEP_BS_TAKEN);
}

}  // namespace
