/* host_mesh_seal.c: what lets a rank believe a host mesh message: the key
 * of each direction between two ranks, derived from the job token through
 * the bootstrap (never sent), the tag every header carries under it, and
 * the window of numbers a receiver has taken from each source. */
#define _GNU_SOURCE /* explicit_bzero */
#include <stddef.h>
#include <string.h>

#include "runtime/host/host_mesh_impl.h"

_Static_assert(sizeof(mep_host_msg_t) == MEP_HOST_MSG_TAGGED + MEP_HOST_TAG_BYTES,
               "mep_host_msg_t has padding the tag would not cover");
_Static_assert(MEP_HOST_TAG_BYTES <= MEP_SHA256_BYTES, "the tag is a truncated HMAC-SHA-256");
_Static_assert(MEP_HOST_SEQ_WINDOW == 64, "the window is one 64-bit word");

#define KEY_LABEL "moe-ep host data key"

/* What a direction's key is bound to: the pair, in order, and both
 * workers' addresses (by digest, so the context has a fixed size). */
typedef struct key_ctx {
  int32_t src, dst;
  uint8_t src_addr[MEP_SHA256_BYTES];
  uint8_t dst_addr[MEP_SHA256_BYTES];
} key_ctx_t;

void mep_host_key_init(mep_host_key_t *k, const uint8_t *key) {
  uint8_t pad[64] = {0};
  memcpy(pad, key, MEP_BOOTSTRAP_KEY_BYTES); /* 32 bytes: no pre-hash (RFC 2104) */
  for (int i = 0; i < 64; i++) pad[i] ^= 0x36;
  mep_sha256_init(&k->inner);
  mep_sha256_update(&k->inner, pad, sizeof(pad));
  for (int i = 0; i < 64; i++) pad[i] ^= 0x36 ^ 0x5c;
  mep_sha256_init(&k->outer);
  mep_sha256_update(&k->outer, pad, sizeof(pad));
  explicit_bzero(pad, sizeof(pad));
}

static void msg_tag(const mep_host_key_t *k, const mep_host_msg_t *h,
                    uint8_t out[MEP_SHA256_BYTES]) {
  mep_sha256_t s = k->inner;
  uint8_t inner[MEP_SHA256_BYTES];
  mep_sha256_update(&s, h, MEP_HOST_MSG_TAGGED);
  mep_sha256_final(&s, inner);
  s = k->outer;
  mep_sha256_update(&s, inner, sizeof(inner));
  mep_sha256_final(&s, out);
}

void mep_host_msg_seal(const mep_host_key_t *k, mep_host_msg_t *h) {
  uint8_t full[MEP_SHA256_BYTES];
  msg_tag(k, h, full);
  memcpy(h->tag, full, MEP_HOST_TAG_BYTES);
}

int mep_host_msg_sealed(const mep_host_key_t *k, const mep_host_msg_t *h) {
  uint8_t full[MEP_SHA256_BYTES];
  msg_tag(k, h, full);
  return mep_bytes_equal(h->tag, full, MEP_HOST_TAG_BYTES);
}

int mep_host_seq_fresh(mep_host_source_t *s, uint64_t seq) {
  if (seq == 0) return 0;
  if (seq > s->seq_top) {
    const uint64_t shift = seq - s->seq_top;
    s->seq_seen = shift >= MEP_HOST_SEQ_WINDOW ? 0 : s->seq_seen << shift;
    s->seq_seen |= 1;
    s->seq_top = seq;
    return 1;
  }
  const uint64_t back = s->seq_top - seq;
  if (back >= MEP_HOST_SEQ_WINDOW || (s->seq_seen >> back & 1) != 0) return 0;
  s->seq_seen |= (uint64_t)1 << back;
  return 1;
}

static moe_ep_status_t derive_one(const mep_bootstrap_t *bs, const key_ctx_t *ctx,
                                  mep_host_key_t *out) {
  uint8_t key[MEP_BOOTSTRAP_KEY_BYTES];
  moe_ep_status_t st = mep_bootstrap_derive(bs, KEY_LABEL, ctx, sizeof(*ctx), key);
  if (st == MOE_EP_OK) mep_host_key_init(out, key);
  explicit_bzero(key, sizeof(key));
  return st;
}

moe_ep_status_t mep_host_mesh_derive_keys(struct mep_host_mesh *m, const mep_bootstrap_t *bs,
                                          int peer, const void *peer_addr, size_t peer_len) {
  key_ctx_t ctx;
  memset(&ctx, 0, sizeof(ctx));
  uint8_t mine[MEP_SHA256_BYTES], theirs[MEP_SHA256_BYTES];
  mep_sha256(m->address, m->address_len, mine);
  mep_sha256(peer_addr, peer_len, theirs);
  ctx.src = m->rank;
  ctx.dst = peer;
  memcpy(ctx.src_addr, mine, sizeof(mine));
  memcpy(ctx.dst_addr, theirs, sizeof(theirs));
  moe_ep_status_t st = derive_one(bs, &ctx, &m->peers[peer].key_out);
  if (st != MOE_EP_OK) return st;
  ctx.src = peer;
  ctx.dst = m->rank;
  memcpy(ctx.src_addr, theirs, sizeof(theirs));
  memcpy(ctx.dst_addr, mine, sizeof(mine));
  return derive_one(bs, &ctx, &m->sources[peer].key_in);
}

void mep_host_mesh_forget_keys(struct mep_host_mesh *m) {
  for (int p = 0; m->peers != NULL && p < m->world; p++)
    explicit_bzero(&m->peers[p].key_out, sizeof(m->peers[p].key_out));
  for (int p = 0; m->sources != NULL && p < m->world; p++)
    explicit_bzero(&m->sources[p].key_in, sizeof(m->sources[p].key_in));
}
