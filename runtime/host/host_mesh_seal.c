/* host_mesh_seal.c: what lets a rank believe a host mesh message: the key
 * of each direction between two ranks, derived from the job token through
 * the bootstrap (never sent), the tag every header carries under it, and
 * the window of numbers a receiver has taken from each source. */
#define _GNU_SOURCE /* explicit_bzero */
#include <stddef.h>
#include <string.h>

#include "runtime/host/host_mesh_impl.h"
#include "runtime/replay_window.h"

_Static_assert(sizeof(mep_host_msg_t) == MEP_HOST_MSG_TAGGED + MEP_HOST_TAG_BYTES,
               "mep_host_msg_t has padding the tag would not cover");
_Static_assert(MEP_HOST_TAG_BYTES <= MEP_SHA256_BYTES, "the tag is a truncated HMAC-SHA-256");
_Static_assert(MEP_HOST_SEQ_WINDOW == MEP_REPLAY_WINDOW, "the window is replay_window.h's");

#define KEY_LABEL "moe-ep host data key"

/* What a direction's key is bound to: the pair, in order, and both
 * workers' addresses (by digest, so the context has a fixed size). */
typedef struct key_ctx {
  int32_t src, dst;
  uint8_t src_addr[MEP_SHA256_BYTES];
  uint8_t dst_addr[MEP_SHA256_BYTES];
} key_ctx_t;

void mep_host_key_init(mep_host_key_t *k, const uint8_t *key) {
  mep_hmac_key_init(k, key, MEP_BOOTSTRAP_KEY_BYTES);
}

static void msg_tag(const mep_host_key_t *k, const mep_host_msg_t *h,
                    uint8_t out[MEP_SHA256_BYTES]) {
  const void *parts[1] = {h};
  const size_t lens[1] = {MEP_HOST_MSG_TAGGED};
  mep_hmac_keyed(k, 1, parts, lens, out);
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
  return mep_replay_take(&s->seq_top, &s->seq_seen, seq);
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
