/* ops.c: dispatch / combine / hooks: argument validation common to every
 * backend, buffer-set alternation and pending-hook bookkeeping. A backend
 * only sees requests that passed these checks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/config.h"
#include "runtime/dispatch_check.h"
#include "runtime/error.h"
#include "runtime/group.h"
#include "runtime/registry.h"
#include "runtime/validate.h"

static int is_ll(const moe_ep_group_t *g) {
  return g->cfg.mode == MOE_EP_MODE_LOW_LATENCY;
}

/* The buffer set the next operation uses: sets alternate per operation. */
static int32_t next_buffer_set(const moe_ep_group_t *g) {
  return (int32_t)(g->seq % (uint64_t)(g->cfg.double_buffer ? MEP_NUM_BUFFER_SETS : 1));
}

static moe_ep_status_t reserve_buffer_set(moe_ep_group_t *g, const char *entry,
                                          int32_t *set) {
  int nsets = g->cfg.double_buffer ? MEP_NUM_BUFFER_SETS : 1;
  *set = next_buffer_set(g);
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

static moe_ep_status_t busy_hook_locked(moe_ep_group_t *g, moe_ep_hook_t **hook) {
  if (hook == NULL) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT, "group_busy_hook: hook must be non-NULL");
  }
  *hook = g->pending[next_buffer_set(g)];
  return MOE_EP_OK;
}

moe_ep_status_t mep_group_busy_hook(moe_ep_group_t *g, moe_ep_hook_t **hook) {
  if (hook != NULL) *hook = NULL;
  MEP_LOCKED_ENTRY(g, "group_busy_hook", busy_hook_locked(g, hook));
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
    if (hook == NULL || !mep_registry_add(hook, MEP_OBJ_HOOK, g, g->rank)) {
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

/* An HT handle is dispatched again for "the same layout as before"
 * (DeepEP's cached dispatch) once its previous dispatch completed, and
 * once no combine of it waits in a hook: that combine's receive answers
 * the dispatch before, whose rows and marks the new one would replace.
 * The combine then follows the latest. An LL handle takes one dispatch. */
static moe_ep_status_t check_dispatchable(const moe_ep_group_t *g, const moe_ep_handle_t *h) {
  if (h->dispatched == MEP_DISPATCH_PENDING && !is_ll(g)) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "dispatch: handle=%p has a dispatch whose hook has not run yet; run "
                     "it before dispatching on the handle again",
                     (const void *)h);
  }
  for (int i = 0; i < MEP_NUM_BUFFER_SETS && !is_ll(g); i++) {
    const moe_ep_hook_t *p = g->pending[i];
    if (p == NULL || p->ran || p->op.kind != MEP_OP_COMBINE || p->op.handle != h) continue;
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "dispatch: handle=%p has a combine whose hook=%p has not run yet; run "
                     "it before dispatching on the handle again (its receive answers the "
                     "handle's dispatch before)",
                     (const void *)h, (const void *)p);
  }
  if (h->dispatched != MEP_UNDISPATCHED && is_ll(g)) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "dispatch: handle=%p was already dispatched; a low-latency handle takes "
                     "one dispatch: prepare a new handle for each layer call",
                     (const void *)h);
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
  MEP_CHECK(check_dispatchable(g, h));
  mep_op_t op = {.kind = MEP_OP_DISPATCH, .mode = g->cfg.mode, .flags = p->flags,
                 .hidden = p->hidden, .handle = h, .stream = p->stream};
  if (is_ll(g)) {
    MEP_CHECK(mep_check_ll_dispatch(g, p, hook, &op));
  } else {
    MEP_CHECK(mep_check_ht_dispatch(g, p, hook, &op));
  }
  const uint64_t seq = g->seq;
  moe_ep_status_t st = launch(g, &op, hook);
  /* Sent but not received (the receive failed): no combine may follow on
   * what an earlier dispatch of the handle left. */
  if (st != MOE_EP_OK && g->seq != seq) h->dispatched = MEP_DISPATCH_ABANDONED;
  if (st == MOE_EP_OK) {
    h->dispatch_hidden = p->hidden;
    h->dispatched = (p->flags & MOE_EP_FLAG_DEFER_RECV) ? MEP_DISPATCH_PENDING : MEP_DISPATCHED;
    if (is_ll(g)) {
      h->weighted = op.weighted;
      h->dispatch_weights = op.topk_weights;
    } else {
      h->worst_case = (p->flags & MOE_EP_FLAG_WORST_CASE) != 0;
    }
  }
  return st;
}

/* A dispatch or combine this rank refused before sending anything (bad
 * arguments: INVALID_ARGUMENT, or UNSUPPORTED for a request this build or
 * group cannot serve; the operation number did not move; BUSY is not a
 * refusal, the same operation is tried again): where the backend can,
 * its peers, which made the call, are told in the operation's place, so
 * their receive fails naming this rank at once instead of timing out and
 * failing the group. Not while a hook of this rank is pending: its receive
 * still reads a buffer set, and the peers, once past this operation,
 * could write that set again. */
static moe_ep_status_t refused_in_step(moe_ep_group_t *g, int kind, uint64_t seq_before,
                                       moe_ep_status_t st) {
  if ((st != MOE_EP_ERR_INVALID_ARGUMENT && st != MOE_EP_ERR_UNSUPPORTED) ||
      g->seq != seq_before || g->ops->op_refused == NULL || g->broken != MOE_EP_OK)
    return st;
  for (int i = 0; i < MEP_NUM_BUFFER_SETS; i++) {
    if (g->pending[i] != NULL) return st;
  }
  /* Room for what follows it in the same sentence. */
  char why[MEP_ERROR_MAX - 200];
  snprintf(why, sizeof why, "%s", mep_last_error());
  mep_op_t op = {.kind = kind, .mode = g->cfg.mode, .seq = g->seq,
                 .buffer_set = next_buffer_set(g)};
  moe_ep_status_t told = g->ops->op_refused(g, &op);
  if (told != MOE_EP_OK) {
    return mep_error_suffix(told, "while telling its peers that rank %d refused its %s (%s)",
                            g->rank, kind == MEP_OP_DISPATCH ? "dispatch" : "combine", why);
  }
  g->seq++;
  return mep_error(st, "%s; its peers were told, so their call of this operation fails naming "
                   "rank %d and the group stays usable",
                   why, g->rank);
}

static moe_ep_status_t dispatch_entry(moe_ep_group_t *g, moe_ep_handle_t *h,
                                      const moe_ep_dispatch_params_t *p, moe_ep_hook_t **hook) {
  const uint64_t seq = g->seq;
  return refused_in_step(g, MEP_OP_DISPATCH, seq, dispatch_locked(g, h, p, hook));
}

moe_ep_status_t mep_dispatch(moe_ep_group_t *g, moe_ep_handle_t *h,
                             const moe_ep_dispatch_params_t *p,
                             moe_ep_hook_t **hook) {
  if (hook != NULL) *hook = NULL;
  MEP_LOCKED_ENTRY(g, "dispatch", dispatch_entry(g, h, p, hook));
}

/* LL combine's weights: required, unless the dispatch carried them; then
 * NULL or that same tensor (the expert side already applied them: another
 * tensor would be silently ignored). */
static moe_ep_status_t check_ll_combine_weights(moe_ep_group_t *g, const moe_ep_handle_t *h,
                                                const moe_ep_combine_params_t *p, mep_op_t *op) {
  void *data = NULL;
  if (p->topk_weights != NULL || !h->weighted)
    MEP_CHECK(mep_check_weights(g, h, "combine", p->topk_weights, &data));
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
  MEP_CHECK(mep_check_flags_hidden(g, "combine", p->flags, MEP_COMBINE_FLAGS, p->hidden, hook, 0));
  if (h->dispatched != MEP_DISPATCHED) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "combine: handle=%p has %s; combine needs a completed "
                     "dispatch on it",
                     (void *)h, mep_dispatch_state_text(h->dispatched));
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
                 : h->worst_case && h->worst_rows > h->num_recv ? h->worst_rows
                                                               : h->num_recv;
  /* After a worst-case dispatch y may be that dispatch's fixed-size rows. */
  int64_t y_rows = !is_ll(g) && h->worst_case ? -1 : rows;
  mep_tensor_rule_t ry = {"combine", "params->y", dev, MEP_BIT(MEP_DT_BF16),
                          is_ll(g) ? 3 : 2,
                          {is_ll(g) ? g->num_local_experts : y_rows,
                           is_ll(g) ? rows : p->hidden, p->hidden},
                          1};
  MEP_CHECK(mep_tensor_check(p->y, &ry, &data, &dt));
  if (y_rows < 0 && p->y->shape[0] < rows) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "combine: params->y has %lld rows but this handle's dispatch received "
                     "%lld; after a worst-case dispatch y may have more rows (ignored), never "
                     "fewer",
                     (long long)p->y->shape[0], (long long)rows);
  }
  op.y = data;
  if (is_ll(g)) MEP_CHECK(check_ll_combine_weights(g, h, p, &op));
  mep_tensor_rule_t ro = {"combine", "params->out", dev, MEP_BIT(MEP_DT_BF16), 2,
                          {h->num_tokens, p->hidden, 0}, 1};
  MEP_CHECK(mep_tensor_check(p->out, &ro, &op.out, &dt));
  const mep_named_tensor_t ts[] = {
      {"params->y", p->y, 0},
      {"params->out", p->out, 1},
      {"params->topk_weights", is_ll(g) ? p->topk_weights : NULL, 0},
  };
  MEP_CHECK(mep_tensors_disjoint("combine", ts, 3));
  return launch(g, &op, hook);
}

static moe_ep_status_t combine_entry(moe_ep_group_t *g, moe_ep_handle_t *h,
                                     const moe_ep_combine_params_t *p, moe_ep_hook_t **hook) {
  const uint64_t seq = g->seq;
  return refused_in_step(g, MEP_OP_COMBINE, seq, combine_locked(g, h, p, hook));
}

moe_ep_status_t mep_combine(moe_ep_group_t *g, moe_ep_handle_t *h,
                            const moe_ep_combine_params_t *p,
                            moe_ep_hook_t **hook) {
  if (hook != NULL) *hook = NULL;
  MEP_LOCKED_ENTRY(g, "combine", combine_entry(g, h, p, hook));
}

/* Abandons an unrun hook's receive (hook_free, or hook_run of a hook whose
 * handle is gone); `why` opens the failed group's sentence. The host
 * backend matches each signal to its operation exactly, so dropping the
 * peers' data keeps the group usable (its next send still waits for every
 * rank to have sent an abandoned combine: host_abandon); the GPU signals
 * accumulate, so there the ranks' signal state no longer agrees and the
 * group is marked failed (MISMATCH: fatal, as a failed group's status must
 * be; INVALID_ARGUMENT would read as "refused, group usable"). */
static moe_ep_status_t hook_abandon(moe_ep_group_t *g, moe_ep_hook_t *hook,
                                    const char *why) {
  if (hook->ran) return MOE_EP_OK;
  hook->ran = 1;
  if (g->pending[hook->op.buffer_set] == hook) g->pending[hook->op.buffer_set] = NULL;
  /* The handle, still live (handle_free clears op.handle), never gets this
   * dispatch's receive: its refusals say so. */
  if (hook->op.kind == MEP_OP_DISPATCH && hook->op.handle != NULL) {
    hook->op.handle->dispatched = MEP_DISPATCH_ABANDONED;
  }
  if (g->ops->abandon_is_safe) {
    if (g->ops->abandon != NULL) g->ops->abandon(g, &hook->op);
    return MOE_EP_OK;
  }
  return mep_group_break(g, mep_error(MOE_EP_ERR_MISMATCH,
                                      "%s; its receive was abandoned and the %s backend "
                                      "cannot resynchronise its signals: destroy the group",
                                      why, g->ops->name));
}

static void hook_abandon_locked(moe_ep_group_t *g, void *obj) {
  moe_ep_hook_t *hook = obj;
  if (hook->group != g) return;
  char why[96];
  snprintf(why, sizeof(why), "hook_free: hook=%p was freed before it ran", (void *)hook);
  (void)hook_abandon(g, hook, why);
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
  /* handle_free clears op.handle of a pending hook (a later handle may
   * reuse the address, so the registry alone cannot tell). The receive is
   * abandoned here, as hook_free would: left pending, the hook would hold
   * its buffer set against every later operation, which could only be
   * told to run a hook that can never run. */
  if (hook->op.handle == NULL || !mep_registry_contains(hook->op.handle, MEP_OBJ_HANDLE)) {
    char why[160];
    snprintf(why, sizeof(why), "hook_run: the handle of hook=%p was freed before the hook ran",
             (void *)hook);
    MEP_CHECK(hook_abandon(g, hook, why));
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "%s; its receive was abandoned (nothing ran)", why);
  }
  hook->op.stream = stream;
  if (g->ops->check_recv != NULL) MEP_CHECK(g->ops->check_recv(g, &hook->op));
  hook->ran = 1;
  g->pending[hook->op.buffer_set] = NULL;
  moe_ep_status_t st = g->ops->recv(g, &hook->op);
  if (st != MOE_EP_OK && !mep_status_is_fatal(st) && !g->ops->abandon_is_safe) {
    /* The send half went out, so the peers' signals of this operation
     * stay unconsumed, as after an abandoned receive. The backend checks
     * a receive's arguments with its send's, so this is not expected. */
    st = mep_error_suffix(MOE_EP_ERR_MISMATCH,
                          "rank %d's receive was refused after its send half went out, and the "
                          "%s backend cannot resynchronise its signals: destroy the group",
                          g->rank, g->ops->name);
  }
  if (hook->op.kind == MEP_OP_DISPATCH) {
    hook->op.handle->dispatched = st == MOE_EP_OK ? MEP_DISPATCHED : MEP_DISPATCH_ABANDONED;
  }
  return st;
}

moe_ep_status_t mep_hook_run(moe_ep_hook_t *hook, void *stream) {
  moe_ep_group_t *g;
  MEP_CHECK(mep_owner_group(hook, MEP_OBJ_HOOK, "hook_run", &g));
  MEP_LOCKED_ENTRY(g, "hook_run", hook_run_locked(g, hook, stream));
}

void mep_hook_free(moe_ep_hook_t *hook) {
  mep_group_free(hook, MEP_OBJ_HOOK, hook != NULL ? &hook->deferred : NULL, "hook_free",
                 hook_abandon_locked, mep_registry_retire);
}
