/* prepare.c: prepare and handle_free: topk_idx validation common to every
 * backend, the handle object, and the backend's layout step. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/error.h"
#include "runtime/group.h"
#include "runtime/registry.h"
#include "runtime/validate.h"


/* ---- prepare ------------------------------------------------------------ */

static moe_ep_status_t copy_topk(moe_ep_group_t *g, mep_handle_state_t *h,
                                 const void *data, int dt) {
  size_t n = (size_t)h->num_tokens * (size_t)h->top_k;
  h->topk_host = malloc((n ? n : 1) * sizeof(int64_t));
  if (h->topk_host == NULL) {
    return mep_error(MOE_EP_ERR_NO_MEMORY, "prepare: cannot copy topk_idx");
  }
  for (size_t i = 0; i < n; i++) {
    int64_t e = dt == MEP_DT_I64 ? ((const int64_t *)data)[i]
                                 : ((const int32_t *)data)[i];
    if (e < -1 || e >= g->cfg.num_experts) {
      return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                       "prepare: params->topk_idx[%zu][%zu]=%lld is not an "
                       "expert id: it must be in [0, num_experts=%d) or -1",
                       i / (size_t)h->top_k, i % (size_t)h->top_k,
                       (long long)e, g->cfg.num_experts);
    }
    h->topk_host[i] = e;
    /* A token names each expert at most once: a repeat would need two
     * slots for one (token, expert) pair and overrun that expert's rows. */
    size_t k = i % (size_t)h->top_k;
    for (size_t j = i - k; e >= 0 && j < i; j++) {
      if (h->topk_host[j] == e) {
        return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                         "prepare: params->topk_idx[%zu] names expert %lld twice (slots "
                         "%zu and %zu); each token's experts must be distinct",
                         i / (size_t)h->top_k, (long long)e, j - (i - k), k);
      }
    }
  }
  return MOE_EP_OK;
}

/* The optional layout outputs (num_tokens_per_rank / _per_expert,
 * is_token_in_rank); NULL skips one. */
static moe_ep_status_t check_layout_outputs(moe_ep_group_t *g,
                                            const moe_ep_prepare_params_t *p,
                                            mep_handle_state_t *h) {
  int dev = mep_group_device(g);
  void *data;
  int dt;
  if (MEP_HAS_FIELD(p, num_tokens_per_rank) && p->num_tokens_per_rank != NULL) {
    mep_tensor_rule_t r = {"prepare", "params->num_tokens_per_rank", dev,
                           MEP_BIT(MEP_DT_I32), 1, {g->world_size, 0, 0}, 0};
    MEP_CHECK(mep_tensor_check(p->num_tokens_per_rank, &r, &data, &dt));
    h->out_tokens_per_rank = data;
  }
  if (MEP_HAS_FIELD(p, num_tokens_per_expert) && p->num_tokens_per_expert != NULL) {
    mep_tensor_rule_t r = {"prepare", "params->num_tokens_per_expert", dev,
                           MEP_BIT(MEP_DT_I32), 1, {g->cfg.num_experts, 0, 0}, 0};
    MEP_CHECK(mep_tensor_check(p->num_tokens_per_expert, &r, &data, &dt));
    h->out_tokens_per_expert = data;
  }
  if (MEP_HAS_FIELD(p, is_token_in_rank) && p->is_token_in_rank != NULL) {
    mep_tensor_rule_t r = {"prepare", "params->is_token_in_rank", dev,
                           MEP_BIT(MEP_DT_U8), 2, {p->num_tokens, g->world_size, 0}, 1};
    MEP_CHECK(mep_tensor_check(p->is_token_in_rank, &r, &data, &dt));
    h->out_is_token_in_rank = data;
  }
  return MOE_EP_OK;
}

static void handle_release(mep_handle_state_t *h) {
  free(h->topk_host);
  free(h->backend);
  mep_registry_retire(h); /* its address stays unused a while (registry.h) */
}

static void handle_release_obj(void *h) { handle_release(h); }

/* *reached: the backend's prepare ran (it joined any exchange the
 * backend's prepare makes). */
static moe_ep_status_t prepare_checked(moe_ep_group_t *g, const moe_ep_prepare_params_t *p,
                                       moe_ep_handle_t **out, int *reached) {
  MEP_CHECK(mep_group_broken_error(g, "prepare"));
  if (p == NULL || out == NULL) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT, "prepare: %s is NULL",
                     p ? "handle" : "params");
  }
  if (!MEP_HAS_FIELD(p, stream)) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "prepare: params->struct_size=%zu is below the v1 minimum",
                     p->struct_size);
  }
  if (p->num_tokens < 0 || p->num_tokens > g->cfg.max_tokens_per_rank) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "prepare: params->num_tokens=%d must be in [0, "
                     "max_tokens_per_rank=%d]",
                     p->num_tokens, g->cfg.max_tokens_per_rank);
  }
  if (p->top_k < 1 || p->top_k > g->cfg.top_k) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "prepare: params->top_k=%d must be in [1, config top_k=%d]",
                     p->top_k, g->cfg.top_k);
  }
  mep_tensor_rule_t rule = {"prepare", "params->topk_idx", mep_group_device(g),
                            MEP_BIT(MEP_DT_I32) | MEP_BIT(MEP_DT_I64), 2,
                            {p->num_tokens, p->top_k, 0}, 1};
  void *data;
  int dt;
  MEP_CHECK(mep_tensor_check(p->topk_idx, &rule, &data, &dt));
  mep_handle_state_t *h = calloc(1, sizeof(*h));
  if (h == NULL) return mep_error(MOE_EP_ERR_NO_MEMORY, "prepare: out of memory");
  h->num_tokens = p->num_tokens;
  h->top_k = p->top_k;
  h->topk_idx = data;
  h->topk_idx_bits = dt == MEP_DT_I64 ? 64 : 32;
  h->prepare_stream = p->stream;
  moe_ep_status_t st = MOE_EP_OK;
  MEP_CHECK_GOTO(check_layout_outputs(g, p, h), st, out_release);
  if (g->cfg.backend == MOE_EP_BACKEND_HOST) {
    MEP_CHECK_GOTO(copy_topk(g, h, data, dt), st, out_release);
  }
  *reached = 1;
  st = g->ops->prepare(g, h);
  h->out_tokens_per_rank = NULL;
  h->out_tokens_per_expert = NULL;
  h->out_is_token_in_rank = NULL;
  h->prepare_stream = NULL;
  if (st != MOE_EP_OK) goto out_release;
  if (!mep_registry_add(h, MEP_OBJ_HANDLE, g, g->rank)) {
    st = mep_error(MOE_EP_ERR_NO_MEMORY, "prepare: out of memory");
    goto out_release;
  }
  *out = h;
  return MOE_EP_OK;

out_release:
  handle_release(h);
  return st;
}

static moe_ep_status_t prepare_locked(moe_ep_group_t *g, const moe_ep_prepare_params_t *p,
                                      moe_ep_handle_t **out) {
  int reached = 0;
  moe_ep_status_t st = prepare_checked(g, p, out, &reached);
  /* Bad arguments on one rank only: a collective prepare (host HT) still
   * hears of it, so the other ranks' prepares fail too instead of waiting
   * for this one until the group times out. This rank keeps its own error. */
  if (st != MOE_EP_OK && !reached && g->broken == MOE_EP_OK && g->ops->prepare_refused != NULL) {
    char why[MEP_ERROR_MAX];
    snprintf(why, sizeof why, "%s", mep_last_error());
    moe_ep_status_t joined = g->ops->prepare_refused(g);
    if (mep_status_is_fatal(joined)) {
      /* The failed exchange fails the group; the argument this rank
       * refused is still said, after it. */
      return mep_error_suffix(joined, "this rank had refused its prepare: %s", why);
    }
    st = mep_error(st, "%s", why);
  }
  return st;
}

moe_ep_status_t mep_prepare(moe_ep_group_t *g,
                            const moe_ep_prepare_params_t *p,
                            moe_ep_handle_t **out) {
  MEP_LOCKED_ENTRY(g, "prepare", prepare_locked(g, p, out));
}

/* Under the group's lock: a hook not run yet on this handle (every such
 * hook is pending on its buffer set) forgets it, so its hook_run reports
 * the handle freed even when a later prepare gets the same address. */
static void handle_detach_hooks(moe_ep_group_t *g, void *obj) {
  for (int i = 0; i < MEP_NUM_BUFFER_SETS; i++) {
    moe_ep_hook_t *hook = g->pending[i];
    if (hook != NULL && hook->op.handle == obj) hook->op.handle = NULL;
  }
}

/* Under the group's lock, so a hook_run or combine on another thread
 * either finishes with the handle first or finds it gone. */
void mep_handle_free(moe_ep_handle_t *h) {
  mep_group_free(h, MEP_OBJ_HANDLE, h != NULL ? &h->deferred : NULL, "handle_free",
                 handle_detach_hooks, handle_release_obj);
}
