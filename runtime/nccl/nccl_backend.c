/* nccl_backend.c: backend "nccl": the LL data path on GPUs. NCCL setup
 * (communicator, symmetric window, device communicator) comes from
 * nccl_setup.c, the kernels from kernels/ll/ll.h; this file turns validated
 * operations (and prepare's layout outputs) into kernel launches, keeps the
 * per-buffer-set handle storage, and turns a kernel's timeout record into
 * MOE_EP_ERR_TIMEOUT. */
#include <cuda_runtime_api.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/common/prepare_layout.h"
#include "kernels/ll/ll.h"
#include "runtime/bootstrap.h"
#include "runtime/config.h"
#include "runtime/error.h"
#include "runtime/group.h"
#include "runtime/log.h"
#include "runtime/nccl/kernel_load.h"
#include "runtime/nccl/layout_book.h"
#include "runtime/nccl/lsa_link.h"
#include "runtime/nccl/nccl_common.h"
#include "runtime/nccl/nccl_setup.h"
#include "runtime/nccl/row_shape.h"

typedef struct nccl_state {
  mep_nccl_t *nccl;
  mep_ll_ctx_t ctx;
  /* Host-mapped, two records: [0] a timed-out wait (fatal), [1] a routing
   * notice (an out-of-range topk_idx entry was dropped; reported once). */
  mep_ll_error_record_t *rec;
  int device;
  int device_sms;
  int32_t *peer_transport;
  /* Handle storage per dispatch buffer set: slot sources, and each
   * received slot's route and each source's token count, for combine. */
  int32_t *slot_src[MEP_NUM_BUFFER_SETS];
  int32_t *src_count[MEP_NUM_BUFFER_SETS];
  mep_ll_route_t *route[MEP_NUM_BUFFER_SETS];
  int32_t *src_tokens[MEP_NUM_BUFFER_SETS];
  /* Which dispatch's layout each set's handle storage holds. */
  mep_layout_book_t layouts;
  /* Recorded after each send half: a hook may run its receive on another
   * stream, which must still come after the send. */
  mep_nccl_sent_t sent;
  /* The last receive half on each set: a later send on the set waits for
   * it when on another stream. A combine's regions alternate between two
   * halves, which rests on each rank's combine send coming after its
   * receive of the last combine on the set (kernels/ll/PROTOCOL.md,
   * section 6); a hook's receive may run on another stream. */
  mep_nccl_sent_t received;
  /* The last handle_layout kernel on each set: it reads the set's handle
   * storage, which the set's next dispatch rewrites and teardown frees. */
  mep_nccl_sent_t exported;
  /* Per dispatch buffer set: the combine this rank sent of the set's last
   * dispatch (the set it ran on, and whether its receive was issued). Every
   * peer received that dispatch before starting that combine; a dispatch
   * that reuses the set comes after that combine's receive, or, while the
   * receive is still to run, after a wait for the peers' count signals of
   * that combine (order_reuse; kernels/ll/PROTOCOL.md, section 6). */
  struct {
    int32_t sent;
    int32_t received;
    int32_t comb_set;
  } reuse[MEP_NUM_BUFFER_SETS];
} nccl_state_t;

/* What a handle remembers of its dispatch (h->backend). */
typedef struct nccl_handle {
  int32_t set;
  uint64_t seq;        /* the dispatch's operation number */
  int32_t *recv_count; /* the engine's recv_count tensor of that dispatch */
} nccl_handle_t;

/* lsa_only: the window carries no staging (the group's transport is LSA;
 * with transport auto, as long as every peer is in this rank's LSA team
 * and the team is on NVLink). */
static void dims_for(const moe_ep_config_t *cfg, int world, int lsa_only, mep_ll_dims_t *d) {
  d->local_experts = cfg->num_experts / world;
  d->world = world;
  d->max_tokens = cfg->max_tokens_per_rank;
  d->hidden = cfg->hidden;
  d->top_k = cfg->top_k;
  d->fp8 = mep_config_fp8_dispatch(cfg);
  d->num_sets = cfg->double_buffer ? 2 : 1; /* one set: half the window */
  d->lsa_only = lsa_only;
}

/* Window bytes without staging (lsa and auto) or with it (gin,
 * gin_emulated); the LSA form leaves out one bf16 row per received slot
 * (E_local * R * max_tokens rows per set). */
static uint64_t ll_window_bytes(const moe_ep_config_t *cfg, int world, int lsa_only) {
  mep_ll_dims_t d;
  dims_for(cfg, world, lsa_only, &d);
  return mep_ll_buffer_bytes(&d);
}

/* With MOE_EP_LSA_LINK=pcie, auto takes gin_emulated (lsa_link.h). */
static int lsa_capable(const moe_ep_config_t *cfg) {
  return cfg->transport == MOE_EP_TRANSPORT_LSA ||
         (cfg->transport == MOE_EP_TRANSPORT_AUTO && !mep_lsa_link_env_is_pcie());
}

/* buffer_size_hint: with transport auto, the bytes of one NVLink domain (a
 * group that spans domains falls back to GIN, and one whose LSA team is
 * found off NVLink to gin_emulated: both allocate the staged size, which
 * group_info reports and the hint gives for transports gin and
 * gin_emulated, and for auto under MOE_EP_LSA_LINK=pcie). */
static uint64_t nccl_buffer_bytes(const moe_ep_config_t *cfg, int world) {
  return ll_window_bytes(cfg, world, lsa_capable(cfg));
}

static void raise_abort(void *ctx, cudaStream_t stream) {
  /* a refused copy is not left pending as the engine's CUDA error */
  if (mep_ll_raise_abort((const mep_ll_ctx_t *)ctx, stream) != MEP_KSTATUS_OK)
    (void)cudaGetLastError();
}

/* abort: the group failed, or this rank stops setting up while its peers
 * go on (mep_nccl_destroy aborts the communicator instead of a collective
 * teardown). Waits (bounded) for the group's last kernels, then frees in
 * stream order; nothing here waits for the whole device. A failed group's
 * kernels still waiting for peers first get the abort flag, so they end
 * at their next check instead of after timeouts.kernel_ms (or, when that
 * is the longer, instead of the group being left allocated). */
static moe_ep_status_t nccl_release(moe_ep_group_t *g, int abort) {
  nccl_state_t *s = g->impl;
  if (s == NULL) return MOE_EP_OK;
  moe_ep_status_t st = MOE_EP_OK;
  int ended = 1;
  if (s->device >= 0 && s->nccl != NULL) {
    /* Without the NCCL side no kernel of ours ran. */
    (void)mep_nccl_make_current(s->device);
    const mep_nccl_sent_t *last[3] = {&s->sent, &s->received, &s->exported};
    ended = mep_nccl_quiesce(g, s->nccl, last, 3,
                             abort && s->ctx.state != NULL ? raise_abort : NULL, &s->ctx, &st);
  }
  if (ended) { /* else the kernels may still write the records and read the storage */
    for (int i = 0; i < MEP_NUM_BUFFER_SETS; i++) {
      mep_nccl_free(s->nccl, s->slot_src[i]);
      mep_nccl_free(s->nccl, s->src_count[i]);
      mep_nccl_free(s->nccl, s->route[i]);
      mep_nccl_free(s->nccl, s->src_tokens[i]);
    }
    mep_nccl_free(s->nccl, s->ctx.state);
    mep_nccl_free_records(s->rec);
  }
  mep_nccl_sent_destroy(&s->sent);
  mep_nccl_sent_destroy(&s->received);
  mep_nccl_sent_destroy(&s->exported);
  st = mep_nccl_release(g, s->nccl, ended, abort, st);
  free(s->peer_transport);
  free(s);
  g->impl = NULL;
  return st;
}

static moe_ep_status_t nccl_teardown(moe_ep_group_t *g) {
  return nccl_release(g, g->broken != MOE_EP_OK);
}

static moe_ep_status_t nccl_destroy(moe_ep_group_t *g) {
  return mep_nccl_as_caller(nccl_teardown, g);
}

static int ll_transport(const moe_ep_group_t *g, const nccl_state_t *s) {
  if (g->cfg.transport == MOE_EP_TRANSPORT_GIN_EMULATED) return MEP_LL_TRANSPORT_GIN_EMULATED;
  if (g->cfg.transport == MOE_EP_TRANSPORT_GIN) return MEP_LL_TRANSPORT_GIN;
  int emulated = 0; /* auto over an LSA team not on NVLink (lsa_link.h) */
  for (int p = 0; p < g->world_size; p++) {
    if (s->peer_transport[p] == MOE_EP_TRANSPORT_GIN) return MEP_LL_TRANSPORT_GIN;
    if (s->peer_transport[p] == MOE_EP_TRANSPORT_GIN_EMULATED) emulated = 1;
  }
  return emulated ? MEP_LL_TRANSPORT_GIN_EMULATED : MEP_LL_TRANSPORT_LSA;
}

static moe_ep_status_t alloc_device(nccl_state_t *s, const mep_ll_dims_t *d) {
  MEP_CHECK(mep_nccl_alloc_zeroed(s->nccl, &s->ctx.state, mep_ll_state_bytes(d),
                                  "allocating and zeroing the LL device state"));
  MEP_CHECK(mep_nccl_alloc_records(&s->rec, &s->ctx.error_dev));
  s->ctx.notice_dev = s->ctx.error_dev + 1;
  size_t slots = (size_t)d->local_experts * (size_t)d->world * (size_t)d->max_tokens;
  size_t routes = (size_t)d->world * (size_t)d->max_tokens * (size_t)d->top_k;
  const char *what = "allocating handle storage";
  for (int i = 0; i < MEP_NUM_BUFFER_SETS; i++) {
    MEP_CHECK(mep_nccl_alloc_zeroed(s->nccl, (void **)&s->slot_src[i], slots * 4u, what));
    MEP_CHECK(mep_nccl_alloc_zeroed(s->nccl, (void **)&s->src_count[i],
                                    (size_t)d->local_experts * (size_t)d->world * 4u, what));
    MEP_CHECK(mep_nccl_alloc_zeroed(s->nccl, (void **)&s->route[i],
                                    routes * sizeof(mep_ll_route_t), what));
    MEP_CHECK(mep_nccl_alloc_zeroed(s->nccl, (void **)&s->src_tokens[i],
                                    (size_t)d->world * 4u, what));
  }
  MEP_CHECK(mep_nccl_sent_create(&s->sent));
  MEP_CHECK(mep_nccl_sent_create(&s->exported));
  return mep_nccl_sent_create(&s->received);
}

static moe_ep_status_t nccl_create_here(moe_ep_group_t *g);

static moe_ep_status_t nccl_create(moe_ep_group_t *g) {
  return mep_nccl_as_caller(nccl_create_here, g);
}

static moe_ep_status_t nccl_create_here(moe_ep_group_t *g) {
  if (g->cfg.mode != MOE_EP_MODE_LOW_LATENCY) {
    return mep_error(MOE_EP_ERR_UNSUPPORTED,
                     "group_create: mode 'high_throughput' is not implemented on the "
                     "nccl backend yet (the host backend has it)");
  }
  nccl_state_t *s = calloc(1, sizeof(*s));
  if (s == NULL) return mep_error(MOE_EP_ERR_NO_MEMORY, "group_create: out of memory");
  g->impl = s;
  s->device = -1;
  moe_ep_status_t st;
  s->peer_transport = calloc((size_t)g->world_size, sizeof(int32_t));
  if (s->peer_transport == NULL) {
    st = mep_error(MOE_EP_ERR_NO_MEMORY, "group_create: out of memory");
    goto out_destroy;
  }
  MEP_CHECK_GOTO(mep_nccl_pick_device(g, &s->device, &s->device_sms), st, out_destroy);
  mep_lsa_link_policy_t link_policy;
  if ((st = mep_lsa_link_policy_env(&link_policy)) != MOE_EP_OK) {
    mep_error_prefix("group_create on rank %d", g->rank);
    goto out_destroy;
  }
  mep_ll_dims_t d;
  dims_for(&g->cfg, g->world_size, 0, &d);
  mep_nccl_params_t np = {
      .rank = g->rank,
      .world = g->world_size,
      .cuda_device = s->device,
      .transport = g->cfg.transport,
      .window_bytes = nccl_buffer_bytes(&g->cfg, g->world_size),
      .window_bytes_gin = g->cfg.transport == MOE_EP_TRANSPORT_AUTO
                              ? ll_window_bytes(&g->cfg, g->world_size, 0)
                              : 0,
      .gin_signal_count = (int32_t)(mep_ll_num_sets(&d) * mep_ll_set_layout(&d).num_signals),
      .adopt_comm = g->nccl_comm,
      .exchange = mep_nccl_share_uid,
      .exchange_user = g->boot,
      .lsa_link_check = 1,
      .lsa_link_policy = link_policy,
      .timeout_ms = g->cfg.bootstrap_timeout_ms,
  };
  MEP_CHECK_GOTO(mep_nccl_create(&np, &s->nccl), st, out_destroy);
  MEP_CHECK_GOTO(mep_nccl_group_load_kernels(g, s->device, mep_ll_load, "LL"), st, out_destroy);
  mep_nccl_peer_transports(s->nccl, s->peer_transport, g->world_size);
  if ((st = alloc_device(s, &d)) != MOE_EP_OK) {
    mep_error_prefix("group_create on rank %d", g->rank);
    goto out_destroy;
  }
  s->ctx.dev_comm = mep_nccl_dev_comm(s->nccl);
  s->ctx.window = mep_nccl_window(s->nccl);
  s->ctx.window_local = mep_nccl_window_local(s->nccl);
  s->ctx.window_bytes = mep_nccl_bytes_allocated(s->nccl);
  s->ctx.rank = g->rank;
  s->ctx.transport = ll_transport(g, s);
  const char *link = mep_lsa_link_name((mep_lsa_link_t)mep_nccl_lsa_link(s->nccl));
  if (g->cfg.transport == MOE_EP_TRANSPORT_AUTO &&
      s->ctx.transport == MEP_LL_TRANSPORT_GIN_EMULATED)
    MEP_LOG_WARN("nccl",
                 "rank %d: the LSA team's GPUs are not all joined by NVLink (worst link: %s); "
                 "LL runs gin_emulated there (MOE_EP_LSA_LINK=nvlink overrides where NVML "
                 "cannot tell)",
                 g->rank, link);
  MEP_LOG_INFO("nccl", "rank %d: LL transport %s; the LSA team's worst link: %s", g->rank,
               s->ctx.transport == MEP_LL_TRANSPORT_LSA   ? "lsa"
               : s->ctx.transport == MEP_LL_TRANSPORT_GIN ? "gin"
                                                          : "gin_emulated",
               link);
  /* the layout the window was sized for (mep_nccl_create picked the size
   * by the same peers) */
  d.lsa_only = s->ctx.transport == MEP_LL_TRANSPORT_LSA;
  s->ctx.dims = d;
  if (s->ctx.transport != MEP_LL_TRANSPORT_GIN)
    MEP_CHECK_GOTO(mep_nccl_resolve_lsa(s->nccl, g->rank, &s->ctx.lsa_base, &s->ctx.lsa_stride,
                                        &s->ctx.lsa_local),
                   st, out_destroy);
  if (mep_ll_timeout_cycles(s->device, g->cfg.kernel_timeout_ms, &s->ctx.timeout_cycles) != MEP_KSTATUS_OK) {
    st = mep_error(MOE_EP_ERR_CUDA, "group_create on rank %d: %s", g->rank,
                   mep_kernels_last_error());
    goto out_destroy;
  }
  g->bytes_allocated = mep_nccl_bytes_allocated(s->nccl);
  return MOE_EP_OK;
out_destroy:;
  /* The failed step's sentence is the one to report, not the teardown's. */
  mep_error_saved_t failed;
  mep_error_save(&failed);
  (void)nccl_release(g, 1); /* the peers go on to the closing agreement */
  mep_error_restore(&failed);
  return st;
}

/* A kernel's expired wait, as a sentence. */
static moe_ep_status_t timeout_error(const moe_ep_group_t *g, const nccl_state_t *s) {
  const mep_ll_error_record_t *r = &s->rec[0];
  if (r->op == MEP_LL_OP_BAD_SIGNAL) {
    return mep_error(MOE_EP_ERR_INTERNAL,
                     "a receive kernel on rank %d read %llu from rank %d's count signal, "
                     "slot-list head or expert list (buffer set %d, local expert %d), a value "
                     "no sender produces (expected from %llu): the signal state is "
                     "inconsistent, e.g. a peer's late operation after a timeout; destroy the "
                     "group",
                     r->rank, (unsigned long long)r->seen, r->peer, r->buffer_set, r->expert,
                     (unsigned long long)r->expected);
  }
  if (r->op == MEP_LL_OP_DISPATCH_LIST || r->op == MEP_LL_OP_COMBINE_WEIGHTS ||
      r->op == MEP_LL_OP_COMBINE_FLAGGED) {
    /* a word that carries its own tag: a slot- or expert-list word, a
     * pushed combine weight, or a flagged combine partial */
    const int list = r->op == MEP_LL_OP_DISPATCH_LIST;
    const int flagged = r->op == MEP_LL_OP_COMBINE_FLAGGED;
    return mep_error(MOE_EP_ERR_TIMEOUT,
                     "a %s kernel on rank %d waited timeouts.kernel_ms=%d for rank %d's %s "
                     "(buffer set %d): expected %s %llu, saw %llu; the peer did not take part "
                     "in the operation",
                     list ? "dispatch receive" : flagged ? "combine receive" : "combine send",
                     r->rank, g->cfg.kernel_timeout_ms, r->peer,
                     list ? "slot or expert list" : flagged ? "combine partial" : "combine weights",
                     r->buffer_set, list ? "list tag" : "combine epoch",
                     (unsigned long long)r->expected, (unsigned long long)r->seen);
  }
  if (r->op == MEP_LL_OP_COMBINE_OTHER_DISPATCH) {
    /* mep_ll_disp_ident: list tag << 1 | buffer set */
    return mep_error(MOE_EP_ERR_MISMATCH,
                     "a combine on rank %d (buffer set %d) found that rank %d combined another "
                     "dispatch than this rank: its combine answers the dispatch on buffer set "
                     "%llu (list tag %llu), this rank's the one on buffer set %llu (list tag "
                     "%llu); every rank must combine its pending dispatches in the same order "
                     "(two micro-batches combined in different orders on different ranks). "
                     "Nothing of that rank's combine was summed; destroy the group",
                     r->rank, r->buffer_set, r->peer, (unsigned long long)(r->seen & 1u),
                     (unsigned long long)(r->seen >> 1), (unsigned long long)(r->expected & 1u),
                     (unsigned long long)(r->expected >> 1));
  }
  if (r->op == MEP_LL_OP_ROW_DESC) {
    return mep_ll_row_desc_fatal(r->rank, r->peer, r->buffer_set, (uint32_t)r->expected,
                                 (uint32_t)r->seen);
  }
  if (r->op == MEP_LL_OP_DISPATCH_REUSE) {
    return mep_error(MOE_EP_ERR_TIMEOUT,
                     "a dispatch on rank %d waited timeouts.kernel_ms=%d for rank %d to start "
                     "the combine (buffer set %d) of the last dispatch on the set it reuses "
                     "(expected signal %llu, saw %llu): that peer did not receive and combine "
                     "that dispatch",
                     r->rank, g->cfg.kernel_timeout_ms, r->peer, r->buffer_set,
                     (unsigned long long)r->expected, (unsigned long long)r->seen);
  }
  const char *op = r->op == MEP_LL_OP_DISPATCH_RECV  ? "dispatch receive"
                   : r->op == MEP_LL_OP_COMBINE_RECV ? "combine receive"
                                                     : "receive";
  return mep_error(MOE_EP_ERR_TIMEOUT,
                   "a %s kernel on rank %d waited timeouts.kernel_ms=%d for rank %d "
                   "(local expert %d, buffer set %d): expected signal %llu, saw %llu; "
                   "the peer did not take part in the operation",
                   op, r->rank, g->cfg.kernel_timeout_ms, r->peer, r->expert,
                   r->buffer_set, (unsigned long long)r->expected,
                   (unsigned long long)r->seen);
}

/* The timeout record (fatal): written by the GPU into host-mapped memory,
 * so read fresh every time. */
static moe_ep_status_t timeout_status(moe_ep_group_t *g, nccl_state_t *s) {
  return mep_nccl_record_ready(&s->rec[0]) ? timeout_error(g, s) : MOE_EP_OK;
}

/* A routing notice, reported once (the record is cleared): the dispatch ran
 * with the slot dropped, and the group stays usable. */
static moe_ep_status_t routing_notice(moe_ep_group_t *g, nccl_state_t *s) {
  mep_ll_error_record_t *r = &s->rec[1];
  if (!mep_nccl_record_ready(r)) return MOE_EP_OK;
  moe_ep_status_t st;
  if (r->op == MEP_LL_OP_REPEATED_EXPERT) {
    st = mep_error(
        MOE_EP_ERR_INVALID_ARGUMENT,
        "dispatch on rank %d: rank %d's topk_idx named local expert %d (expert %d) in %llu "
        "slots of one call, more than max_tokens_per_rank=%llu: an expert repeated within a "
        "token (each token's experts must be distinct); the slots past the first %llu in "
        "(token, k) order were dropped, and their share of the combine is not defined (the "
        "first such case of an earlier call; others may follow it)",
        r->rank, r->peer, r->expert, r->rank * g->num_local_experts + r->expert,
        (unsigned long long)r->seen, (unsigned long long)r->expected,
        (unsigned long long)r->expected);
  } else {
    st = mep_nccl_bad_routing(g, r);
  }
  __atomic_store_n(&r->flag, 0, __ATOMIC_RELEASE);
  return st;
}

static moe_ep_status_t nccl_poll_error(moe_ep_group_t *g) {
  nccl_state_t *s = g->impl;
  MEP_CHECK(timeout_status(g, s));
  return routing_notice(g, s);
}

/* Makes the group's GPU current for a launch; the engine's state, saved in
 * *caller, is restored by mep_nccl_leave (nccl_context.h). */
static moe_ep_status_t enter_device(moe_ep_group_t *g, nccl_state_t *s,
                                    mep_nccl_caller_t *caller) {
  MEP_CHECK(timeout_status(g, s));
  MEP_CHECK(mep_nccl_enter(s->device, caller));
  s->ctx.num_sms = g->num_sms > 0 ? g->num_sms : s->device_sms;
  return MOE_EP_OK;
}

/* The kernels' own statuses keep kernels/ free of the public ABI; the
 * fp8 scale formats pass through as numbers. */
_Static_assert((int)MEP_FP8_SCALE_F32 == (int)MOE_EP_FP8_SCALE_F32 &&
                   (int)MEP_FP8_SCALE_UE8M0 == (int)MOE_EP_FP8_SCALE_UE8M0 &&
                   (int)MEP_FP8_SCALE_UE8M0_PACKED == (int)MOE_EP_FP8_SCALE_UE8M0_PACKED,
               "kernels/common/kernels_types.h's fp8 scale formats must keep moe_ep_fp8_scale_t's numbers");
_Static_assert((int)MEP_LL_TRANSPORT_LSA == (int)MOE_EP_TRANSPORT_LSA &&
                   (int)MEP_LL_TRANSPORT_GIN == (int)MOE_EP_TRANSPORT_GIN &&
                   (int)MEP_LL_TRANSPORT_GIN_EMULATED == (int)MOE_EP_TRANSPORT_GIN_EMULATED,
               "kernels/ll/ll.h's transports must keep moe_ep_transport_t's numbers");

static moe_ep_status_t nccl_prepare(moe_ep_group_t *g, mep_handle_state_t *h) {
  nccl_state_t *s = g->impl;
  MEP_CHECK(timeout_status(g, s));
  return mep_nccl_prepare_layout(g, s->nccl, s->device, h);
}

static void dispatch_args(moe_ep_group_t *g, nccl_state_t *s, const mep_op_t *op,
                          mep_ll_dispatch_args_t *a) {
  const mep_handle_state_t *h = op->handle;
  *a = (mep_ll_dispatch_args_t){
      .x = op->x,
      .topk_idx = h->topk_idx,
      .topk_idx_bytes = h->topk_idx_bits / 8,
      .num_tokens = h->num_tokens,
      .hidden = op->hidden,
      .top_k = h->top_k,
      .num_experts = g->cfg.num_experts,
      .fp8 = op->fp8,
      .scale_mode = mep_op_scale_format(op),
      .buffer_set = op->buffer_set,
      .recv_x = op->recv_x,
      .recv_scales = op->recv_scales,
      .recv_count = op->recv_count,
      .slot_src = s->slot_src[op->buffer_set],
      .src_count = s->src_count[op->buffer_set],
      .route = s->route[op->buffer_set],
      .src_tokens = s->src_tokens[op->buffer_set],
      .weighted = op->weighted,
      .topk_weights = op->topk_weights,
  };
}

static void combine_args(moe_ep_group_t *g, nccl_state_t *s, const mep_op_t *op,
                         mep_ll_combine_args_t *a) {
  const mep_handle_state_t *h = op->handle;
  const nccl_handle_t *nh = h->backend;
  *a = (mep_ll_combine_args_t){
      .y = op->y,
      .topk_idx = h->topk_idx,
      .topk_idx_bytes = h->topk_idx_bits / 8,
      .topk_weights = op->topk_weights,
      .out = op->out,
      .num_tokens = h->num_tokens,
      .hidden = op->hidden,
      .top_k = h->top_k,
      .num_experts = g->cfg.num_experts,
      .buffer_set = op->buffer_set,
      .dispatch_set = nh->set,
      .recv_count = nh->recv_count,
      .slot_src = s->slot_src[nh->set],
      .src_count = s->src_count[nh->set],
      .route = s->route[nh->set],
      .src_tokens = s->src_tokens[nh->set],
      .partials = h->weighted, /* this rank's dispatch sent weights */
  };
}

/* Every refusal of the call, before anything is queued for it (the stream
 * waits of order_send, order_reuse's wait kernel): a refused call leaves
 * no work behind, and a deferred receive, whose pointers are checked here
 * with the send's, is not refused after its send went out. */
static moe_ep_status_t send_checks(moe_ep_group_t *g, nccl_state_t *s, mep_op_t *op, int fused) {
  if (op->kind == MEP_OP_DISPATCH) {
    nccl_handle_t *nh = op->handle->backend;
    if (nh == NULL && (nh = calloc(1, sizeof(*nh))) == NULL) {
      return mep_error(MOE_EP_ERR_NO_MEMORY, "dispatch on rank %d: out of memory", g->rank);
    }
    op->handle->backend = nh;
    mep_ll_dispatch_args_t a;
    dispatch_args(g, s, op, &a);
    return mep_nccl_launched(
        g, mep_ll_dispatch_validate(fused ? "dispatch" : "dispatch_send", &s->ctx, &a), "dispatch");
  }
  const nccl_handle_t *nh = op->handle->backend;
  MEP_CHECK(mep_layout_book_check(&s->layouts, "combine", g->rank, nh->set, nh->seq));
  mep_ll_combine_args_t a;
  combine_args(g, s, op, &a);
  return mep_nccl_launched(
      g, mep_ll_combine_validate(fused ? "combine" : "combine_send", &s->ctx, &a), "combine");
}

/* The send half, or with fused != 0 both halves in one kernel, after
 * send_checks. A dispatch takes over its buffer set's handle storage only
 * once its launch was accepted: a refused dispatch leaves the older handle
 * on that set valid. */
static moe_ep_status_t send_half(moe_ep_group_t *g, nccl_state_t *s, mep_op_t *op, int fused) {
  if (op->kind == MEP_OP_DISPATCH) {
    nccl_handle_t *nh = op->handle->backend;
    mep_ll_dispatch_args_t a;
    dispatch_args(g, s, op, &a);
    moe_ep_status_t st = mep_layout_book_record(
        &s->layouts, op->buffer_set, op->seq,
        mep_nccl_launched(g, fused ? mep_ll_dispatch(&s->ctx, &a, op->stream)
                       : mep_ll_dispatch_send(&s->ctx, &a, op->stream),
                 "dispatch"));
    if (st == MOE_EP_OK) {
      nh->set = op->buffer_set;
      nh->seq = op->seq;
      nh->recv_count = op->recv_count;
    }
    return st;
  }
  const nccl_handle_t *nh = op->handle->backend;
  mep_ll_combine_args_t a;
  combine_args(g, s, op, &a);
  MEP_CHECK(mep_nccl_launched(g, fused ? mep_ll_combine(&s->ctx, &a, op->stream)
                                       : mep_ll_combine_send(&s->ctx, &a, op->stream),
                              "combine"));
  s->reuse[nh->set].sent = 1;
  s->reuse[nh->set].received = fused;
  s->reuse[nh->set].comb_set = op->buffer_set;
  return MOE_EP_OK;
}

/* Before a dispatch's send: a peer may still have to read the set's
 * previous dispatch (its receive hook not run yet) unless this rank's
 * receive of that dispatch's combine, which waited for every peer's
 * combine, comes first. When that receive ran, on whatever stream, the
 * send waits for it; while it is still to run (two-batch overlap's order),
 * a small kernel waits for the peers' count signals of that combine
 * without consuming them. Nothing to order before the set's first
 * dispatch's combine was sent. */
static moe_ep_status_t order_reuse(moe_ep_group_t *g, nccl_state_t *s, const mep_op_t *op,
                                   const mep_nccl_stream_t *on) {
  if (op->kind != MEP_OP_DISPATCH || !s->reuse[op->buffer_set].sent) return MOE_EP_OK;
  const int comb_set = s->reuse[op->buffer_set].comb_set;
  /* An event orders the dispatch after that receive only when both are
   * eager or in one capture; otherwise the wait kernel, which reads the
   * device's state, orders it whichever ran first. */
  if (s->reuse[op->buffer_set].received) {
    int ordered;
    MEP_CHECK(mep_nccl_sent_order_if(&s->received, comb_set, on, &ordered));
    if (ordered) return MOE_EP_OK;
  }
  MEP_CHECK(mep_nccl_sent_order(&s->sent, comb_set, on));
  MEP_CHECK(mep_nccl_launched(g, mep_ll_await_combine(&s->ctx, comb_set, op->stream),
                              "dispatch (waiting for the peers' combine of the set's last "
                              "dispatch)"));
  /* Teardown waits for the wait kernel too, should the send that follows
   * it be refused at launch. */
  return mep_nccl_sent_record(&s->sent, op->buffer_set, on);
}

/* A dispatch's send was launched: its set starts a new round. */
static void reuse_restart(nccl_state_t *s, const mep_op_t *op) {
  if (op->kind != MEP_OP_DISPATCH) return;
  s->reuse[op->buffer_set].sent = 0;
  s->reuse[op->buffer_set].received = 0;
}

/* A combine's receive was launched. */
static void reuse_received(nccl_state_t *s, const mep_op_t *op) {
  if (op->kind != MEP_OP_COMBINE) return;
  const nccl_handle_t *nh = op->handle->backend;
  if (s->reuse[nh->set].sent && s->reuse[nh->set].comb_set == op->buffer_set)
    s->reuse[nh->set].received = 1;
}

/* A send half comes after the set's last receive and last handle_layout
 * kernel (which read the storage its dispatch rewrites), on whatever
 * stream those ran; a combine's also after the receive of its dispatch,
 * whose handle storage and receive count it reads (an engine's expert
 * work orders it so, unless it ran on another stream than the combine's;
 * PROTOCOL.md, section 6, counts on it for the set's reuse). */
static moe_ep_status_t order_send(nccl_state_t *s, const mep_op_t *op,
                                  const mep_nccl_stream_t *on) {
  MEP_CHECK(mep_nccl_sent_order(&s->received, op->buffer_set, on));
  if (op->kind == MEP_OP_COMBINE) {
    const nccl_handle_t *nh = op->handle->backend;
    MEP_CHECK(mep_nccl_sent_order(&s->received, nh->set, on));
  }
  return mep_nccl_sent_order(&s->exported, op->buffer_set, on);
}

static moe_ep_status_t nccl_send(moe_ep_group_t *g, mep_op_t *op) {
  nccl_state_t *s = g->impl;
  mep_nccl_caller_t caller;
  MEP_CHECK(enter_device(g, s, &caller));
  mep_nccl_stream_t on;
  moe_ep_status_t st = send_checks(g, s, op, 0);
  if (st == MOE_EP_OK) st = mep_nccl_stream_open(op->stream, "params->stream", &on);
  if (st == MOE_EP_OK) st = order_send(s, op, &on);
  if (st == MOE_EP_OK) st = order_reuse(g, s, op, &on);
  if (st == MOE_EP_OK) st = mep_nccl_note_capture(s->nccl, &on);
  if (st == MOE_EP_OK) st = send_half(g, s, op, 0);
  if (st == MOE_EP_OK) reuse_restart(s, op);
  if (st == MOE_EP_OK) st = mep_nccl_sent_record(&s->sent, op->buffer_set, &on);
  return mep_nccl_leave(&caller, st);
}

static moe_ep_status_t nccl_recv(moe_ep_group_t *g, mep_op_t *op) {
  nccl_state_t *s = g->impl;
  mep_nccl_caller_t caller;
  MEP_CHECK(enter_device(g, s, &caller));
  mep_nccl_stream_t on;
  moe_ep_status_t st = mep_nccl_stream_open(op->stream, "params->stream", &on);
  if (st == MOE_EP_OK) st = mep_nccl_note_capture(s->nccl, &on);
  if (st == MOE_EP_OK) st = mep_nccl_sent_order(&s->sent, op->buffer_set, &on);
  if (st != MOE_EP_OK) return mep_nccl_leave(&caller, st);
  if (op->kind == MEP_OP_DISPATCH) {
    mep_ll_dispatch_args_t a;
    dispatch_args(g, s, op, &a);
    st = mep_nccl_launched(g, mep_ll_dispatch_recv(&s->ctx, &a, op->stream), "dispatch receive");
  } else {
    mep_ll_combine_args_t a;
    combine_args(g, s, op, &a);
    st = mep_nccl_launched(g, mep_ll_combine_recv(&s->ctx, &a, op->stream), "combine receive");
    if (st == MOE_EP_OK) reuse_received(s, op);
  }
  if (st == MOE_EP_OK) st = mep_nccl_sent_record(&s->received, op->buffer_set, &on);
  return mep_nccl_leave(&caller, st);
}

static moe_ep_status_t nccl_send_recv(moe_ep_group_t *g, mep_op_t *op) {
  nccl_state_t *s = g->impl;
  mep_nccl_caller_t caller;
  MEP_CHECK(enter_device(g, s, &caller));
  mep_nccl_stream_t on;
  moe_ep_status_t st = send_checks(g, s, op, 1);
  if (st == MOE_EP_OK) st = mep_nccl_stream_open(op->stream, "params->stream", &on);
  if (st == MOE_EP_OK) st = order_send(s, op, &on);
  if (st == MOE_EP_OK) st = order_reuse(g, s, op, &on);
  if (st == MOE_EP_OK) st = mep_nccl_note_capture(s->nccl, &on);
  if (st == MOE_EP_OK) st = send_half(g, s, op, 1);
  if (st == MOE_EP_OK) reuse_restart(s, op);
  if (st == MOE_EP_OK) st = mep_nccl_sent_record(&s->received, op->buffer_set, &on);
  return mep_nccl_leave(&caller, st);
}

/* DeepEP's view of an LL handle's slots, from this set's handle storage
 * (one small kernel on `stream`); refused once a later dispatch took the
 * set over, as combine is. */
static moe_ep_status_t nccl_handle_layout(moe_ep_group_t *g, mep_handle_state_t *h,
                                          int32_t *src_info, int64_t *layout_range,
                                          void *stream) {
  nccl_state_t *s = g->impl;
  const nccl_handle_t *nh = h->backend;
  MEP_CHECK(mep_layout_book_check(&s->layouts, "handle_layout", g->rank, nh->set, nh->seq));
  mep_nccl_caller_t caller;
  MEP_CHECK(enter_device(g, s, &caller));
  const mep_ll_dims_t *d = &s->ctx.dims;
  /* After the dispatch receive that filled the storage and the set's last
   * export, whatever their streams: the set's event then covers every
   * export on it. */
  mep_nccl_stream_t on;
  moe_ep_status_t st = mep_nccl_stream_open(stream, "params->stream", &on);
  if (st == MOE_EP_OK) st = mep_nccl_note_capture(s->nccl, &on);
  if (st == MOE_EP_OK) st = mep_nccl_sent_order(&s->received, nh->set, &on);
  if (st == MOE_EP_OK) st = mep_nccl_sent_order(&s->exported, nh->set, &on);
  if (st != MOE_EP_OK) return mep_nccl_leave(&caller, st);
  st = mep_nccl_launched(g,
                         mep_ll_export_layout(s->slot_src[nh->set], s->src_count[nh->set],
                                              g->num_local_experts, d->world, d->max_tokens,
                                              src_info, layout_range, stream),
                         "handle_layout");
  if (st == MOE_EP_OK) st = mep_nccl_sent_record(&s->exported, nh->set, &on);
  return mep_nccl_leave(&caller, st);
}

/* LL reaches every peer over the group's one transport (ll_transport):
 * under auto, a group with a peer across NVLink domains runs GIN to its
 * near peers too, and one with a near peer on PCIe runs gin_emulated. */
static int nccl_peer_transport(const moe_ep_group_t *g, int peer) {
  const nccl_state_t *s = g->impl;
  if (peer == g->rank) return s->peer_transport[peer];
  switch (s->ctx.transport) {
    case MEP_LL_TRANSPORT_GIN:
      return MOE_EP_TRANSPORT_GIN;
    case MEP_LL_TRANSPORT_GIN_EMULATED:
      return MOE_EP_TRANSPORT_GIN_EMULATED;
    default:
      return MOE_EP_TRANSPORT_LSA;
  }
}

const mep_backend_ops_t mep_nccl_backend = {
    .name = "nccl",
    .abandon_is_safe = 0,
    .buffer_bytes = nccl_buffer_bytes,
    .create = nccl_create,
    .destroy = nccl_destroy,
    .prepare = nccl_prepare,
    .send = nccl_send,
    .recv = nccl_recv,
    .check_recv = mep_nccl_check_recv,
    .send_recv = nccl_send_recv,
    .poll_error = nccl_poll_error,
    .peer_transport = nccl_peer_transport,
    .handle_layout = nccl_handle_layout,
};
