// host_mesh_seal_test.cc: the keys, tags and numbers of the host mesh's
// messages (host_mesh_seal.c) against their definitions, computed here
// from the hash primitives:
//   key(src -> dst) = mep_bootstrap_derive("moe-ep host data key",
//       int32 src, int32 dst, SHA-256(src's worker address),
//       SHA-256(dst's worker address));
//   tag = the first 16 bytes of HMAC-SHA-256(key, the header before its
//       tag field).
// The two ends of a direction agree; the two directions, another pair or
// another group do not; any changed header byte is refused; a number is
// taken once, within 64 of the highest.
#include <stddef.h>
#include <string.h>

#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

extern "C" {
#include "runtime/bootstrap_types.h"
}
#include "runtime/hmac.h"
#include "runtime/host/host_mesh_impl.h"

namespace {

using Bytes = std::vector<uint8_t>;

const Bytes kAddr[3] = {{'w', 'o', 'r', 'k', 'e', 'r', ' ', '0', 0, 1},
                        {'w', 'o', 'r', 'k', 'e', 'r', ' ', '1', 0, 2, 3},
                        {'w', 'o', 'r', 'k', 'e', 'r', ' ', '2'}};

// What one rank holds: its bootstrap's token and group nonce, and a mesh
// with its worker address and every pair's keys derived.
struct Side {
  std::unique_ptr<mep_bootstrap_t> bs{new mep_bootstrap_t()};
  mep_host_mesh_t mesh{};
  std::vector<mep_host_peer_t> peers;
  std::vector<mep_host_source_t> sources;
  Bytes address;
};

std::unique_ptr<Side> RankSide(int rank, const char *token, uint8_t group) {
  std::unique_ptr<Side> s(new Side());
  snprintf(s->bs->token, sizeof(s->bs->token), "%s", token);
  memset(s->bs->group_nonce, group, sizeof(s->bs->group_nonce));
  s->bs->rank = rank;
  s->bs->world_size = 3;
  s->address = kAddr[rank];
  s->peers.resize(3);
  s->sources.resize(3);
  s->mesh.rank = rank;
  s->mesh.world = 3;
  s->mesh.address = s->address.data();
  s->mesh.address_len = s->address.size();
  s->mesh.peers = s->peers.data();
  s->mesh.sources = s->sources.data();
  for (int p = 0; p < 3; p++) {
    EXPECT_EQ(mep_host_mesh_derive_keys(&s->mesh, s->bs.get(), p, kAddr[p].data(),
                                        kAddr[p].size()),
              MOE_EP_OK);
  }
  return s;
}

Bytes Hmac(const void *key, size_t key_len, const std::vector<Bytes> &parts) {
  std::vector<const void *> ptrs;
  std::vector<size_t> lens;
  for (const Bytes &p : parts) {
    ptrs.push_back(p.data());
    lens.push_back(p.size());
  }
  Bytes out(MEP_SHA256_BYTES);
  mep_hmac_sha256(key, key_len, static_cast<int>(parts.size()), ptrs.data(), lens.data(),
                  out.data());
  return out;
}

Bytes Str0(const char *s) { return Bytes(s, s + strlen(s) + 1); }

Bytes Sha(const Bytes &b) {
  Bytes out(MEP_SHA256_BYTES);
  mep_sha256(b.data(), b.size(), out.data());
  return out;
}

// The key of src -> dst by its definition.
Bytes KeyDef(const char *token, uint8_t group, int32_t src, int32_t dst) {
  Bytes ctx(8);
  memcpy(ctx.data(), &src, 4);
  memcpy(ctx.data() + 4, &dst, 4);
  for (const Bytes &d : {Sha(kAddr[src]), Sha(kAddr[dst])}) ctx.insert(ctx.end(), d.begin(), d.end());
  return Hmac(token, strlen(token),
              {Str0("moe-ep derived key"), Str0("moe-ep host data key"),
               Bytes(MEP_BS_NONCE_BYTES, group), ctx});
}

mep_host_msg_t Header(int src, int dst) {
  mep_host_msg_t h;
  memset(&h, 0, sizeof(h));
  h.seq = 7;
  h.offset = 4096;
  h.value = 0;
  h.bytes = 512;
  h.src = src;
  h.dst = dst;
  h.kind = MEP_HOST_MSG_PUT;
  return h;
}

// The tag of h under a raw key, by definition.
Bytes TagDef(const Bytes &key, const mep_host_msg_t &h) {
  Bytes hdr(reinterpret_cast<const uint8_t *>(&h),
            reinterpret_cast<const uint8_t *>(&h) + offsetof(mep_host_msg_t, tag));
  Bytes full = Hmac(key.data(), key.size(), {hdr});
  return Bytes(full.begin(), full.begin() + MEP_HOST_TAG_BYTES);
}

TEST(HostMeshSeal, HeaderLayoutHasNoPadding) {
  EXPECT_EQ(offsetof(mep_host_msg_t, tag), 48u);
  EXPECT_EQ(sizeof(mep_host_msg_t), 64u);
}

TEST(HostMeshSeal, TagIsTruncatedHmacOfTheHeader) {
  Bytes key(MEP_BOOTSTRAP_KEY_BYTES);
  for (size_t i = 0; i < key.size(); i++) key[i] = static_cast<uint8_t>(3 * i + 1);
  mep_host_key_t k;
  mep_host_key_init(&k, key.data());
  mep_host_msg_t h = Header(1, 0);
  mep_host_msg_seal(&k, &h);
  EXPECT_EQ(Bytes(h.tag, h.tag + MEP_HOST_TAG_BYTES), TagDef(key, h));
  EXPECT_EQ(mep_host_msg_sealed(&k, &h), 1);
  // Every byte the tag covers matters.
  for (size_t i = 0; i < offsetof(mep_host_msg_t, tag); i++) {
    mep_host_msg_t c = h;
    reinterpret_cast<uint8_t *>(&c)[i] ^= 0x01;
    EXPECT_EQ(mep_host_msg_sealed(&k, &c), 0) << "header byte " << i;
  }
  for (size_t i = 0; i < MEP_HOST_TAG_BYTES; i++) {
    mep_host_msg_t c = h;
    c.tag[i] ^= 0x80;
    EXPECT_EQ(mep_host_msg_sealed(&k, &c), 0) << "tag byte " << i;
  }
}

TEST(HostMeshSeal, KeysFollowTheirDefinitionAndBothEndsAgree) {
  std::unique_ptr<Side> side[3] = {RankSide(0, "tok", 5), RankSide(1, "tok", 5),
                                   RankSide(2, "tok", 5)};
  for (int a = 0; a < 3; a++) {
    for (int b = 0; b < 3; b++) {
      // a's key for messages to b seals what b checks from a, and is the
      // definition's key.
      mep_host_msg_t h = Header(a, b);
      mep_host_msg_seal(&side[a]->peers[b].key_out, &h);
      EXPECT_EQ(mep_host_msg_sealed(&side[b]->sources[a].key_in, &h), 1) << a << " -> " << b;
      EXPECT_EQ(Bytes(h.tag, h.tag + MEP_HOST_TAG_BYTES), TagDef(KeyDef("tok", 5, a, b), h))
          << a << " -> " << b;
      // Under any other pair's key it does not pass.
      for (int c = 0; c < 3; c++) {
        for (int d = 0; d < 3; d++) {
          if (c == a && d == b) continue;
          EXPECT_EQ(mep_host_msg_sealed(&side[d]->sources[c].key_in, &h), 0)
              << a << " -> " << b << " checked as " << c << " -> " << d;
        }
      }
    }
  }
}

TEST(HostMeshSeal, AnotherGroupOrTokenHasOtherKeys) {
  std::unique_ptr<Side> mine = RankSide(1, "tok", 5);
  std::unique_ptr<Side> other_group = RankSide(0, "tok", 6);
  std::unique_ptr<Side> other_token = RankSide(0, "tok2", 5);
  std::unique_ptr<Side> same = RankSide(0, "tok", 5);
  mep_host_msg_t h = Header(1, 0);
  mep_host_msg_seal(&mine->peers[0].key_out, &h);
  EXPECT_EQ(mep_host_msg_sealed(&same->sources[1].key_in, &h), 1);
  EXPECT_EQ(mep_host_msg_sealed(&other_group->sources[1].key_in, &h), 0);
  EXPECT_EQ(mep_host_msg_sealed(&other_token->sources[1].key_in, &h), 0);
  // Another worker address for rank 1 (another process in its place).
  std::unique_ptr<Side> moved = RankSide(0, "tok", 5);
  const Bytes elsewhere = {'e', 'l', 's', 'e'};
  ASSERT_EQ(mep_host_mesh_derive_keys(&moved->mesh, moved->bs.get(), 1, elsewhere.data(),
                                      elsewhere.size()),
            MOE_EP_OK);
  EXPECT_EQ(mep_host_msg_sealed(&moved->sources[1].key_in, &h), 0);
}

TEST(HostMeshSeal, NumbersAreTakenOnceWithinTheWindow) {
  mep_host_source_t s{};
  EXPECT_EQ(mep_host_seq_fresh(&s, 0), 0);
  EXPECT_EQ(mep_host_seq_fresh(&s, 1), 1);
  EXPECT_EQ(mep_host_seq_fresh(&s, 1), 0);
  EXPECT_EQ(mep_host_seq_fresh(&s, 3), 1);
  EXPECT_EQ(mep_host_seq_fresh(&s, 2), 1);  // a little out of order: taken
  EXPECT_EQ(mep_host_seq_fresh(&s, 2), 0);
  EXPECT_EQ(mep_host_seq_fresh(&s, 100), 1);
  EXPECT_EQ(mep_host_seq_fresh(&s, 36), 0);  // 64 below the highest: too old to tell
  EXPECT_EQ(mep_host_seq_fresh(&s, 37), 1);
  EXPECT_EQ(mep_host_seq_fresh(&s, 37), 0);
  EXPECT_EQ(mep_host_seq_fresh(&s, 3), 0);
  EXPECT_EQ(mep_host_seq_fresh(&s, 100), 0);
  EXPECT_EQ(mep_host_seq_fresh(&s, 1000), 1);  // a jump clears the window
  EXPECT_EQ(mep_host_seq_fresh(&s, 999), 1);
  EXPECT_EQ(mep_host_seq_fresh(&s, 1000), 0);
}

}  // namespace
