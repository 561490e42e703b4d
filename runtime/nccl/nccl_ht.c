/* nccl_ht.c: backend "nccl" in high-throughput mode: prefill dispatch and
 * combine on GPUs over LSA (NVLink stores) through bounded rings
 * (kernels/ht/). Each operation is one fused kernel; a deferred receive
 * only orders the caller's stream after it, and, without
 * MOE_EP_FLAG_WORST_CASE, a dispatch's receive waits for the kernel to
 * learn N_recv (the one documented host sync). */
#include <cuda_runtime_api.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ht/ht.h"
#include "kernels/ht/ht_layout.h"
#include "kernels/ll/ll.h" /* the LSA resolver and the timeout conversion */
#include "runtime/config.h"
#include "runtime/error.h"
#include "runtime/group.h"
#include "runtime/nccl/kernel_load.h"
#include "runtime/nccl/layout_book.h"
#include "runtime/nccl/nccl_common.h"
#include "runtime/nccl/nccl_setup.h"
#include "runtime/nccl/pinned_pool.h"
#include "runtime/nccl/nccl_wait.h"
#include "runtime/nccl/row_shape.h"

/* SMs an HT group uses until set_num_sms says otherwise: engines give
 * communication about 24 SMs while experts compute. */
#define MEP_HT_DEFAULT_SMS 24

typedef struct ht_state {
  mep_nccl_t *nccl;
  mep_ht_ctx_t ctx;
  mep_error_record_t *rec; /* [0] fatal, [1] notice (host-mapped) */
  int device;
  int device_sms;
  int64_t *num_recv;          /* host-mapped [MEP_NUM_BUFFER_SETS] */
  int64_t *num_recv_dev;
  mep_layout_book_t layouts;
  /* Recorded after each send half (only sends launch kernels). */
  mep_nccl_sent_t sent;
  /* Recorded just before each send half: when its stream reached it, so
   * the row-count wait can tell the engine's earlier work from the
   * kernel's own. */
  mep_nccl_sent_t reached;
} ht_state_t;

/* What a handle remembers of its dispatch (h->backend). */
typedef struct ht_handle {
  int32_t set;
  int32_t channels; /* the dispatch's token split, which combine repeats */
  uint64_t seq;
} ht_handle_t;

/* Ranks per node for the kernels (mep_ht_dims_t.node_ranks): 0 for an
 * NVLink-only group; with a network transport the config's ranks_per_node,
 * else for gin_emulated 1 (every rank a node of its own: every peer takes
 * the network protocol) and for gin the NVLink (LSA) team's size, which
 * create checks against the peers NCCL reaches by NVLink. */
static int32_t ht_node_ranks(const moe_ep_config_t *cfg, int world, int32_t lsa_size) {
  if (cfg->transport == MOE_EP_TRANSPORT_GIN_EMULATED) {
    return cfg->ranks_per_node > 0 ? cfg->ranks_per_node : 1;
  }
  if (cfg->transport == MOE_EP_TRANSPORT_GIN) {
    if (cfg->ranks_per_node > 0) return cfg->ranks_per_node;
    return lsa_size > 0 && world % lsa_size == 0 ? lsa_size : 1;
  }
  return 0;
}

/* lsa_size: the LSA team's size where known (create), else 0; sizing with
 * 0 gives a gin group's window for one rank per node, the largest. */
static void ht_dims(const moe_ep_config_t *cfg, int world, int32_t lsa_size, mep_ht_dims_t *d) {
  memset(d, 0, sizeof(*d));
  d->world = world;
  d->local_experts = cfg->num_experts / world;
  d->max_tokens = cfg->max_tokens_per_rank;
  d->hidden = cfg->hidden;
  d->top_k = cfg->top_k;
  d->node_ranks = ht_node_ranks(cfg, world, lsa_size);
  /* The combine's sum order follows the config alone, so that the host
   * backend (which has no NVLink team to ask) sums alike. */
  d->sum_by_node = d->node_ranks > 0 && cfg->ranks_per_node > 0;
}

static uint64_t ht_buffer_bytes(const moe_ep_config_t *cfg, int world) {
  mep_ht_dims_t d;
  ht_dims(cfg, world, 0, &d);
  return mep_ht_buffer_bytes(&d);
}

static void raise_abort(void *ctx, cudaStream_t stream) {
  /* a refused copy is not left pending as the engine's CUDA error */
  if (mep_ht_raise_abort((const mep_ht_ctx_t *)ctx, stream) != MEP_KSTATUS_OK)
    (void)cudaGetLastError();
}

/* abort: the group failed, or this rank stops setting up while its peers
 * go on (mep_nccl_destroy aborts the communicator instead of a collective
 * teardown). As nccl_backend.c's nccl_release: the abort flag for a
 * failed group's kernels, a bounded wait for the group's last kernels
 * (only send halves launch any), then frees that do not wait for the
 * whole device. */
static moe_ep_status_t ht_release(moe_ep_group_t *g, int abort) {
  ht_state_t *s = g->impl;
  if (s == NULL) return MOE_EP_OK;
  moe_ep_status_t st = MOE_EP_OK;
  int ended = 1;
  if (s->device >= 0 && s->nccl != NULL) {
    (void)mep_nccl_make_current(s->device);
    const mep_nccl_sent_t *last[1] = {&s->sent};
    ended = mep_nccl_quiesce(g, s->nccl, last, 1,
                             abort && s->ctx.state != NULL ? raise_abort : NULL, &s->ctx, &st);
  }
  mep_nccl_sent_destroy(&s->sent);
  mep_nccl_sent_destroy(&s->reached);
  if (ended) {
    mep_nccl_free(s->nccl, s->ctx.state);
    mep_pinned_give(s->num_recv);
    mep_nccl_free_records(s->rec);
  }
  st = mep_nccl_release(g, s->nccl, ended, abort, st);
  free(s);
  g->impl = NULL;
  return st;
}

static moe_ep_status_t ht_teardown(moe_ep_group_t *g) {
  return ht_release(g, g->broken != MOE_EP_OK);
}

static moe_ep_status_t ht_destroy(moe_ep_group_t *g) { return mep_nccl_as_caller(ht_teardown, g); }

static moe_ep_status_t alloc_device(ht_state_t *s) {
  MEP_CHECK(mep_nccl_alloc_zeroed(s->nccl, &s->ctx.state, mep_ht_state_bytes(&s->ctx.dims),
                                  "allocating and zeroing the HT device state"));
  MEP_CHECK(mep_nccl_alloc_records(&s->rec, &s->ctx.error_dev));
  s->ctx.notice_dev = s->ctx.error_dev + 1;
  MEP_CHECK(mep_pinned_take(MEP_NUM_BUFFER_SETS * sizeof(int64_t), (void **)&s->num_recv,
                            (void **)&s->num_recv_dev, "received row counts"));
  MEP_CHECK(mep_nccl_sent_create(&s->reached));
  return mep_nccl_sent_create(&s->sent);
}

/* The node split must match NVLink: every peer on this rank's node must
 * be in its NVLink (LSA) team, since the kernels store into those; with
 * gin, every peer off the node must be outside it (those get puts, and a
 * split that puts NVLink peers on other nodes is a configuration mistake).
 * An NVLink-only group (node_ranks 0) needs every peer in the team. */
static moe_ep_status_t check_transport(const moe_ep_group_t *g, const ht_state_t *s) {
  const int32_t n = s->ctx.dims.node_ranks;
  int32_t *nv = calloc((size_t)g->world_size, sizeof(int32_t));
  if (nv == NULL) return mep_error(MOE_EP_ERR_NO_MEMORY, "group_create: out of memory");
  mep_nccl_peer_nvlink(s->nccl, nv, g->world_size);
  int bad = -1;
  for (int p = 0; p < g->world_size && bad < 0; p++) {
    const int near = n == 0 || p / n == g->rank / n;
    if (near ? !nv[p] : (g->cfg.transport == MOE_EP_TRANSPORT_GIN && nv[p])) bad = p;
  }
  free(nv);
  if (bad < 0) return MOE_EP_OK;
  if (n == 0) {
    return mep_error(MOE_EP_ERR_UNSUPPORTED,
                     "group_create on rank %d: rank %d is not reachable over NVLink (LSA); "
                     "mode 'high_throughput' crosses nodes with transport 'gin', not '%s'",
                     g->rank, bad, g->cfg.transport == MOE_EP_TRANSPORT_LSA ? "lsa" : "auto");
  }
  const int on = bad / n == g->rank / n;
  return mep_error(MOE_EP_ERR_UNSUPPORTED,
                   "group_create on rank %d: ranks_per_node %d puts rank %d %s this rank's "
                   "node, but it is %s this rank's NVLink (LSA) team; set ranks_per_node to "
                   "the ranks that share an NVLink domain", g->rank, n, bad, on ? "on" : "off",
                   on ? "outside" : "inside");
}

static moe_ep_status_t ht_create_here(moe_ep_group_t *g);

static moe_ep_status_t ht_create(moe_ep_group_t *g) { return mep_nccl_as_caller(ht_create_here, g); }

static moe_ep_status_t ht_create_here(moe_ep_group_t *g) {
  ht_state_t *s = calloc(1, sizeof(*s));
  if (s == NULL) return mep_error(MOE_EP_ERR_NO_MEMORY, "group_create: out of memory");
  g->impl = s;
  s->device = -1;
  moe_ep_status_t st;
  MEP_CHECK_GOTO(mep_nccl_pick_device(g, &s->device, &s->device_sms), st, out_destroy);
  /* Sized before NCCL reports the LSA team: one rank per node at most. */
  ht_dims(&g->cfg, g->world_size, 0, &s->ctx.dims);
  mep_nccl_params_t np = {
      .rank = g->rank,
      .world = g->world_size,
      .cuda_device = s->device,
      .transport = g->cfg.transport,
      .window_bytes = mep_ht_buffer_bytes(&s->ctx.dims),
      .gin_signal_count = mep_ht_gin_signals(&s->ctx.dims),
      .adopt_comm = g->nccl_comm,
      .exchange = mep_nccl_share_uid,
      .exchange_user = g->boot,
      .timeout_ms = g->cfg.bootstrap_timeout_ms,
  };
  MEP_CHECK_GOTO(mep_nccl_create(&np, &s->nccl), st, out_destroy);
  MEP_CHECK_GOTO(mep_nccl_group_load_kernels(g, s->device, mep_ht_load, "HT"), st, out_destroy);
  ht_dims(&g->cfg, g->world_size, mep_nccl_lsa_size(s->nccl), &s->ctx.dims);
  MEP_CHECK_GOTO(check_transport(g, s), st, out_destroy);
  s->ctx.transport = g->cfg.transport == MOE_EP_TRANSPORT_GIN ? MEP_HT_TRANSPORT_GIN
                     : g->cfg.transport == MOE_EP_TRANSPORT_GIN_EMULATED
                         ? MEP_HT_TRANSPORT_GIN_EMULATED
                         : MEP_HT_TRANSPORT_LSA;
  if ((st = alloc_device(s)) != MOE_EP_OK) {
    mep_error_prefix("group_create on rank %d", g->rank);
    goto out_destroy;
  }
  s->ctx.dev_comm = mep_nccl_dev_comm(s->nccl);
  s->ctx.window = mep_nccl_window(s->nccl);
  s->ctx.window_local = mep_nccl_window_local(s->nccl);
  s->ctx.window_bytes = mep_nccl_bytes_allocated(s->nccl);
  s->ctx.rank = g->rank;
  MEP_CHECK_GOTO(mep_nccl_resolve_lsa(s->nccl, g->rank, &s->ctx.lsa_base, &s->ctx.lsa_stride,
                                      &s->ctx.lsa_local),
                 st, out_destroy);
  if (mep_ll_timeout_cycles(s->device, g->cfg.kernel_timeout_ms, &s->ctx.timeout_cycles) !=
      MEP_KSTATUS_OK) {
    st = mep_error(MOE_EP_ERR_CUDA, "group_create on rank %d: %s", g->rank,
                   mep_kernels_last_error());
    goto out_destroy;
  }
  /* The default stays the backend's: set_num_sms(0) returns to it. */
  g->default_sms = s->device_sms < MEP_HT_DEFAULT_SMS ? s->device_sms : MEP_HT_DEFAULT_SMS;
  g->bytes_allocated = mep_nccl_bytes_allocated(s->nccl);
  return MOE_EP_OK;
out_destroy:;
  /* The failed step's sentence is the one to report, not the teardown's. */
  mep_error_saved_t failed;
  mep_error_save(&failed);
  (void)ht_release(g, 1); /* the peers go on to the closing agreement */
  mep_error_restore(&failed);
  return st;
}

static const char *ht_op_name(int op) {
  switch (op) {
    case MEP_HT_OP_DISPATCH_COUNTS: return "HT dispatch kernel, waiting for a count word from";
    case MEP_HT_OP_DISPATCH_SPACE: return "HT dispatch kernel, waiting for ring space at";
    case MEP_HT_OP_DISPATCH_RECV: return "HT dispatch kernel, waiting for rows from";
    case MEP_HT_OP_COMBINE_SPACE: return "HT combine kernel, waiting for ring space at";
    case MEP_HT_OP_COMBINE_RECV: return "HT combine kernel, waiting for rows from";
    default: return "HT kernel, waiting for";
  }
}

/* What two ranks whose channel counts differ broke. */
static const char kSameChannels[] =
    "every rank of a high-throughput group must call set_num_sms with the same value, on "
    "devices alike in SM count below 32 (which caps the channels); destroy the group";

/* A kernel's fatal record, as a sentence. */
static moe_ep_status_t record_error(const moe_ep_group_t *g, const mep_error_record_t *r) {
  if (r->op == MEP_HT_OP_CHANNELS && r->peer < 0) {
    /* Combine's own check of the layout its dispatch left (no peer). */
    return mep_error(MOE_EP_ERR_INTERNAL,
                     "an HT combine kernel on rank %d was launched with %llu channels but its "
                     "dispatch's layout has %llu; destroy the group",
                     r->rank, (unsigned long long)r->expected, (unsigned long long)r->seen);
  }
  if (r->op == MEP_HT_OP_CHANNELS) {
    return mep_error(MOE_EP_ERR_MISMATCH,
                     "an HT kernel on rank %d split its tokens into %llu channels but rank %d "
                     "used %llu (count word %#llx): %s",
                     r->rank, (unsigned long long)r->expected, r->peer,
                     (unsigned long long)MEP_HT_CNT_CHAN(r->seen),
                     (unsigned long long)r->seen, kSameChannels);
  }
  if (r->op == MEP_HT_OP_CHANNEL_UNSENT) {
    return mep_error(MOE_EP_ERR_MISMATCH,
                     "an HT dispatch kernel on rank %d split its tokens into %llu channels but "
                     "rank %d sent count words on fewer (its signal counted this call on a "
                     "channel whose count word carries tag %u instead, word %#llx): %s",
                     r->rank, (unsigned long long)r->expected, r->peer,
                     (unsigned)MEP_HT_CNT_TAG(r->seen), (unsigned long long)r->seen,
                     kSameChannels);
  }
  if (r->op == MEP_HT_OP_RELAY_WORD) {
    return mep_error(MOE_EP_ERR_INTERNAL,
                     "an HT dispatch kernel on rank %d, relaying for rank %d, found its node word "
                     "of another call (tag %u, word %#llx; this call's tag is %llu) although its "
                     "count words were this call's: the ranks disagree on ranks_per_node, or "
                     "the relay protocol broke; destroy the group",
                     r->rank, r->peer, (unsigned)MEP_HT_CNT_TAG(r->seen),
                     (unsigned long long)r->seen, (unsigned long long)r->expected);
  }
  if (r->op == MEP_HT_OP_ROW_DESC) {
    return mep_ht_row_desc_fatal(r->rank, r->peer, (uint32_t)r->expected, (uint32_t)r->seen);
  }
  if (r->peer < 0) { /* a block's wait on its warps' rows of every source (mep_ht_wait_block) */
    return mep_error(MOE_EP_ERR_TIMEOUT,
                     "the %s every rank, on rank %d, saw no progress for 4 x "
                     "timeouts.kernel_ms=%d (expected %llu rows, saw %llu): a peer did not take "
                     "part in the operation",
                     ht_op_name(r->op), r->rank, g->cfg.kernel_timeout_ms,
                     (unsigned long long)r->expected, (unsigned long long)r->seen);
  }
  return mep_error(MOE_EP_ERR_TIMEOUT,
                   "the %s rank %d, on rank %d, waited timeouts.kernel_ms=%d (expected %llu, "
                   "saw %llu): the peer did not take part in the operation",
                   ht_op_name(r->op), r->peer, r->rank, g->cfg.kernel_timeout_ms,
                   (unsigned long long)r->expected, (unsigned long long)r->seen);
}

static moe_ep_status_t fatal_status(const moe_ep_group_t *g, const ht_state_t *s) {
  return mep_nccl_record_ready(&s->rec[0]) ? record_error(g, &s->rec[0]) : MOE_EP_OK;
}

/* A routing notice (MEP_HT_OP_BAD_ROUTING), reported once (the record is
 * cleared): the dispatch ran with the slot as -1, and the group stays
 * usable. */
static moe_ep_status_t routing_notice(const moe_ep_group_t *g, ht_state_t *s) {
  mep_error_record_t *r = &s->rec[1];
  if (!mep_nccl_record_ready(r)) return MOE_EP_OK;
  const moe_ep_status_t st = mep_nccl_bad_routing(g, r);
  __atomic_store_n(&r->flag, 0, __ATOMIC_RELEASE);
  return st;
}

static moe_ep_status_t ht_poll_error(moe_ep_group_t *g) {
  MEP_CHECK(fatal_status(g, g->impl));
  return routing_notice(g, g->impl);
}

static moe_ep_status_t enter(moe_ep_group_t *g, ht_state_t *s, mep_nccl_caller_t *caller) {
  MEP_CHECK(fatal_status(g, s));
  MEP_CHECK(mep_nccl_enter(s->device, caller));
  s->ctx.num_sms = g->num_sms > 0 ? g->num_sms : g->default_sms;
  return MOE_EP_OK;
}

static moe_ep_status_t ht_prepare(moe_ep_group_t *g, mep_handle_state_t *h) {
  ht_state_t *s = g->impl;
  MEP_CHECK(fatal_status(g, s));
  h->num_recv = -1; /* learnt by the dispatch kernel's count exchange */
  return mep_nccl_prepare_layout(g, s->nccl, s->device, h);
}


static moe_ep_status_t launch_dispatch(moe_ep_group_t *g, ht_state_t *s, mep_op_t *op) {
  mep_handle_state_t *h = op->handle;
  ht_handle_t *hh = h->backend; /* made by ht_send before anything was queued */
  mep_ht_dispatch_args_t a = {
      .x = op->x,
      .x_scales = op->x_scales,
      .fp8 = op->fp8,
      .scale_words = mep_fp8_scale_words(op->hidden, op->fp8 ? op->scale_format : -1),
      .scale_mode = op->scale_format, /* MEP_FP8_SCALE_* keep moe_ep's numbers */
      .topk_idx = h->topk_idx,
      .topk_idx_bytes = h->topk_idx_bits / 8,
      .num_tokens = h->num_tokens,
      .hidden = op->hidden,
      .top_k = h->top_k,
      .num_experts = g->cfg.num_experts,
      .buffer_set = op->buffer_set,
      .topk_weights = op->topk_weights,
      .recv_x = op->recv_x,
      .recv_scales = op->recv_scales,
      .recv_topk_idx = op->recv_topk_idx,
      .recv_topk_weights = op->recv_topk_weights,
      .recv_count = op->recv_count,
      .recv_capacity = op->recv_capacity,
      .pad = (op->flags & MOE_EP_FLAG_WORST_CASE) != 0,
      .num_recv = s->num_recv_dev + op->buffer_set,
  };
  s->num_recv[op->buffer_set] = -1;
  moe_ep_status_t st = mep_layout_book_record(
      &s->layouts, op->buffer_set, op->seq,
      mep_nccl_launched(g, mep_ht_dispatch(&s->ctx, &a, op->stream), "dispatch"));
  if (st == MOE_EP_OK) {
    hh->set = op->buffer_set;
    hh->seq = op->seq;
    hh->channels = mep_ht_channels(&s->ctx);
  }
  return st;
}

static moe_ep_status_t launch_combine(moe_ep_group_t *g, ht_state_t *s, mep_op_t *op) {
  const mep_handle_state_t *h = op->handle;
  const ht_handle_t *hh = h->backend; /* its layout checked by ht_send */
  mep_ht_combine_args_t a = {
      .y = op->y,
      .topk_idx = h->topk_idx,
      .topk_idx_bytes = h->topk_idx_bits / 8,
      .num_tokens = h->num_tokens,
      .hidden = op->hidden,
      .top_k = h->top_k,
      .num_experts = g->cfg.num_experts,
      .layout_set = hh->set,
      .channels = hh->channels,
      .out = op->out,
  };
  return mep_nccl_launched(g, mep_ht_combine(&s->ctx, &a, op->stream), "combine");
}

/* A dispatch without MOE_EP_FLAG_WORST_CASE learns N_recv on the host (a
 * stream synchronisation), which a CUDA graph capture forbids: CUDA would
 * refuse the sync and invalidate the capture, failing the group. Refused
 * while nothing has run on op->stream (the send's, or the hook's). */
static moe_ep_status_t check_capturable(const moe_ep_group_t *g, const mep_op_t *op,
                                        const mep_nccl_stream_t *on, const char *entry) {
  if (op->kind != MEP_OP_DISPATCH || (op->flags & MOE_EP_FLAG_WORST_CASE)) return MOE_EP_OK;
  if (on->capture == 0) return MOE_EP_OK;
  return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                   "%s on rank %d: the stream is capturing a CUDA graph but params->flags=0x%x "
                   "lacks MOE_EP_FLAG_WORST_CASE; without it a high-throughput dispatch learns "
                   "its received token count on the host, a stream synchronisation that capture "
                   "forbids",
                   entry, g->rank, (unsigned)op->flags);
}

static moe_ep_status_t ht_send(moe_ep_group_t *g, mep_op_t *op) {
  ht_state_t *s = g->impl;
  mep_nccl_caller_t caller;
  MEP_CHECK(enter(g, s, &caller));
  mep_nccl_stream_t on;
  moe_ep_status_t st = mep_nccl_stream_open(op->stream, "params->stream", &on);
  if (st == MOE_EP_OK) st = check_capturable(g, op, &on, "dispatch");
  /* The handle's state before anything is queued: running out of memory
   * later would leave waits and an event record on the engine's stream. */
  if (st == MOE_EP_OK && op->kind == MEP_OP_DISPATCH && op->handle->backend == NULL &&
      (op->handle->backend = calloc(1, sizeof(ht_handle_t))) == NULL) {
    st = mep_error(MOE_EP_ERR_NO_MEMORY, "dispatch on rank %d: out of host memory", g->rank);
  }
  if (st == MOE_EP_OK && op->kind == MEP_OP_COMBINE) {
    /* Refused before anything is queued for the call. */
    const ht_handle_t *hh = op->handle->backend;
    st = mep_layout_book_check(&s->layouts, "combine", g->rank, hh->set, hh->seq);
  }
  /* After every set's last send, whatever its stream: the kernels share
   * the group's epoch and ring positions, so one runs after the other
   * (free on one stream; two-batch overlap with a stream per micro-batch
   * runs them in turn), and the set's event covers every kernel on the
   * set (teardown waits for it). */
  if (st == MOE_EP_OK) st = mep_nccl_note_capture(s->nccl, &on);
  for (int set = 0; st == MOE_EP_OK && set < MEP_NUM_BUFFER_SETS; set++)
    st = mep_nccl_sent_order(&s->sent, set, &on);
  if (st == MOE_EP_OK) st = mep_nccl_sent_record(&s->reached, op->buffer_set, &on);
  if (st == MOE_EP_OK)
    st = op->kind == MEP_OP_DISPATCH ? launch_dispatch(g, s, op) : launch_combine(g, s, op);
  if (st == MOE_EP_OK) st = mep_nccl_sent_record(&s->sent, op->buffer_set, &on);
  return mep_nccl_leave(&caller, st);
}

/* N_recv reaches the host: wait for the dispatch kernel (the documented
 * sync of a dispatch without MOE_EP_FLAG_WORST_CASE), polling events
 * (cudaStreamSynchronize has no bound, and would wait for the engine's
 * later work on the stream too). First until the stream reached the
 * dispatch, within bootstrap.timeout_ms (the engine's earlier work), then
 * until the kernel ended, within 4 x timeouts.kernel_ms (its waits give up
 * after kernel_ms each, a block's after four without progress). */
static moe_ep_status_t learn_num_recv(moe_ep_group_t *g, ht_state_t *s, mep_op_t *op) {
  const int set = op->buffer_set;
  /* A thread that captures a graph on any stream may not wait on the GPU
   * (check_capturable saw only params->stream): every query would be
   * refused until the bound, so the call is refused at once. */
  const cudaError_t first = mep_nccl_event_query((cudaEvent_t)s->reached.event[set]);
  if (mep_nccl_query_refused_by_capture(first)) {
    (void)cudaGetLastError(); /* not sticky: the engine's next check is not to find it */
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "dispatch on rank %d: this thread is capturing a CUDA graph (on another "
                     "stream than params->stream), where CUDA refuses the host wait that "
                     "learns N_recv (%s); make the dispatch outside the capture, or with "
                     "MOE_EP_FLAG_WORST_CASE. Its rows were received and dropped on this rank "
                     "alone: every rank must skip this layer call's combine",
                     g->rank, cudaGetErrorString(first));
  }
  if (!mep_nccl_await_event(s->reached.event[set], g->cfg.bootstrap_timeout_ms)) {
    return mep_error(MOE_EP_ERR_TIMEOUT,
                     "dispatch on rank %d: its stream had not reached the dispatch kernel "
                     "within bootstrap.timeout_ms=%d (earlier work on the stream has not "
                     "ended)", g->rank, g->cfg.bootstrap_timeout_ms);
  }
  const int bound_ms = 4 * g->cfg.kernel_timeout_ms;
  if (!mep_nccl_await_event(s->sent.event[set], bound_ms)) {
    MEP_CHECK(fatal_status(g, s)); /* the kernel's own sentence, if it wrote one */
    return mep_error(MOE_EP_ERR_TIMEOUT,
                     "dispatch on rank %d: its kernel had not ended %d ms (4 x "
                     "timeouts.kernel_ms) after it could start; the GPU is stuck",
                     g->rank, bound_ms);
  }
  cudaError_t e = mep_nccl_event_query((cudaEvent_t)s->sent.event[set]);
  if (e != cudaSuccess) return mep_nccl_cuda_error("the dispatch kernel", e);
  MEP_CHECK(fatal_status(g, s));
  const int64_t n = __atomic_load_n(&s->num_recv[set], __ATOMIC_ACQUIRE);
  if (n < -1) { /* a source's rows laid out otherwise: drained unread, every rank refuses */
    return mep_ht_refused_error(
        g->rank, n, mep_row_desc(op->hidden, op->handle->top_k, op->fp8, op->scale_format));
  }
  if (n < 0) { /* the host's -1 from before the launch: a kernel that gave up unrecorded */
    return mep_error(MOE_EP_ERR_INTERNAL,
                     "dispatch on rank %d: the dispatch kernel ended without reporting its "
                     "received row count (its waits were aborted); destroy the group",
                     g->rank);
  }
  /* Checked here, for this call (a notice from the kernel would outlive a
   * dispatch whose hook was freed unrun and be blamed on the next one). */
  if (n > op->recv_capacity) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "dispatch on rank %d received %lld rows but params->recv_x holds %lld; "
                     "the rows were dropped (size recv_x by world_size * max_tokens_per_rank, "
                     "or by prepare's num_tokens_per_rank summed over the sources), and every "
                     "rank must skip this layer call's combine",
                     g->rank, (long long)n, (long long)op->recv_capacity);
  }
  op->handle->num_recv = n;
  if (op->num_recv_tokens != NULL) *op->num_recv_tokens = n;
  return MOE_EP_OK;
}

/* hook_run's checks before the hook counts as run: its stream, and a
 * dispatch without MOE_EP_FLAG_WORST_CASE (a host sync) in a capture. */
static moe_ep_status_t ht_check_recv(moe_ep_group_t *g, const mep_op_t *op) {
  mep_nccl_caller_t caller;
  MEP_CHECK(mep_nccl_enter(g->cuda_device, &caller));
  mep_nccl_stream_t on;
  moe_ep_status_t st = mep_nccl_stream_open(op->stream, "stream", &on);
  if (st == MOE_EP_OK) st = check_capturable(g, op, &on, "hook_run of a dispatch");
  return mep_nccl_leave(&caller, st);
}

static moe_ep_status_t ht_recv(moe_ep_group_t *g, mep_op_t *op) {
  ht_state_t *s = g->impl;
  mep_nccl_caller_t caller;
  MEP_CHECK(enter(g, s, &caller));
  /* hook_run asked ht_check_recv first; a dispatch's own receive (not
   * deferred) comes after ht_send's check_capturable. */
  mep_nccl_stream_t on;
  moe_ep_status_t st = mep_nccl_stream_open(op->stream, "params->stream", &on);
  if (st == MOE_EP_OK) st = mep_nccl_note_capture(s->nccl, &on);
  if (st == MOE_EP_OK) st = mep_nccl_sent_order(&s->sent, op->buffer_set, &on);
  if (st == MOE_EP_OK && op->kind == MEP_OP_DISPATCH) {
    if (op->flags & MOE_EP_FLAG_WORST_CASE) {
      /* No sync: combine's y then has recv_x's rows. num_recv keeps what a
       * dispatch of this layout learnt (the same routing, the same count),
       * which a cached dispatch's recv_x is checked against. */
      op->handle->worst_rows = op->recv_capacity;
      if (op->num_recv_tokens != NULL) *op->num_recv_tokens = -1;
    } else {
      st = learn_num_recv(g, s, op);
    }
  }
  return mep_nccl_leave(&caller, st);
}

static int ht_peer_transport(const moe_ep_group_t *g, int peer) {
  const ht_state_t *s = g->impl;
  const int32_t n = s->ctx.dims.node_ranks;
  if (n == 0 || peer / n == g->rank / n) return MOE_EP_TRANSPORT_LSA;
  return g->cfg.transport; /* gin or gin_emulated */
}

const mep_backend_ops_t mep_nccl_ht_backend = {
    .name = "nccl",
    .abandon_is_safe = 1, /* the receive half moves no data */
    .max_ranks = MEP_HT_MAX_RANKS, /* one warp group per peer in each block */
    .buffer_bytes = ht_buffer_bytes,
    .create = ht_create,
    .destroy = ht_destroy,
    .prepare = ht_prepare,
    .send = ht_send,
    .recv = ht_recv,
    .check_recv = ht_check_recv,
    .poll_error = ht_poll_error,
    .peer_transport = ht_peer_transport,
};
