/* host_backend.c: backend "host": the LL and HT protocols on host memory
 * across processes. Each token goes once to each destination rank (a row
 * carrying its local expert ids); the receiver fans rows out to expert
 * slots in (source rank, token) order, so layouts are deterministic. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/host/host_combine.h"
#include "kernels/host/host_rows.h"
#include "runtime/config.h"
#include "runtime/error.h"
#include "runtime/group.h"
#include "runtime/host/host_counts.h"
#include "runtime/host/host_layout.h"
#include "runtime/host/host_mesh.h"
#include "runtime/host/host_slots.h"
#include "runtime/host/host_state.h"
#include "runtime/nccl/layout_book.h"

/* The staging of one destination's rows before their put (host_create):
 * as much a communication buffer of the rank's as the region. */
static size_t staging_bytes(const moe_ep_config_t *cfg, const mep_host_layout_t *l) {
  return (size_t)cfg->max_tokens_per_rank * l->row_max;
}

/* What a group allocates for communication: the region and the staging. */
static uint64_t host_buffer_bytes(const moe_ep_config_t *cfg, int world) {
  mep_host_layout_t l;
  mep_host_layout_init(&l, cfg, world);
  return mep_host_layout_bytes(&l) + staging_bytes(cfg, &l);
}

static moe_ep_status_t host_destroy(moe_ep_group_t *g) {
  host_state_t *hs = g->impl;
  if (hs == NULL) return MOE_EP_OK;
  mep_host_mesh_destroy(hs->mesh);
  free(hs->staging);
  free(hs->counts);
  free(hs->recv_words);
  free(hs);
  g->impl = NULL;
  return MOE_EP_OK;
}

static moe_ep_status_t host_create(moe_ep_group_t *g) {
  host_state_t *hs = calloc(1, sizeof(*hs));
  if (hs == NULL) return mep_error(MOE_EP_ERR_NO_MEMORY, "host backend: out of memory");
  g->impl = hs;
  mep_host_layout_init(&hs->layout, &g->cfg, g->world_size);
  hs->staging = malloc(staging_bytes(&g->cfg, &hs->layout));
  hs->counts = calloc((size_t)g->world_size, sizeof(*hs->counts));
  hs->recv_words = calloc((size_t)g->world_size, sizeof(*hs->recv_words));
  if (hs->staging == NULL || hs->counts == NULL || hs->recv_words == NULL) {
    (void)host_destroy(g);
    return mep_error(MOE_EP_ERR_NO_MEMORY, "host backend: out of memory");
  }
  moe_ep_status_t st = mep_host_mesh_create(g->boot, mep_host_layout_bytes(&hs->layout),
                                            g->cfg.kernel_timeout_ms, &hs->mesh);
  if (st != MOE_EP_OK) (void)host_destroy(g);
  return st;
}

static int rank_of(const moe_ep_group_t *g, int64_t e) {
  return e < 0 ? -1 : (int)(e / g->num_local_experts);
}

/* How many distinct ranks below `d` token t's experts live on: the index of
 * d's partial result among t's destinations (HT combine order). */
static int ordinal_below(const moe_ep_group_t *g, const int64_t *topk, int k_n,
                         int d) {
  int n = 0;
  for (int k = 0; k < k_n; k++) {
    int r = rank_of(g, topk[k]);
    if (r < 0 || r >= d) continue;
    int seen = 0;
    for (int j = 0; j < k && !seen; j++) seen = rank_of(g, topk[j]) == r;
    n += !seen;
  }
  return n;
}

/* The distinct ranks token t's experts live on, ascending (the order of
 * its HT combine rows); returns how many. */
static int token_ranks(const moe_ep_group_t *g, const int64_t *topk, int k_n, int32_t *ranks) {
  int n = 0;
  for (int k = 0; k < k_n; k++) {
    int r = rank_of(g, topk[k]), at = n;
    if (r < 0 || r >= g->world_size) continue;
    int seen = 0;
    for (int j = 0; j < n && !seen; j++) seen = ranks[j] == r;
    if (seen) continue;
    while (at > 0 && ranks[at - 1] > r) {
      ranks[at] = ranks[at - 1];
      at--;
    }
    ranks[at] = r;
    n++;
  }
  return n;
}

/* HT prepare's count exchange: every rank's tokens per destination rank
 * (or its refusal); *num_recv: the rows this rank will receive. */
static moe_ep_status_t exchange_counts(moe_ep_group_t *g, const int32_t *mine,
                                       int64_t *num_recv) {
  int R = g->world_size;
  /* Numbered before anything can fail: a rank that joins no exchange here
   * has failed the group. */
  ((host_state_t *)g->impl)->exchanges++;
  int32_t *all = calloc((size_t)R * (size_t)R, sizeof(int32_t));
  if (all == NULL) {
    /* The peers fail their exchange naming this rank at once, so this
     * rank's group fails with theirs (MISMATCH, fatal: a NO_MEMORY would
     * read as "refused, group usable"). */
    (void)mep_bootstrap_fail_step(g->boot, MOE_EP_ERR_NO_MEMORY);
    return mep_error(MOE_EP_ERR_MISMATCH,
                     "prepare on rank %d: out of memory for the %d x %d count exchange; the "
                     "peers' exchange failed naming this rank, so the group fails on every rank",
                     g->rank, R, R);
  }
  moe_ep_status_t st = mep_bootstrap_allgather(g->boot, mine, all, (size_t)R * 4u);
  if (st != MOE_EP_OK) {
    mep_error_prefix("prepare: exchanging per-rank token counts");
  } else if (num_recv != NULL) {
    st = mep_host_count_table_read(all, R, g->rank, g->cfg.max_tokens_per_rank, num_recv);
  }
  free(all);
  return st;
}

static moe_ep_status_t host_prepare(moe_ep_group_t *g, mep_handle_state_t *h) {
  int R = g->world_size, K = h->top_k;
  int32_t per_rank[MEP_MAX_RANKS] = {0}; /* no allocation to fail before the count exchange */
  if (h->out_tokens_per_expert) {
    memset(h->out_tokens_per_expert, 0, (size_t)g->cfg.num_experts * 4u);
  }
  for (int t = 0; t < h->num_tokens; t++) {
    const int64_t *tk = h->topk_host + (size_t)t * (size_t)K;
    for (int d = 0; d < R; d++) {
      int hit = 0;
      for (int k = 0; k < K && !hit; k++) hit = rank_of(g, tk[k]) == d;
      per_rank[d] += hit;
      if (h->out_is_token_in_rank) h->out_is_token_in_rank[(size_t)t * R + d] = (uint8_t)hit;
    }
    for (int k = 0; k < K && h->out_tokens_per_expert; k++) {
      if (tk[k] >= 0) h->out_tokens_per_expert[tk[k]]++;
    }
  }
  if (h->out_tokens_per_rank) memcpy(h->out_tokens_per_rank, per_rank, (size_t)R * 4u);
  moe_ep_status_t st = MOE_EP_OK;
  if (g->cfg.mode == MOE_EP_MODE_HIGH_THROUGHPUT) {
    /* Each rank learns how many rows it will receive, so the engine can
     * size recv_x before dispatch. */
    int64_t num_recv = 0;
    st = exchange_counts(g, per_rank, &num_recv);
    h->num_recv = num_recv;
    h->prepare_no = ((host_state_t *)g->impl)->exchanges;
  }
  return st;
}

/* A prepare this rank refused before its count exchange still joins it,
 * its row all REFUSED_COUNT, so the peers' prepares fail naming it. */
static moe_ep_status_t host_prepare_refused(moe_ep_group_t *g) {
  if (g->cfg.mode != MOE_EP_MODE_HIGH_THROUGHPUT) return MOE_EP_OK;
  int32_t row[MEP_MAX_RANKS];
  for (int d = 0; d < g->world_size; d++) row[d] = MEP_HOST_REFUSED_COUNT;
  return exchange_counts(g, row, NULL);
}

static moe_ep_status_t dispatch_send(moe_ep_group_t *g, mep_op_t *op) {
  host_state_t *hs = g->impl;
  const mep_handle_state_t *h = op->handle;
  int R = g->world_size, K = h->top_k, E_l = g->num_local_experts;
  int32_t lids[MEP_MAX_TOP_K];
  mep_row_layout_t rl;
  mep_host_row_layout(op, &rl);
  const uint16_t *x = op->x;
  /* HT fp8: the engine's quantised rows and scales travel verbatim. */
  int ht = op->mode == MOE_EP_MODE_HIGH_THROUGHPUT;
  size_t s_row = mep_host_scale_row_bytes(op);
  for (int d = 0; d < R; d++) {
    int n = 0;
    for (int t = 0; t < h->num_tokens; t++) {
      const int64_t *tk = h->topk_host + (size_t)t * (size_t)K;
      int any = 0;
      for (int k = 0; k < K; k++) {
        lids[k] = rank_of(g, tk[k]) == d ? (int32_t)(tk[k] % E_l) : -1;
        any |= lids[k] >= 0;
      }
      if (!any) continue;
      const float *w = ht ? op->topk_weights + (size_t)t * (size_t)K : NULL;
      uint8_t *row = hs->staging + (size_t)n * rl.row_bytes;
      int ord = ordinal_below(g, tk, K, d);
      if (ht && op->fp8) {
        mep_row_pack_fp8(&rl, row, t, ord, lids, w,
                         (const uint8_t *)op->x + (size_t)t * (size_t)op->hidden,
                         (const uint8_t *)op->x_scales + (size_t)t * s_row, s_row);
      } else {
        mep_row_pack(&rl, row, t, ord, lids, w, x + (size_t)t * (size_t)op->hidden);
      }
      n++;
    }
    hs->counts[d][0] = (uint64_t)mep_host_row_desc(op) << 32 | (uint64_t)n;
    hs->counts[d][1] = h->prepare_no;
    size_t off = mep_host_off_dispatch_row(&hs->layout, op->buffer_set, g->rank,
                                           g->cfg.max_tokens_per_rank, 0, rl.row_bytes);
    MEP_CHECK(mep_host_mesh_put(hs->mesh, d, hs->staging, (size_t)n * rl.row_bytes, off));
    MEP_CHECK(mep_host_mesh_put(
        hs->mesh, d, hs->counts[d], MEP_HOST_COUNT_BYTES,
        mep_host_off_dispatch_count(&hs->layout, op->buffer_set, g->rank)));
    /* The staging buffer is reused for the next destination. */
    MEP_CHECK(mep_host_mesh_complete(hs->mesh, "dispatch"));
  }
  for (int d = 0; d < R; d++) {
    MEP_CHECK(mep_host_mesh_signal(
        hs->mesh, d, mep_host_off_dispatch_flag(&hs->layout, op->buffer_set, g->rank),
        op->seq + 1));
  }
  return mep_host_mesh_complete(hs->mesh, "dispatch");
}

static size_t flag_off(const host_state_t *hs, const mep_op_t *op, int combine, int src) {
  return combine ? mep_host_off_combine_flag(&hs->layout, op->buffer_set,
                                             mep_host_combine_half(&hs->layout, op->seq), src)
                 : mep_host_off_dispatch_flag(&hs->layout, op->buffer_set, src);
}

/* Every source's signal of this operation, or its refusal of it
 * (host_op_refused); then the first source that refused is named. Every
 * source is waited for first, so the operation ends for this rank as it
 * does without refusals. A source already past this operation (MISMATCH)
 * is named only once the others are in: when some rank refused the
 * operation, every other rank's call of it failed at once and may have
 * gone on to its next operation, on this set when it has only one, before
 * this rank read its signal; this rank reads no rows of a refused
 * operation, so the refusal is what it reports. */
static moe_ep_status_t wait_all(moe_ep_group_t *g, mep_op_t *op, int combine) {
  host_state_t *hs = g->impl;
  const char *kind = combine ? "combine" : "dispatch";
  char what[64];
  snprintf(what, sizeof what, "%s (operation %llu, buffer set %d)", kind,
           (unsigned long long)op->seq, op->buffer_set);
  int refused_by = -1, refusals = 0, ahead = 0;
  char ahead_msg[MEP_ERROR_MAX];
  for (int s = 0; s < g->world_size; s++) {
    int refused = 0;
    moe_ep_status_t st = mep_host_mesh_wait_either(
        hs->mesh, flag_off(hs, op, combine, s),
        mep_host_off_refusal(&hs->layout, op->buffer_set, combine, s), op->seq + 1, s, what,
        &refused);
    /* Every peer ahead is passed over alike (with one buffer set, all the
     * peers of a refused operation may be ahead): the first is named if no
     * source refused. */
    if (st == MOE_EP_ERR_MISMATCH) {
      if (!ahead) snprintf(ahead_msg, sizeof ahead_msg, "%s", mep_last_error());
      ahead = 1;
      continue;
    }
    if (st != MOE_EP_OK) {
      /* The first cause: a peer ahead, unless some rank refused. */
      if (ahead && refusals == 0) return mep_error(MOE_EP_ERR_MISMATCH, "%s", ahead_msg);
      return st;
    }
    if (refused && refusals++ == 0) refused_by = s;
  }
  if (ahead && refused_by < 0) return mep_error(MOE_EP_ERR_MISMATCH, "%s", ahead_msg);
  /* Every peer made this operation: none still reads an earlier refusal of
   * this rank's on this set. */
  memset(hs->refusal_unread[op->buffer_set], 0, sizeof hs->refusal_unread[op->buffer_set]);
  if (refused_by >= 0) {
    char more[48] = "";
    if (refusals > 1) snprintf(more, sizeof more, " (and %d more ranks)", refusals - 1);
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "%s on rank %d: rank %d%s refused its own call of this %s (operation %llu; "
                     "its error says why), so this call wrote none of its outputs; the group "
                     "stays usable",
                     kind, g->rank, refused_by, more, kind, (unsigned long long)op->seq);
  }
  return MOE_EP_OK;
}

/* host_abandon, host_op_refused: every peer has signalled the operation
 * this rank did not receive (an abandoned combine, or one it refused) or a
 * later one. A peer that ran something else there is out of step; its next
 * wait says so, this one need not. */
static moe_ep_status_t wait_owed(moe_ep_group_t *g) {
  host_state_t *hs = g->impl;
  char what[96];
  snprintf(what, sizeof what, "operation %llu (which this rank did not receive)",
           (unsigned long long)(hs->owed - 1));
  for (int s = 0; s < g->world_size; s++) {
    MEP_CHECK(mep_host_mesh_wait_progress(hs->mesh, hs->owed, s, what));
  }
  hs->owed = 0;
  return MOE_EP_OK;
}

static moe_ep_status_t combine_send(moe_ep_group_t *g, mep_op_t *op) {
  host_state_t *hs = g->impl;
  const slot_table_t *tab = op->handle->backend;
  int W = mep_host_combine_width(g, op);
  const int half = mep_host_combine_half(&hs->layout, op->seq);
  size_t row_bytes = (size_t)op->hidden * 2u;
  int64_t slots = (int64_t)g->world_size * g->cfg.max_tokens_per_rank;
  /* LL records are grouped by expert (expert_start); HT records are the
   * received rows in order. */
  int e = 0;
  for (int64_t i = 0; i < tab->n; i++) {
    const int32_t *rec = tab->rec[i];
    size_t y_row = (size_t)i;
    if (op->mode == MOE_EP_MODE_LOW_LATENCY) {
      while (tab->expert_start[e + 1] <= i) e++;
      y_row = (size_t)e * (size_t)slots + (size_t)(i - tab->expert_start[e]);
    }
    const uint16_t *y = (const uint16_t *)op->y + y_row * (size_t)op->hidden;
    size_t row = (size_t)rec[1] * (size_t)W + (size_t)rec[2];
    MEP_CHECK(mep_host_mesh_put(hs->mesh, rec[0], y, row_bytes,
                                mep_host_off_combine_row(&hs->layout, op->buffer_set, half, row)));
  }
  for (int s = 0; s < g->world_size; s++) {
    MEP_CHECK(mep_host_mesh_signal(
        hs->mesh, s, mep_host_off_combine_dispatch(&hs->layout, op->buffer_set, half, g->rank),
        tab->seq + 1));
    MEP_CHECK(mep_host_mesh_signal(hs->mesh, s, flag_off(hs, op, 1, g->rank), op->seq + 1));
  }
  return mep_host_mesh_complete(hs->mesh, "combine");
}

/* Every source's combine returns the rows of the dispatch this rank's
 * handle holds: ranks that combine different layer calls at the same
 * operation (two micro-batches in another order) would sum rows of other
 * tokens without a word. Refused before any output is written; every rank
 * took part in the operation, so the group stays usable. */
static moe_ep_status_t check_same_dispatch(moe_ep_group_t *g, const mep_op_t *op, int half) {
  host_state_t *hs = g->impl;
  const slot_table_t *tab = op->handle->backend;
  uint8_t *local = mep_host_mesh_local(hs->mesh);
  for (int s = 0; s < g->world_size; s++) {
    const uint64_t theirs = __atomic_load_n(
        (const uint64_t *)(local +
                           mep_host_off_combine_dispatch(&hs->layout, op->buffer_set, half, s)),
        __ATOMIC_ACQUIRE);
    if (theirs == tab->seq + 1) continue;
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "combine on rank %d: rank %d's combine (operation %llu) returned the rows "
                     "of its dispatch operation %llu, this rank's handle those of operation "
                     "%llu; every rank must combine the same layer call at the same operation "
                     "(the group stays usable)",
                     g->rank, s, (unsigned long long)op->seq,
                     (unsigned long long)(theirs - 1), (unsigned long long)tab->seq);
  }
  return MOE_EP_OK;
}

static moe_ep_status_t combine_recv(moe_ep_group_t *g, mep_op_t *op) {
  host_state_t *hs = g->impl;
  const mep_handle_state_t *h = op->handle;
  int K = h->top_k, W = mep_host_combine_width(g, op);
  const int half = mep_host_combine_half(&hs->layout, op->seq);
  const uint16_t *rows[MEP_MAX_TOP_K];
  MEP_CHECK(wait_all(g, op, 1));
  MEP_CHECK(check_same_dispatch(g, op, half));
  for (int t = 0; t < h->num_tokens; t++) {
    const int64_t *tk = h->topk_host + (size_t)t * (size_t)K;
    uint16_t *out = (uint16_t *)op->out + (size_t)t * (size_t)op->hidden;
    int n = op->mode == MOE_EP_MODE_LOW_LATENCY ? K : ordinal_below(g, tk, K, g->world_size);
    for (int j = 0; j < n; j++) {
      int used = op->mode == MOE_EP_MODE_HIGH_THROUGHPUT || tk[j] >= 0;
      rows[j] = used ? (const uint16_t *)(mep_host_mesh_local(hs->mesh) +
                                          mep_host_off_combine_row(&hs->layout, op->buffer_set,
                                                                   half,
                                                                   (size_t)t * (size_t)W + (size_t)j))
                     : NULL;
    }
    if (op->mode == MOE_EP_MODE_LOW_LATENCY) {
      /* The GPU pre-reduces per expert rank (weights at dispatch, or
       * pushed at combine) or sums the slots' rows in the same rank order;
       * here every slot's row came back, and the same partials are formed
       * on this side, in the same order, so the bits agree. */
      int32_t ranks[MEP_MAX_TOP_K];
      for (int k = 0; k < K; k++) ranks[k] = rank_of(g, tk[k]);
      mep_combine_partials(out, rows, op->topk_weights + (size_t)t * (size_t)K, ranks, K,
                           op->hidden);
    } else {
      /* HT: per node of ranks_per_node first when it is set (the nccl
       * backend's relays reduce their node's rows), then across nodes. */
      int32_t ranks[MEP_MAX_TOP_K];
      (void)token_ranks(g, tk, K, ranks); /* n of them: ordinal_below's count */
      mep_combine_sum(out, rows, ranks, n, g->cfg.ranks_per_node, op->hidden);
    }
  }
  return MOE_EP_OK;
}

/* Takes the refused operation's place: the refusal word of its kind,
 * which ends every peer's wait for this rank's signal of the operation
 * (wait_all). No rows are sent, and the operation's flags are left alone:
 * a peer may still be about to read them for the set's previous operation,
 * which this rank, having waited for nothing, does not know. The next send
 * first waits for every peer's signal of this operation (owed), the order
 * its receive of it would have given (as for an abandoned combine). As
 * host_send, it first waits for what is owed. A refused dispatch replaced
 * no layout here, so it is not recorded in the layout book: where every
 * rank refused it (the same bad argument everywhere), the earlier handle
 * on its set still combines; where only this rank did, its peers' sends
 * replaced theirs, and this rank's combine of that handle meets their
 * refusals and fails naming them, its own layout intact. */
static moe_ep_status_t host_op_refused(moe_ep_group_t *g, const mep_op_t *op) {
  host_state_t *hs = g->impl;
  const int combine = op->kind == MEP_OP_COMBINE;
  mep_host_mesh_begin(hs->mesh);
  if (hs->owed != 0) MEP_CHECK(wait_owed(g));
  /* This set's refusal word of this kind may still hold an earlier
   * refusal that a slow peer's receive has yet to read (with one buffer
   * set, the operation just before this one): overwritten first, that
   * peer would see a later operation and fail with MISMATCH. A peer makes
   * an operation on a set only after its receives on that set have run
   * (or were abandoned), so its signal of the set's next operation after
   * the refused one says it is done with it. That operation is at most
   * this one; when it is this one, a peer that refused the earlier one
   * too (and may itself be here, waiting for this rank) never reads this
   * rank's word of it, which its own refusal word shows: every peer's
   * signal of that operation has landed (wait_owed above). */
  uint64_t *unread = &hs->refusal_unread[op->buffer_set][combine];
  if (*unread != 0) {
    const uint64_t next_on_set = *unread + (uint64_t)hs->layout.nsets;
    char what[80];
    snprintf(what, sizeof what, "%s (operation %llu, refused after an earlier refusal)",
             combine ? "combine" : "dispatch", (unsigned long long)op->seq);
    for (int s = 0; s < g->world_size; s++) {
      if (s == g->rank) continue;
      const uint64_t *theirs = (const uint64_t *)(mep_host_mesh_local(hs->mesh) +
                                                  mep_host_off_refusal(&hs->layout, op->buffer_set,
                                                                       combine, s));
      if (__atomic_load_n(theirs, __ATOMIC_ACQUIRE) >= *unread) continue;
      MEP_CHECK(mep_host_mesh_wait_progress(hs->mesh, next_on_set, s, what));
    }
  }
  *unread = op->seq + 1;
  /* Itself too: its signals to itself are its progress, which the next
   * send's wait for what is owed counts like any peer's. */
  for (int d = 0; d < g->world_size; d++) {
    moe_ep_status_t st = mep_host_mesh_signal(
        hs->mesh, d, mep_host_off_refusal(&hs->layout, op->buffer_set, combine, g->rank),
        op->seq + 1);
    if (st == MOE_EP_ERR_NO_MEMORY) { /* some peers have the refusal, others wait for it */
      return mep_error_suffix(MOE_EP_ERR_INTERNAL, "rank %d's refusal reached only some peers",
                              g->rank);
    }
    MEP_CHECK(st);
  }
  MEP_CHECK(mep_host_mesh_complete(hs->mesh, combine ? "combine (refused)" : "dispatch (refused)"));
  if (op->seq + 1 > hs->owed) hs->owed = op->seq + 1;
  return MOE_EP_OK;
}

/* Before a dispatch reuses its buffer set while this rank's receive of the
 * combine of the set's last dispatch is still to run (two-batch overlap's
 * order: dispatch A, combine A, dispatch B, then combine A's hook): a peer
 * may still be reading dispatch A there. Each peer's signal of that
 * combine (or its refusal of it, which a rank with a hook pending does not
 * send) comes after its receive of dispatch A; the flags stay for the
 * combine's receive (the halves keep the next combine's apart). */
static moe_ep_status_t wait_reuse(moe_ep_group_t *g, const mep_op_t *op) {
  host_state_t *hs = g->impl;
  if (!hs->reuse[op->buffer_set].sent || hs->reuse[op->buffer_set].received) return MOE_EP_OK;
  const mep_op_t comb = {.kind = MEP_OP_COMBINE, .seq = hs->reuse[op->buffer_set].comb_seq,
                         .buffer_set = hs->reuse[op->buffer_set].comb_set};
  char what[112];
  snprintf(what, sizeof what, "dispatch (operation %llu, reusing buffer set %d after combine %llu)",
           (unsigned long long)op->seq, op->buffer_set, (unsigned long long)comb.seq);
  for (int s = 0; s < g->world_size; s++) {
    if (s == g->rank) continue;
    int refused = 0;
    MEP_CHECK(mep_host_mesh_wait_either(hs->mesh, flag_off(hs, &comb, 1, s),
                                        mep_host_off_refusal(&hs->layout, comb.buffer_set, 1, s),
                                        comb.seq + 1, s, what, &refused));
  }
  return MOE_EP_OK;
}

/* Before a dispatch writes its buffer set: every peer has read this rank's
 * previous dispatch there (its read word), or refused that dispatch (its
 * refusal word: it reads nothing). Usually a combine between the two has
 * ordered them already (each peer signals it after its dispatch receive);
 * this covers a second dispatch with none between (a cached dispatch
 * again on one buffer set, a dispatch receive a peer abandoned), where a
 * fast rank's rows would otherwise land while a slow peer still reads the
 * previous ones. A peer answers after its receive, which needs nothing of
 * this rank's after that dispatch, so waiting here cannot close a
 * cycle. */
static moe_ep_status_t wait_read(moe_ep_group_t *g, const mep_op_t *op) {
  host_state_t *hs = g->impl;
  const uint64_t due = hs->read_due[op->buffer_set];
  if (due == 0) return MOE_EP_OK;
  char what[112];
  snprintf(what, sizeof what, "dispatch (operation %llu, buffer set %d, after dispatch %llu there)",
           (unsigned long long)op->seq, op->buffer_set, (unsigned long long)(due - 1));
  for (int s = 0; s < g->world_size; s++) {
    if (s == g->rank) continue; /* its own receive ran first (the set was not busy) */
    MEP_CHECK(mep_host_mesh_wait_read(hs->mesh,
                                      mep_host_off_dispatch_read(&hs->layout, op->buffer_set, s),
                                      mep_host_off_refusal(&hs->layout, op->buffer_set, 0, s),
                                      due, s, what));
  }
  return MOE_EP_OK;
}

/* This rank is done reading the sources' rows of dispatch `op` (it read
 * them, or will not): each source may write the set again (wait_read).
 * Quiet: the receive's own status is what the caller reports. */
static void say_read(moe_ep_group_t *g, const mep_op_t *op) {
  host_state_t *hs = g->impl;
  for (int s = 0; s < g->world_size; s++) {
    if (s == g->rank) continue;
    mep_host_mesh_signal_quiet(hs->mesh, s,
                               mep_host_off_dispatch_read(&hs->layout, op->buffer_set, g->rank),
                               op->seq + 1);
  }
}

/* The combine of operation `seq` was received (or its receive abandoned,
 * which the owed wait stands in for): no dispatch waits for it any more. */
static void reuse_received(host_state_t *hs, uint64_t seq) {
  for (int i = 0; i < MEP_NUM_BUFFER_SETS; i++)
    if (hs->reuse[i].sent && hs->reuse[i].comb_seq == seq) hs->reuse[i].received = 1;
}

/* A later dispatch on the handle's buffer set replaced its layout (the
 * header's promise, as on the nccl backend): combine is refused before
 * anything is sent, so the group stays usable. */
static moe_ep_status_t host_send(moe_ep_group_t *g, mep_op_t *op) {
  host_state_t *hs = g->impl;
  if (op->kind == MEP_OP_COMBINE) {
    const slot_table_t *tab = op->handle->backend;
    MEP_CHECK(mep_layout_book_check(&hs->book, "combine", g->rank, tab->set, tab->seq));
  }
  mep_host_mesh_begin(hs->mesh);
  if (hs->owed != 0) MEP_CHECK(wait_owed(g));
  if (op->kind == MEP_OP_DISPATCH) {
    MEP_CHECK(wait_reuse(g, op));
    MEP_CHECK(wait_read(g, op));
  }
  moe_ep_status_t st =
      op->kind == MEP_OP_COMBINE
          ? combine_send(g, op)
          : mep_layout_book_record(&hs->book, op->buffer_set, op->seq, dispatch_send(g, op));
  if (st == MOE_EP_OK && op->kind == MEP_OP_DISPATCH) {
    hs->reuse[op->buffer_set].sent = 0;
    hs->read_due[op->buffer_set] = op->seq + 1;
  } else if (st == MOE_EP_OK) {
    const slot_table_t *tab = op->handle->backend;
    hs->reuse[tab->set].comb_seq = op->seq;
    hs->reuse[tab->set].comb_set = op->buffer_set;
    hs->reuse[tab->set].sent = 1;
    hs->reuse[tab->set].received = 0;
  }
  /* Out of memory queueing a put or signal: some peers may already have
   * part of the operation, and the others wait for it; no retry can mend
   * that, so the group fails (a NO_MEMORY would read as "group usable"). */
  if (st == MOE_EP_ERR_NO_MEMORY) {
    st = mep_error_suffix(MOE_EP_ERR_INTERNAL,
                          "rank %d's %s was cut short, so its peers hold part of it: the group "
                          "fails",
                          g->rank, op->kind == MEP_OP_COMBINE ? "combine" : "dispatch");
  }
  /* The combine sends straight from the caller's y: none of its sends may
   * outlive the failed call. Cutting the endpoints fails the group. */
  const int cut = st != MOE_EP_OK ? mep_host_mesh_quiesce(hs->mesh) : 0;
  if (cut != 0 && !mep_status_is_fatal(st)) {
    st = mep_error_suffix(MOE_EP_ERR_INTERNAL,
                          "rank %d cancelled the sends still in flight, which leaves the group "
                          "unusable",
                          g->rank);
  }
  if (cut == 2) {
    /* A combine sends from the caller's y; a dispatch only from the
     * group's own staging. */
    st = op->kind == MEP_OP_COMBINE
             ? mep_error_suffix(st,
                                "some of rank %d's cancelled sends had not ended within the "
                                "bound: UCX may read this combine's y until group_destroy, so "
                                "keep it alive until that returns",
                                g->rank)
             : mep_error_suffix(st,
                                "some of rank %d's cancelled sends had not ended within the "
                                "bound; they read only the group's own buffers, freed by "
                                "group_destroy",
                                g->rank);
  }
  return st;
}

static moe_ep_status_t recv_half(moe_ep_group_t *g, mep_op_t *op) {
  if (op->kind == MEP_OP_COMBINE) {
    reuse_received(g->impl, op->seq);
    return combine_recv(g, op);
  }
  moe_ep_status_t st = wait_all(g, op, 0);
  if (st == MOE_EP_OK) st = mep_host_dispatch_read(g, op);
  /* Read, or refused: either way this rank reads no more of it. */
  say_read(g, op);
  if (st != MOE_EP_OK) return st;
  slot_table_t *tab = op->handle->backend;
  tab->set = op->buffer_set;
  tab->seq = op->seq;
  return MOE_EP_OK;
}

static moe_ep_status_t host_recv(moe_ep_group_t *g, mep_op_t *op) {
  mep_host_mesh_t *mesh = ((host_state_t *)g->impl)->mesh;
  mep_host_mesh_begin(mesh);
  moe_ep_status_t st = recv_half(g, op);
  mep_host_mesh_reads_done(mesh);
  return st;
}

/* The layout is the handle's own slot table here; the book still refuses
 * it once the dispatch's buffer set was reused, as on the GPU (whose layout
 * lives in the set). */
static moe_ep_status_t host_handle_layout(moe_ep_group_t *g, mep_handle_state_t *h,
                                          int32_t *src_info, int64_t *layout_range,
                                          void *stream) {
  host_state_t *hs = g->impl;
  const slot_table_t *tab = h->backend;
  MEP_CHECK(mep_layout_book_check(&hs->book, "handle_layout", g->rank, tab->set, tab->seq));
  mep_slot_table_layout(tab, g->world_size, (int64_t)g->world_size * g->cfg.max_tokens_per_rank,
                        src_info, layout_range);
  return MOE_EP_OK;
}

/* A combine's receive is what orders this rank's next writes after every
 * peer's reads of the dispatch before it (each peer signals its combine
 * only after its dispatch receive; buffer sets alternate per operation, so
 * the next dispatch writes the set that dispatch used). When that receive
 * is abandoned, the next send waits for each peer to have signalled that
 * combine instead, or a fast rank could overwrite rows a slow one is still
 * reading. An abandoned
 * dispatch receive tells its sources it is done reading (say_read); its
 * peers' combine of it then waits for this rank's combine, which never
 * comes, and reports it. */
static void host_abandon(moe_ep_group_t *g, const mep_op_t *op) {
  host_state_t *hs = g->impl;
  /* The latest such combine: its wait covers the earlier ones (hooks may
   * be freed in any order). It orders the next send after every peer's
   * progress past it, which stands in for its receive in wait_reuse too. */
  if (op->kind == MEP_OP_COMBINE && op->seq + 1 > hs->owed) hs->owed = op->seq + 1;
  if (op->kind == MEP_OP_COMBINE) reuse_received(hs, op->seq);
  /* This rank will not read that dispatch's rows: the sources may write
   * the set again. */
  if (op->kind == MEP_OP_DISPATCH) say_read(g, op);
}

static moe_ep_status_t host_poll_error(moe_ep_group_t *g) { return MOE_EP_OK; }

static int host_peer_transport(const moe_ep_group_t *g, int peer) {
  return MOE_EP_TRANSPORT_UCX_HOST;
}

const mep_backend_ops_t mep_host_backend = {
    .name = "host",
    .abandon_is_safe = 1,
    .abandon = host_abandon,
    .buffer_bytes = host_buffer_bytes,
    .create = host_create,
    .destroy = host_destroy,
    .prepare = host_prepare,
    .prepare_refused = host_prepare_refused,
    .op_refused = host_op_refused,
    .send = host_send,
    .recv = host_recv,
    .poll_error = host_poll_error,
    .peer_transport = host_peer_transport,
    .handle_layout = host_handle_layout,
};
