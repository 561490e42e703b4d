/* ops.c: dispatch / combine / hooks: argument validation common to every
 * backend, buffer-set alternation and pending-hook bookkeeping. A backend
 * only sees requests that passed these checks. */
#include <stdlib.h>
#include <string.h>

#include "runtime/config.h"
#include "runtime/error.h"
#include "runtime/group.h"
#include "runtime/registry.h"
#include "runtime/validate.h"

#define KNOWN_FLAGS (MOE_EP_FLAG_DEFER_RECV | MOE_EP_FLAG_ROUND_SCALE)

static int is_ll(const moe_ep_group_t *g) {
  return g->cfg.mode == MOE_EP_MODE_LOW_LATENCY;
}

static moe_ep_status_t check_flags_hidden(moe_ep_group_t *g, const char *entry,
                                          uint32_t flags, int32_t hidden,
                                          moe_ep_hook_t **hook, int fp8) {
  if (flags & ~KNOWN_FLAGS) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "%s: params->flags=0x%x has unknown bits 0x%x", entry,
                     flags, flags & ~KNOWN_FLAGS);
  }
  if ((flags & MOE_EP_FLAG_DEFER_RECV) && hook == NULL) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "%s: MOE_EP_FLAG_DEFER_RECV needs a non-NULL hook output",
                     entry);
  }
  int align = fp8 ? MEP_HIDDEN_ALIGN : MEP_BF16_HIDDEN_ALIGN;
  if (hidden < align || hidden > g->cfg.hidden || hidden % align != 0) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "%s: params->hidden=%d must be a multiple of %d%s in [%d, "
                     "config hidden=%d]",
                     entry, hidden, align, fp8 ? " (fp8 scales cover 128 channels)" : "",
                     align, g->cfg.hidden);
  }
  return MOE_EP_OK;
}

static moe_ep_status_t reserve_buffer_set(moe_ep_group_t *g, const char *entry,
                                          int32_t *set) {
  int nsets = g->cfg.double_buffer ? MEP_NUM_BUFFER_SETS : 1;
  *set = (int32_t)(g->seq % (uint64_t)nsets);
  if (g->pending[*set] != NULL) {
    return mep_error(MOE_EP_ERR_BUSY,
                     "%s: the next operation uses buffer set %d, which still holds a "
                     "pending %s whose hook has not run (buffer sets alternate, %d "
                     "in all with double_buffer=%s): run that hook first",
                     entry, *set,
                     g->pending[*set]->op.kind == MEP_OP_DISPATCH ? "dispatch" : "combine",
                     nsets, g->cfg.double_buffer ? "true" : "false");
  }
  return MOE_EP_OK;
}

/* Sends, then either receives now or parks the op in a hook. Called with
 * validated arguments, under the group lock. */
static moe_ep_status_t launch(moe_ep_group_t *g, mep_op_t *op,
                              moe_ep_hook_t **hook_out) {
  moe_ep_status_t st;
  moe_ep_hook_t *hook = NULL;
  if (hook_out != NULL) *hook_out = NULL;
  if (op->flags & MOE_EP_FLAG_DEFER_RECV) {
    hook = calloc(1, sizeof(*hook));
    if (hook == NULL || !mep_registry_add(hook, MEP_OBJ_HOOK, g)) {
      free(hook);
      return mep_error(MOE_EP_ERR_NO_MEMORY, "cannot allocate a hook");
    }
  }
  const char *entry = op->kind == MEP_OP_DISPATCH ? "dispatch" : "combine";
  st = reserve_buffer_set(g, entry, &op->buffer_set);
  if (st != MOE_EP_OK) goto out_unlock;
  op->seq = g->seq;
  if (hook == NULL && g->ops->send_recv != NULL) {
    st = g->ops->send_recv(g, op);
    if (st == MOE_EP_OK) g->seq++;
    goto out_unlock;
  }
  st = g->ops->send(g, op);
  if (st != MOE_EP_OK) goto out_unlock;
  g->seq++;
  if (hook != NULL) {
    hook->group = g;
    hook->op = *op;
    g->pending[op->buffer_set] = hook;
    *hook_out = hook;
    hook = NULL;
  } else {
    st = g->ops->recv(g, op);
  }
out_unlock:
  if (hook != NULL) {
    (void)mep_registry_take(hook, MEP_OBJ_HOOK);
    free(hook);
  }
  return st;
}

/* topk_weights of a dispatch or combine (`what`): f32 [num_tokens, top_k]
 * on the group's device. */
static moe_ep_status_t check_weights(moe_ep_group_t *g, const mep_handle_state_t *h,
                                     const char *what, const moe_ep_tensor_t *t, void **data) {
  int dt;
  mep_tensor_rule_t r = {what, "params->topk_weights", mep_group_device(g), MEP_BIT(MEP_DT_F32),
                         2, {h->num_tokens, h->top_k, 0}, 1};
  return mep_tensor_check(t, &r, data, &dt);
}

static moe_ep_status_t check_ll_dispatch_outputs(moe_ep_group_t *g,
                                                 const moe_ep_dispatch_params_t *p,
                                                 mep_op_t *op, int fp8) {
  int dev = mep_group_device(g);
  int64_t el = g->num_local_experts;
  int64_t slots = (int64_t)g->world_size * g->cfg.max_tokens_per_rank;
  void *data;
  int dt;
  /* Optional in LL: weights given here travel with the tokens, so combine
   * can sum each token's experts on the expert side (fewer bytes back). */
  if (MEP_HAS_FIELD(p, topk_weights) && p->topk_weights != NULL) {
    MEP_CHECK(check_weights(g, op->handle, "dispatch", p->topk_weights, &data));
    op->topk_weights = data;
    op->weighted = 1;
  }
  mep_tensor_rule_t rx = {"dispatch", "params->recv_x", dev,
                          fp8 ? MEP_BIT(MEP_DT_FP8) : MEP_BIT(MEP_DT_BF16), 3,
                          {el, slots, p->hidden}, 0};
  MEP_CHECK(mep_tensor_check(p->recv_x, &rx, &op->recv_x, &dt));
  mep_tensor_rule_t rc = {"dispatch", "params->recv_count", dev, MEP_BIT(MEP_DT_I32),
                          1, {el, 0, 0}, 0};
  MEP_CHECK(mep_tensor_check(p->recv_count, &rc, &data, &dt));
  op->recv_count = data;
  if (fp8) {
    int packed = op->scale_format == MOE_EP_FP8_SCALE_UE8M0_PACKED;
    mep_tensor_rule_t rs = {"dispatch", "params->recv_scales", dev,
                            packed ? MEP_BIT(MEP_DT_I32) : MEP_BIT(MEP_DT_F32), 3,
                            {el, slots, mep_scale_cols(p->hidden, packed)}, 0};
    MEP_CHECK(mep_tensor_check(p->recv_scales, &rs, &op->recv_scales, &dt));
  }
  return MOE_EP_OK;
}

static moe_ep_status_t check_ht_dispatch_outputs(moe_ep_group_t *g,
                                                 const moe_ep_dispatch_params_t *p,
                                                 mep_op_t *op) {
  int dev = mep_group_device(g);
  mep_handle_state_t *h = op->handle;
  void *data;
  int dt;
  MEP_CHECK(check_weights(g, h, "dispatch", p->topk_weights, &data));
  op->topk_weights = data;
  mep_tensor_rule_t rx = {"dispatch", "params->recv_x", dev, MEP_BIT(MEP_DT_BF16), 2,
                          {-1, p->hidden, 0}, 1};
  MEP_CHECK(mep_tensor_check(p->recv_x, &rx, &op->recv_x, &dt));
  op->recv_capacity = p->recv_x->shape[0];
  if (op->recv_capacity < h->num_recv) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "dispatch: params->recv_x has %lld rows but this rank "
                     "receives %lld tokens (see prepare's layout)",
                     (long long)op->recv_capacity, (long long)h->num_recv);
  }
  int64_t cap = op->recv_capacity;
  mep_tensor_rule_t ri = {"dispatch", "params->recv_topk_idx", dev, MEP_BIT(MEP_DT_I32),
                          2, {cap, h->top_k, 0}, 1};
  MEP_CHECK(mep_tensor_check(p->recv_topk_idx, &ri, &data, &dt));
  op->recv_topk_idx = data;
  mep_tensor_rule_t rtw = {"dispatch", "params->recv_topk_weights", dev,
                           MEP_BIT(MEP_DT_F32), 2, {cap, h->top_k, 0}, 1};
  MEP_CHECK(mep_tensor_check(p->recv_topk_weights, &rtw, &data, &dt));
  op->recv_topk_weights = data;
  mep_tensor_rule_t rc = {"dispatch", "params->recv_count", dev, MEP_BIT(MEP_DT_I32),
                          1, {g->num_local_experts, 0, 0}, 0};
  MEP_CHECK(mep_tensor_check(p->recv_count, &rc, &data, &dt));
  op->recv_count = data;
  if (p->num_recv_tokens == NULL) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "dispatch: params->num_recv_tokens is NULL; high-throughput "
                     "dispatch reports the received row count there");
  }
  op->num_recv_tokens = p->num_recv_tokens;
  return MOE_EP_OK;
}

/* This call's row format (params->format, or the group's): fp8 or bf16 rows
 * and the scale format. A bf16 call needs a group whose buffers hold bf16
 * rows (dispatch_dtype: bf16); fp8 rows fit either. */
static moe_ep_status_t resolve_format(const moe_ep_group_t *g, const moe_ep_dispatch_params_t *p,
                                      int *fp8, int *scale_format) {
  int32_t f = MEP_HAS_FIELD(p, format) ? p->format : MOE_EP_FORMAT_GROUP;
  *fp8 = mep_config_fp8_dispatch(&g->cfg);
  *scale_format = g->cfg.fp8_scale;
  switch (f) {
    case MOE_EP_FORMAT_GROUP: return MOE_EP_OK;
    case MOE_EP_FORMAT_BF16: *fp8 = 0; break;
    case MOE_EP_FORMAT_FP8_F32: *fp8 = 1; *scale_format = MOE_EP_FP8_SCALE_F32; break;
    case MOE_EP_FORMAT_FP8_UE8M0: *fp8 = 1; *scale_format = MOE_EP_FP8_SCALE_UE8M0; break;
    case MOE_EP_FORMAT_FP8_UE8M0_PACKED:
      *fp8 = 1;
      *scale_format = MOE_EP_FP8_SCALE_UE8M0_PACKED;
      break;
    default:
      return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                       "dispatch: params->format=%d is not a moe_ep_dispatch_format_t value "
                       "(0..%d)",
                       f, MOE_EP_FORMAT_FP8_UE8M0_PACKED);
  }
  if (!is_ll(g) && *fp8) {
    return mep_error(MOE_EP_ERR_UNSUPPORTED,
                     "dispatch: params->format=%d asks for fp8 rows, but high-throughput "
                     "dispatch sends bf16 rows (format 0 or %d)",
                     f, MOE_EP_FORMAT_BF16);
  }
  if (!*fp8 && mep_config_fp8_dispatch(&g->cfg)) {
    return mep_error(MOE_EP_ERR_UNSUPPORTED,
                     "dispatch: params->format=%d asks for bf16 rows, but this group's "
                     "buffers hold fp8 rows (dispatch_dtype: fp8_e4m3); configure "
                     "dispatch_dtype: bf16 to choose the format per call",
                     f);
  }
  return MOE_EP_OK;
}

static moe_ep_status_t dispatch_locked(moe_ep_group_t *g, moe_ep_handle_t *h,
                                       const moe_ep_dispatch_params_t *p,
                                       moe_ep_hook_t **hook) {
  MEP_CHECK(mep_group_broken_error(g, "dispatch"));
  MEP_CHECK(mep_handle_check(g, h, "dispatch"));
  if (p == NULL || !MEP_HAS_FIELD(p, recv_count) ||
      (!is_ll(g) && !MEP_HAS_FIELD(p, num_recv_tokens))) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "dispatch: params is NULL or params->struct_size=%zu is below "
                     "the v1 minimum for this mode",
                     p ? p->struct_size : (size_t)0);
  }
  int fp8, scale_format;
  MEP_CHECK(resolve_format(g, p, &fp8, &scale_format));
  MEP_CHECK(check_flags_hidden(g, "dispatch", p->flags, p->hidden, hook, fp8));
  if (h->dispatched) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "dispatch: handle=%p was already dispatched; prepare a new "
                     "handle for each layer call",
                     (void *)h);
  }
  mep_op_t op = {.kind = MEP_OP_DISPATCH, .mode = g->cfg.mode, .flags = p->flags,
                 .hidden = p->hidden, .handle = h, .stream = p->stream,
                 .fp8 = fp8, .scale_format = scale_format};
  void *data;
  int dt;
  mep_tensor_rule_t rx = {"dispatch", "params->x", mep_group_device(g),
                          MEP_BIT(MEP_DT_BF16), 2, {h->num_tokens, p->hidden, 0}, 1};
  MEP_CHECK(mep_tensor_check(p->x, &rx, &data, &dt));
  op.x = data;
  if (is_ll(g)) {
    MEP_CHECK(check_ll_dispatch_outputs(g, p, &op, fp8));
  } else {
    MEP_CHECK(check_ht_dispatch_outputs(g, p, &op));
  }
  moe_ep_status_t st = launch(g, &op, hook);
  if (st == MOE_EP_OK) {
    h->dispatch_hidden = p->hidden;
    h->dispatched = (p->flags & MOE_EP_FLAG_DEFER_RECV) ? 1 : 2;
    if (is_ll(g)) {
      h->weighted = op.weighted;
      h->dispatch_weights = op.topk_weights;
    }
  }
  return st;
}

moe_ep_status_t mep_dispatch(moe_ep_group_t *g, moe_ep_handle_t *h,
                             const moe_ep_dispatch_params_t *p,
                             moe_ep_hook_t **hook) {
  if (hook != NULL) *hook = NULL;
  MEP_LOCKED_ENTRY(g, "dispatch", dispatch_locked(g, h, p, hook));
}

/* LL combine's weights: required, unless the dispatch carried them; then
 * NULL or that same tensor (the expert side already applied them: another
 * tensor would be silently ignored). */
static moe_ep_status_t check_ll_combine_weights(moe_ep_group_t *g, const moe_ep_handle_t *h,
                                                const moe_ep_combine_params_t *p, mep_op_t *op) {
  void *data = NULL;
  if (p->topk_weights != NULL || !h->weighted)
    MEP_CHECK(check_weights(g, h, "combine", p->topk_weights, &data));
  if (h->weighted && data != NULL && data != h->dispatch_weights) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "combine: params->topk_weights data=%p is not the tensor given to "
                     "this handle's dispatch (data=%p); the weights travelled with the "
                     "dispatch and are applied on the expert side, so pass that tensor or "
                     "NULL",
                     data, (const void *)h->dispatch_weights);
  }
  op->topk_weights = h->weighted ? h->dispatch_weights : data;
  return MOE_EP_OK;
}

static moe_ep_status_t combine_locked(moe_ep_group_t *g, moe_ep_handle_t *h,
                                      const moe_ep_combine_params_t *p,
                                      moe_ep_hook_t **hook) {
  MEP_CHECK(mep_group_broken_error(g, "combine"));
  MEP_CHECK(mep_handle_check(g, h, "combine"));
  if (p == NULL || !MEP_HAS_FIELD(p, stream)) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "combine: params is NULL or params->struct_size=%zu is below "
                     "the v1 minimum",
                     p ? p->struct_size : (size_t)0);
  }
  MEP_CHECK(check_flags_hidden(g, "combine", p->flags, p->hidden, hook, 0));
  if (h->dispatched != 2) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "combine: handle=%p has %s; combine needs a completed "
                     "dispatch on it",
                     (void *)h,
                     h->dispatched ? "a dispatch whose hook has not run yet"
                                   : "not been dispatched");
  }
  if (p->hidden != h->dispatch_hidden) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "combine: params->hidden=%d differs from the dispatch's "
                     "hidden=%d on this handle",
                     p->hidden, h->dispatch_hidden);
  }
  int dev = mep_group_device(g);
  mep_op_t op = {.kind = MEP_OP_COMBINE, .mode = g->cfg.mode, .flags = p->flags,
                 .hidden = p->hidden, .handle = h, .stream = p->stream};
  void *data;
  int dt;
  int64_t rows = is_ll(g) ? (int64_t)g->world_size * g->cfg.max_tokens_per_rank
                          : h->num_recv;
  mep_tensor_rule_t ry = {"combine", "params->y", dev, MEP_BIT(MEP_DT_BF16),
                          is_ll(g) ? 3 : 2,
                          {is_ll(g) ? g->num_local_experts : rows,
                           is_ll(g) ? rows : p->hidden, p->hidden},
                          1};
  MEP_CHECK(mep_tensor_check(p->y, &ry, &data, &dt));
  op.y = data;
  if (is_ll(g)) MEP_CHECK(check_ll_combine_weights(g, h, p, &op));
  mep_tensor_rule_t ro = {"combine", "params->out", dev, MEP_BIT(MEP_DT_BF16), 2,
                          {h->num_tokens, p->hidden, 0}, 1};
  MEP_CHECK(mep_tensor_check(p->out, &ro, &op.out, &dt));
  return launch(g, &op, hook);
}

moe_ep_status_t mep_combine(moe_ep_group_t *g, moe_ep_handle_t *h,
                            const moe_ep_combine_params_t *p,
                            moe_ep_hook_t **hook) {
  if (hook != NULL) *hook = NULL;
  MEP_LOCKED_ENTRY(g, "combine", combine_locked(g, h, p, hook));
}

/* The hook's checks and its receive; under the group lock. */
static moe_ep_status_t hook_run_locked(moe_ep_group_t *g, moe_ep_hook_t *hook, void *stream) {
  /* Looked up again under the lock: another thread may have freed it. */
  if (!mep_registry_contains(hook, MEP_OBJ_HOOK)) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "hook_run: hook=%p was freed by another thread", (void *)hook);
  }
  if (hook->group != g) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "hook_run: hook=%p belongs to a destroyed group", (void *)hook);
  }
  MEP_CHECK(mep_group_broken_error(g, "hook_run"));
  if (hook->ran) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "hook_run: hook=%p already ran; a hook runs exactly once",
                     (void *)hook);
  }
  if (!mep_registry_contains(hook->op.handle, MEP_OBJ_HANDLE)) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "hook_run: the handle of hook=%p was freed before the "
                     "hook ran",
                     (void *)hook);
  }
  hook->ran = 1;
  g->pending[hook->op.buffer_set] = NULL;
  hook->op.stream = stream;
  moe_ep_status_t st = g->ops->recv(g, &hook->op);
  if (st == MOE_EP_OK && hook->op.kind == MEP_OP_DISPATCH) {
    hook->op.handle->dispatched = 2;
  }
  return st;
}

moe_ep_status_t mep_hook_run(moe_ep_hook_t *hook, void *stream) {
  /* The owner comes from the registry, not from the hook: another thread
   * may be freeing the hook, and only its group's lock orders the two. */
  void *owner = NULL;
  if (hook == NULL || !mep_registry_owner(hook, MEP_OBJ_HOOK, &owner)) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "hook_run: hook=%p is not a live hook (freed, or not from "
                     "dispatch/combine)",
                     (void *)hook);
  }
  moe_ep_group_t *g = owner;
  if (!mep_registry_contains(g, MEP_OBJ_GROUP)) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "hook_run: hook=%p belongs to a destroyed group", (void *)hook);
  }
  MEP_LOCKED_ENTRY(g, "hook_run", hook_run_locked(g, hook, stream));
}

/* Freeing an unrun hook abandons its receive. The host backend matches
 * each signal to its operation exactly, so dropping the peers' data keeps
 * the group usable; the GPU signals accumulate, so there the group's
 * signal state is no longer consistent and the group is marked failed. */
static void hook_abandon_locked(moe_ep_group_t *g, void *obj) {
  moe_ep_hook_t *hook = obj;
  if (hook->group != g || hook->ran) return;
  if (g->pending[hook->op.buffer_set] == hook) g->pending[hook->op.buffer_set] = NULL;
  if (!g->ops->abandon_is_safe) {
    mep_group_break(g, mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                                 "hook_free: hook=%p was freed before it ran; its "
                                 "receive was abandoned and the %s backend cannot "
                                 "resynchronise its signals: destroy the group",
                                 (void *)hook, g->ops->name));
  }
}

void mep_hook_free(moe_ep_hook_t *hook) {
  if (mep_group_take(hook, MEP_OBJ_HOOK, "hook_free", hook_abandon_locked)) free(hook);
}
