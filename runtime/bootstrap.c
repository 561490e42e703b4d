/* bootstrap.c: the bootstrap object's lifecycle: argument checks, the UCX
 * context and worker it owns, forming the group (rank 0 opens its gate, the
 * others knock and join), and a destroy that never hangs. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/bootstrap_types.h"
#include "runtime/error.h"
#include "runtime/log.h"

static moe_ep_status_t bs_check_params(const mep_bootstrap_params_t *p,
                                       mep_bootstrap_t **out) {
  if (p == NULL || out == NULL) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "bootstrap_create: params (%p) and out (%p) must be "
                     "non-NULL",
                     (const void *)p, (void *)out);
  }
  if (p->world_size < 1 || p->world_size > MEP_BS_MAX_RANKS) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "bootstrap_create: world_size %d is outside 1..%d",
                     p->world_size, MEP_BS_MAX_RANKS);
  }
  if (p->rank < 0 || p->rank >= p->world_size) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "bootstrap_create: rank %d is outside 0..%d (world_size "
                     "%d)",
                     p->rank, p->world_size - 1, p->world_size);
  }
  if (p->timeout_ms <= 0 || p->timeout_ms > MEP_BS_MAX_TIMEOUT_MS) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "bootstrap_create: timeout_ms %d is outside 1..%d",
                     p->timeout_ms, MEP_BS_MAX_TIMEOUT_MS);
  }
  if (p->world_size > 1 && (p->token == NULL || p->token[0] == '\0')) {
    /* Without a secret the gate could not tell a rank from an outsider. */
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "bootstrap_create: token is empty; a group of %d ranks "
                     "admits only processes that present the job token",
                     p->world_size);
  }
  if (p->world_size > 1 && strlen(p->token) < MEP_BS_TOKEN_MIN) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "bootstrap_create: token is %zu characters; a group of %d ranks needs at "
                     "least %d (every key derives from it, and a short one can be guessed "
                     "offline from one knock seen on the network)",
                     strlen(p->token), p->world_size, MEP_BS_TOKEN_MIN);
  }
  if (p->token != NULL && strlen(p->token) >= MEP_BS_TOKEN_MAX) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "bootstrap_create: token is %zu characters; at most %d",
                     strlen(p->token), MEP_BS_TOKEN_MAX - 1);
  }
  return MOE_EP_OK;
}

/* This worker's UCX address: what the knock carries (joiners) or the
 * verdict answers with (rank 0). */
static moe_ep_status_t bs_self_address(mep_bootstrap_t *bs) {
  ucs_status_t st =
      ucp_worker_get_address(bs->worker, &bs->self_addr, &bs->self_addr_len);
  if (st != UCS_OK) {
    bs->self_addr = NULL;
    return mep_error(MOE_EP_ERR_UCX, "rank %d: ucp_worker_get_address: %s",
                     bs->rank, ucs_status_string(st));
  }
  if (bs->self_addr_len > MEP_BS_ADDR_MAX) {
    return mep_error(MOE_EP_ERR_UCX,
                     "rank %d: its UCX worker address is %zu bytes; the "
                     "bootstrap carries at most %d (UCX_TLS or "
                     "UCX_NET_DEVICES can name fewer transports or devices)",
                     bs->rank, bs->self_addr_len, MEP_BS_ADDR_MAX);
  }
  return MOE_EP_OK;
}

/* A group of one forms without rank 0's gate, where larger groups get
 * their nonce: it draws its own and never sends it, so the keys
 * mep_bootstrap_derive gives it are secret although it may have no
 * token. */
static moe_ep_status_t bs_solo_nonce(mep_bootstrap_t *bs) {
  if (mep_bs_nonce(bs->group_nonce) == 0) return MOE_EP_OK;
  return mep_error(MOE_EP_ERR_BOOTSTRAP,
                   "rank 0: getrandom gave no bytes for the group's nonce: %s",
                   strerror(errno));
}

moe_ep_status_t mep_bootstrap_create(const mep_bootstrap_params_t *params,
                                     mep_bootstrap_t **out) {
  int64_t start = mep_bs_now_ms();
  moe_ep_status_t checked = bs_check_params(params, out);
  if (checked != MOE_EP_OK) {
    /* Only this rank's arguments are wrong (a token from its environment,
     * its own address string): say which rank. */
    if (params != NULL) mep_error_prefix("rank %d", params->rank);
    return checked;
  }
  mep_bootstrap_t *bs = (mep_bootstrap_t *)calloc(1, sizeof(*bs));
  if (bs == NULL) {
    return mep_error(MOE_EP_ERR_NO_MEMORY, "bootstrap_create: out of memory");
  }
  moe_ep_status_t st = MOE_EP_OK;
  bs->rank = params->rank;
  bs->world_size = params->world_size;
  bs->timeout_ms = params->timeout_ms;
  bs->fail_status = MOE_EP_OK;
  bs->gate_fd = -1;
  bs->hold_fd = -1;
  if (params->token != NULL) {
    snprintf(bs->token, sizeof(bs->token), "%s", params->token);
  }
  bs->by_rank = (mep_bs_peer_t **)calloc((size_t)bs->world_size,
                                         sizeof(*bs->by_rank));
  if (bs->by_rank == NULL) {
    st = mep_error(MOE_EP_ERR_NO_MEMORY, "bootstrap_create: out of memory");
    goto out_destroy;
  }
  if (bs->world_size > 1) {
    /* A single rank needs no address: nothing to listen for or dial. */
    st = mep_bs_addr_parse(params->address, &bs->saddr, &bs->saddr_len);
    if (st != MOE_EP_OK) { /* a name this rank's resolver does not know */
      mep_error_prefix("rank %d", bs->rank);
      goto out_destroy;
    }
    snprintf(bs->address, sizeof(bs->address), "%s", params->address);
  }
  bs->queue_cap = mep_bs_queue_cap(bs);
  MEP_CHECK_GOTO(mep_bs_worker_setup(bs), st, out_destroy);
  if (bs->world_size > 1) {
    MEP_CHECK_GOTO(bs_self_address(bs), st, out_destroy);
    if (bs->rank == 0) {
      st = mep_bs_root_form(bs, start + bs->timeout_ms);
    } else {
      st = mep_bs_join(bs, start);
    }
    if (st != MOE_EP_OK) goto out_destroy;
  } else {
    MEP_CHECK_GOTO(bs_solo_nonce(bs), st, out_destroy);
  }
  MEP_LOG_DEBUG("bootstrap", "rank %d of %d: group formed on %s in %lld ms",
                bs->rank, bs->world_size, bs->address,
                (long long)(mep_bs_now_ms() - start));
  *out = bs;
  return MOE_EP_OK;

out_destroy:
  /* destroy logs nothing and keeps the error text intact. */
  mep_bootstrap_destroy(bs);
  return st;
}

void mep_bootstrap_destroy(mep_bootstrap_t *bs) {
  if (bs == NULL) return;
  mep_bs_gate_close(bs, 0);
  if (bs->worker != NULL) {
    /* Flush to live peers, force where the peer is gone; bounded, since a
     * peer that stopped answering must not keep us here. A failed group
     * flushes too: a forced close resets the socket, and a survivor's
     * kernel may then drop the ABORT naming the culprit before its UCX
     * reads it, leaving it to blame this rank. */
    for (mep_bs_peer_t *p = bs->peers; p != NULL; p = p->next) {
      mep_bs_peer_close(bs, p, p->failed);
    }
    int64_t wait = bs->timeout_ms < 1000 ? bs->timeout_ms : 1000;
    mep_bs_close_wait(bs, mep_bs_now_ms() + wait);
    /* Drain the callbacks of the sends abandoned at deadlines. */
    int idle = 0;
    for (int i = 0; i < 4; i++) mep_bs_progress(bs, &idle);
  }
  if (bs->self_addr != NULL) ucp_worker_release_address(bs->worker, bs->self_addr);
  if (bs->worker != NULL) ucp_worker_destroy(bs->worker);
  if (bs->context != NULL) ucp_cleanup(bs->context);
  /* The messages queued but never taken. */
  while (bs->msgs != NULL) {
    mep_bs_msg_t *m = bs->msgs;
    bs->msgs = m->next;
    mep_bs_msg_free(m);
  }
  while (bs->peers != NULL) {
    mep_bs_peer_t *p = bs->peers;
    bs->peers = p->next;
    mep_bs_peer_free(p);
  }
  free(bs->by_rank);
  /* The job token admits to every group of the job: it does not outlive
   * this one in freed memory. */
  explicit_bzero(bs->token, sizeof(bs->token));
  explicit_bzero(bs->group_nonce, sizeof(bs->group_nonce)); /* a group of one's is secret */
  free(bs);
}

int mep_bootstrap_rank(const mep_bootstrap_t *bs) {
  return bs != NULL ? bs->rank : -1;
}

int mep_bootstrap_world_size(const mep_bootstrap_t *bs) {
  return bs != NULL ? bs->world_size : -1;
}

/* Apart from every label the bootstrap itself keys under the token (the
 * gate's proofs, the connections' keys), so no derived key is one of
 * those. */
#define DERIVE_DOMAIN "moe-ep derived key"

moe_ep_status_t mep_bootstrap_derive(const mep_bootstrap_t *bs, const char *label,
                                     const void *ctx, size_t ctx_len,
                                     uint8_t out[MEP_BOOTSTRAP_KEY_BYTES]) {
  if (bs == NULL || label == NULL || out == NULL || (ctx == NULL && ctx_len > 0)) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "bootstrap_derive: bs (%p), label (%p), out (%p) and a non-empty "
                     "ctx (%p, %zu bytes) must be non-NULL",
                     (const void *)bs, (const void *)label, (void *)out, ctx, ctx_len);
  }
  const void *parts[4] = {DERIVE_DOMAIN, label, bs->group_nonce, ctx};
  const size_t lens[4] = {sizeof(DERIVE_DOMAIN), strlen(label) + 1, sizeof(bs->group_nonce),
                          ctx_len};
  mep_hmac_sha256(bs->token, strlen(bs->token), 4, parts, lens, out);
  return MOE_EP_OK;
}
