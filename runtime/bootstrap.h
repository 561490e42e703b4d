/* bootstrap.h: UCX out-of-band bootstrap: rank 0 listens on
 * bootstrap.address with a plain socket that checks each joiner's job token
 * before any UCX connection exists; the others knock with retry and then
 * connect over UCX by worker address; allgather / broadcast / barrier over
 * the resulting star.
 * Every wait is bounded by timeout_ms; a peer that dies turns into
 * MOE_EP_ERR_PEER_FAILED naming it on every surviving rank. */
#ifndef MEP_BOOTSTRAP_H_
#define MEP_BOOTSTRAP_H_

#include <stddef.h>
#include <stdint.h>

#include "moe_ep.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mep_bootstrap mep_bootstrap_t;

/* The shortest job token a group of more than one rank takes: every key
 * derives from it, and one knock seen on the network lets anyone try
 * tokens offline, so a short one would soon be found. */
#define MEP_BS_TOKEN_MIN 16

typedef struct mep_bootstrap_params {
  int rank;
  int world_size;
  const char *address; /* "host:port" rank 0 listens on / others dial */
  int timeout_ms;      /* bound on forming the group and on every collective */
  const char *token;   /* job token (MEP_BS_TOKEN_MIN characters or more);
                          "" or NULL = none, for a group of one only */
} mep_bootstrap_params_t;

/* Collective: returns once all world_size ranks have joined (token checked),
 * or MOE_EP_ERR_BOOTSTRAP naming who is missing after timeout_ms. */
moe_ep_status_t mep_bootstrap_create(const mep_bootstrap_params_t *params,
                                     mep_bootstrap_t **out);
/* Accepts NULL. Not collective (a peer may already be gone). */
void mep_bootstrap_destroy(mep_bootstrap_t *bs);

int mep_bootstrap_rank(const mep_bootstrap_t *bs);
int mep_bootstrap_world_size(const mep_bootstrap_t *bs);

/* recv holds world_size blocks of `bytes`, block r from rank r. bytes (and
 * a broadcast's bytes) are at most 64 KiB: the bootstrap carries small
 * out-of-band data, and rank 0 bounds what any connection can queue. */
moe_ep_status_t mep_bootstrap_allgather(mep_bootstrap_t *bs, const void *send,
                                        void *recv, size_t bytes);
moe_ep_status_t mep_bootstrap_broadcast(mep_bootstrap_t *bs, void *buf,
                                        size_t bytes, int root);
moe_ep_status_t mep_bootstrap_barrier(mep_bootstrap_t *bs);
/* Every rank's status (moe_ep_status_t) after a setup phase: statuses gets
 * world_size entries, rank r's at r. A rank whose setup failed may call it
 * where the others are still in one of the phase's collectives: the others'
 * collective then fails with MOE_EP_ERR_PEER_FAILED naming that rank and
 * its status (and that rank's call returns the same), not a mismatch. */
moe_ep_status_t mep_bootstrap_agree(mep_bootstrap_t *bs, int32_t mine,
                                    int32_t *statuses);
/* This rank cannot make its part of the next collective step (say, no
 * memory for its receive buffer): an agreement carrying `status` in its
 * place, which needs no allocation, so the peers fail at once naming this
 * rank and the status instead of waiting for it. Returns what the
 * agreement returned. */
moe_ep_status_t mep_bootstrap_fail_step(mep_bootstrap_t *bs, moe_ep_status_t status);

/* A key for this group only, for what else the group's ranks must
 * authenticate (the host mesh's messages): HMAC-SHA-256 under the job
 * token of "moe-ep derived key" with its NUL, `label` with its NUL, the
 * group's nonce and ctx[0, ctx_len). Every rank of the group gets the same
 * 32 bytes for the same label and ctx; another group (another nonce, or
 * another token) or another label or ctx gets unrelated ones, so a key
 * seen elsewhere is worth nothing here. The token itself never leaves the
 * bootstrap. A group of one, which has no token to speak of, draws its
 * nonce at random and never sends it, so its keys are secret too. Writes
 * out only on success; not collective, no communication. */
#define MEP_BOOTSTRAP_KEY_BYTES 32
moe_ep_status_t mep_bootstrap_derive(const mep_bootstrap_t *bs, const char *label,
                                     const void *ctx, size_t ctx_len,
                                     uint8_t out[MEP_BOOTSTRAP_KEY_BYTES]);


#ifdef __cplusplus
}
#endif

#endif /* MEP_BOOTSTRAP_H_ */
