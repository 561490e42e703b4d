/* host_dispatch_rows.c: a dispatch's rows on the host backend, as
 * received: their format word, the checks of every field a peer wrote,
 * and the fan-out into the operation's outputs (LL: per local expert, in
 * (source rank, token) order; HT: packed by source rank, then token).
 * Peers write the region from the mesh's progress thread, so each source's
 * count word and each row's header are read once and only those copies
 * are used. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/common/row_desc.h"
#include "runtime/error.h"
#include "runtime/host/host_slots.h"
#include "runtime/host/host_state.h"
#include "runtime/row_desc_text.h"
#include "runtime/validate.h"

size_t mep_host_scale_row_bytes(const mep_op_t *op) {
  return (size_t)mep_fp8_scale_words(op->hidden, op->scale_format) * 4u;
}

void mep_host_row_layout(const mep_op_t *op, mep_row_layout_t *rl) {
  /* Only LL quantises here (HT's fp8 rows come quantised). */
  int pow2 = mep_op_scale_format(op) != MOE_EP_FP8_SCALE_F32;
  mep_row_layout_init(rl, op->hidden, op->handle->top_k, op->fp8, pow2);
}

/* What one call's rows look like, sent in the upper half of each count
 * word: a receiver parses a source's rows with its own call's layout, so a
 * peer that made the call with another hidden, top_k or row format would
 * be read at the wrong stride (rows silently wrong, or a header read out
 * of a payload). The description is the nccl kernels' one
 * (kernels/common/row_desc.h); bit 31 marks a word that carries one, since
 * a description may be 0 (hidden=8, top_k=1, bf16). */
#define ROW_DESC_SET (1u << 31)
#define ROW_DESC_MASK ((1u << MEP_ROW_DESC_BITS) - 1u)

uint32_t mep_host_row_desc(const mep_op_t *op) {
  return ROW_DESC_SET |
         mep_row_desc(op->hidden, op->handle->top_k, op->fp8, mep_op_scale_format(op));
}

static void row_desc_text(uint32_t d, char *out, size_t len) {
  if ((d & ~ROW_DESC_MASK) != ROW_DESC_SET) {
    snprintf(out, len, "no row description (0x%08x)", (unsigned)d);
    return;
  }
  mep_row_desc_text(d & ROW_DESC_MASK, out, len);
}
static const uint8_t *source_row(host_state_t *hs, const moe_ep_group_t *g,
                                 const mep_op_t *op, const mep_row_layout_t *rl,
                                 int s, int i) {
  return mep_host_mesh_local(hs->mesh) +
         mep_host_off_dispatch_row(&hs->layout, op->buffer_set, s,
                                   g->cfg.max_tokens_per_rank, i, rl->row_bytes);
}

int mep_host_combine_width(const moe_ep_group_t *g, const mep_op_t *op) {
  int K = op->handle->top_k;
  if (op->mode == MOE_EP_MODE_LOW_LATENCY) return K;
  return K < g->world_size ? K : g->world_size;
}

/* Each source's count entry, read once into recv_words. */
static void read_count_words(moe_ep_group_t *g, const mep_op_t *op) {
  host_state_t *hs = g->impl;
  for (int s = 0; s < g->world_size; s++) {
    const uint64_t *entry =
        (const uint64_t *)(mep_host_mesh_local(hs->mesh) +
                           mep_host_off_dispatch_count(&hs->layout, op->buffer_set, s));
    for (int i = 0; i < 2; i++) hs->recv_words[s][i] = __atomic_load_n(&entry[i], __ATOMIC_ACQUIRE);
  }
}

static int64_t source_count(const host_state_t *hs, int s) {
  return (int64_t)(hs->recv_words[s][0] & 0xffffffffu);
}

/* One row's header, copied out of the region and checked; every use of a
 * header field reads such a copy, so a field that changes under the reader
 * cannot index past what was checked. */
typedef struct row_head {
  int32_t token, ordinal;
  int32_t lids[MEP_MAX_TOP_K];
} row_head_t;

static int read_head(const uint8_t *row, int K, int M, int width, int E_l, row_head_t *h) {
  h->token = mep_row_token(row);
  h->ordinal = mep_row_ordinal(row);
  memcpy(h->lids, mep_row_lids(row), (size_t)K * sizeof(int32_t));
  int ok = h->token >= 0 && h->token < M && h->ordinal >= 0 && h->ordinal < width;
  for (int k = 0; k < K && ok; k++) ok = h->lids[k] >= -1 && h->lids[k] < E_l;
  return ok;
}

/* A row that passed check_rows and failed at its use: a peer's puts of a
 * later operation landed while this rank read the set. */
static moe_ep_status_t rows_changed(const moe_ep_group_t *g, const mep_op_t *op, int s) {
  return mep_error(MOE_EP_ERR_INTERNAL,
                   "dispatch on rank %d: rank %d's rows in buffer set %d changed while this "
                   "rank read them (operation %llu): a later operation's data landed before "
                   "this rank had read the set",
                   g->rank, s, op->buffer_set, (unsigned long long)op->seq);
}

/* Every source made this call with this rank's hidden, top_k and row
 * format, or the call is refused naming the first that did not. Every
 * rank's signals of it are in and no row is read, so the group stays
 * usable; each rank whose sources differ refuses alike. */
static moe_ep_status_t check_descs(moe_ep_group_t *g, const mep_op_t *op) {
  host_state_t *hs = g->impl;
  const uint32_t mine = mep_host_row_desc(op);
  for (int s = 0; s < g->world_size; s++) {
    const uint32_t theirs = (uint32_t)(hs->recv_words[s][0] >> 32);
    if (theirs == mine) continue;
    char a[96], b[96];
    row_desc_text(theirs, a, sizeof a);
    row_desc_text(mine, b, sizeof b);
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "dispatch on rank %d: rank %d made this call with %s, this rank with %s; "
                     "every rank must make a call with the same hidden, top_k and row format "
                     "(no rows were read; the group stays usable)",
                     g->rank, s, a, b);
  }
  return MOE_EP_OK;
}

/* HT: every source dispatched the layer call of this rank's handle, the
 * one whose count exchange told this rank how many rows to expect (and
 * the engine how large recv_x must be), or the call is refused naming the
 * first that did not. Rows of another call may fit recv_x or not, and
 * would be read as this call's; a receiver refuses before reading any. */
static moe_ep_status_t check_layer_call(moe_ep_group_t *g, const mep_op_t *op) {
  host_state_t *hs = g->impl;
  const uint64_t mine = op->handle->prepare_no;
  for (int s = 0; s < g->world_size; s++) {
    const uint64_t theirs = hs->recv_words[s][1];
    if (theirs == mine) continue;
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "dispatch on rank %d: rank %d dispatched the layer call of its prepare "
                     "number %llu, this rank the one of its prepare number %llu (the group's "
                     "prepares are numbered in the order every rank makes them); every rank "
                     "must dispatch the same layer call (no rows were read; the group stays "
                     "usable)",
                     g->rank, s, (unsigned long long)theirs, (unsigned long long)mine);
  }
  return MOE_EP_OK;
}

/* Rows come from another process: check every field that becomes an index
 * or an offset here before using any of them. */
static moe_ep_status_t check_rows(moe_ep_group_t *g, const mep_op_t *op,
                                  const mep_row_layout_t *rl, int width) {
  host_state_t *hs = g->impl;
  int M = g->cfg.max_tokens_per_rank, K = op->handle->top_k, E_l = g->num_local_experts;
  row_head_t head;
  for (int s = 0; s < g->world_size; s++) {
    int64_t n = source_count(hs, s);
    if (n < 0 || n > M) {
      return mep_error(MOE_EP_ERR_INTERNAL,
                       "dispatch on rank %d: rank %d announced %lld rows, more than "
                       "max_tokens_per_rank=%d (corrupt or mismatched peer)",
                       g->rank, s, (long long)n, M);
    }
    for (int64_t i = 0; i < n; i++) {
      if (!read_head(source_row(hs, g, op, rl, s, (int)i), K, M, width, E_l, &head)) {
        return mep_error(MOE_EP_ERR_INTERNAL,
                         "dispatch on rank %d: row %lld from rank %d is malformed (token %d, "
                         "ordinal %d, or a local expert outside [-1, %d))",
                         g->rank, (long long)i, s, head.token, head.ordinal, E_l);
      }
    }
  }
  return MOE_EP_OK;
}

static moe_ep_status_t dispatch_recv_ll(moe_ep_group_t *g, mep_op_t *op,
                                        const mep_row_layout_t *rl) {
  host_state_t *hs = g->impl;
  int R = g->world_size, K = op->handle->top_k, E_l = g->num_local_experts;
  int M = g->cfg.max_tokens_per_rank, W = mep_host_combine_width(g, op);
  int64_t total = 0;
  row_head_t head;
  memset(op->recv_count, 0, (size_t)E_l * 4u);
  for (int s = 0; s < R; s++) {
    for (int64_t i = 0; i < source_count(hs, s); i++) {
      if (!read_head(source_row(hs, g, op, rl, s, (int)i), K, M, W, E_l, &head))
        return rows_changed(g, op, s);
      for (int k = 0; k < K; k++) {
        if (head.lids[k] >= 0) op->recv_count[head.lids[k]]++, total++;
      }
    }
  }
  int64_t slots = (int64_t)R * g->cfg.max_tokens_per_rank;
  for (int e = 0; e < E_l; e++) {
    if (op->recv_count[e] > slots) {
      return mep_error(MOE_EP_ERR_INTERNAL,
                       "dispatch on rank %d: local expert %d would receive %d rows, more than "
                       "its %lld slots (a peer sent one token to an expert twice)",
                       g->rank, e, op->recv_count[e], (long long)slots);
    }
  }
  slot_table_t *tab = mep_slot_table_new(total, E_l);
  if (tab == NULL) return mep_error(MOE_EP_ERR_NO_MEMORY, "dispatch: out of memory");
  tab->expert_start[0] = 0;
  for (int e = 0; e < E_l; e++) tab->expert_start[e + 1] = tab->expert_start[e] + op->recv_count[e];
  size_t x_row = rl->fp8 ? (size_t)op->hidden : (size_t)op->hidden * 2u;
  int packed = op->scale_format == MOE_EP_FP8_SCALE_UE8M0_PACKED;
  size_t s_row = mep_host_scale_row_bytes(op);
  int32_t *cursor = calloc((size_t)E_l, sizeof(int32_t));
  if (cursor == NULL) {
    free(tab);
    return mep_error(MOE_EP_ERR_NO_MEMORY, "dispatch: out of memory");
  }
  moe_ep_status_t st = MOE_EP_OK;
  for (int s = 0; s < R && st == MOE_EP_OK; s++) {
    for (int64_t i = 0; i < source_count(hs, s) && st == MOE_EP_OK; i++) {
      const uint8_t *row = source_row(hs, g, op, rl, s, (int)i);
      if (!read_head(row, K, M, W, E_l, &head)) st = rows_changed(g, op, s);
      for (int k = 0; k < K && st == MOE_EP_OK; k++) {
        int e = head.lids[k];
        if (e < 0) continue;
        if (cursor[e] >= op->recv_count[e]) {
          st = rows_changed(g, op, s); /* more rows name e than the first pass counted */
          break;
        }
        int slot = cursor[e]++;
        size_t flat = (size_t)e * (size_t)slots + (size_t)slot;
        mep_row_unpack_ll(rl, row, (uint8_t *)op->recv_x + flat * x_row,
                          rl->fp8 ? (uint8_t *)op->recv_scales + flat * s_row : NULL,
                          packed);
        int32_t *rec = tab->rec[tab->expert_start[e] + slot];
        rec[0] = s;
        rec[1] = head.token;
        rec[2] = k;
      }
    }
  }
  /* Fewer rows naming an expert than the first pass counted leave slots
   * (and their records) unwritten. */
  for (int e = 0; e < E_l && st == MOE_EP_OK; e++) {
    if (cursor[e] != op->recv_count[e]) {
      st = mep_error(MOE_EP_ERR_INTERNAL,
                     "dispatch on rank %d: the rows in buffer set %d changed while this rank "
                     "read them (operation %llu): local expert %d was named by %d rows, then "
                     "by %d",
                     g->rank, op->buffer_set, (unsigned long long)op->seq, e,
                     op->recv_count[e], cursor[e]);
    }
  }
  free(cursor);
  if (st != MOE_EP_OK) {
    free(tab);
    return st;
  }
  free(op->handle->backend);
  op->handle->backend = tab;
  return MOE_EP_OK;
}

static moe_ep_status_t dispatch_recv_ht(moe_ep_group_t *g, mep_op_t *op,
                                        const mep_row_layout_t *rl) {
  host_state_t *hs = g->impl;
  int R = g->world_size, K = op->handle->top_k, E_l = g->num_local_experts;
  int M = g->cfg.max_tokens_per_rank, W = mep_host_combine_width(g, op);
  row_head_t head;
  int64_t total = 0;
  for (int s = 0; s < R; s++) total += source_count(hs, s);
  if (total > op->recv_capacity) {
    return mep_error(MOE_EP_ERR_INTERNAL,
                     "dispatch on rank %d: received %lld rows but recv_x holds %lld (prepare "
                     "announced %lld: a peer sent rows its count exchange did not)",
                     g->rank, (long long)total, (long long)op->recv_capacity,
                     (long long)op->handle->num_recv);
  }
  slot_table_t *tab = mep_slot_table_new(total, E_l);
  if (tab == NULL) return mep_error(MOE_EP_ERR_NO_MEMORY, "dispatch: out of memory");
  memset(op->recv_count, 0, (size_t)E_l * 4u);
  size_t x_row = rl->fp8 ? (size_t)op->hidden : (size_t)op->hidden * 2u;
  size_t s_row = rl->fp8 ? mep_host_scale_row_bytes(op) : 0;
  int64_t n = 0;
  for (int s = 0; s < R; s++) {
    for (int64_t i = 0; i < source_count(hs, s); i++, n++) {
      const uint8_t *row = source_row(hs, g, op, rl, s, (int)i);
      if (!read_head(row, K, M, W, E_l, &head)) {
        free(tab);
        return rows_changed(g, op, s);
      }
      const int32_t *lids = head.lids;
      const float *w = mep_row_weights(rl, row);
      mep_row_unpack_ht(rl, row, (uint8_t *)op->recv_x + (size_t)n * x_row,
                        rl->fp8 ? (uint8_t *)op->recv_scales + (size_t)n * s_row : NULL,
                        s_row);
      for (int k = 0; k < K; k++) {
        op->recv_topk_idx[n * K + k] = lids[k];
        op->recv_topk_weights[n * K + k] = lids[k] >= 0 ? w[k] : 0.0f;
        if (lids[k] >= 0) op->recv_count[lids[k]]++;
      }
      tab->rec[n][0] = s;
      tab->rec[n][1] = head.token;
      tab->rec[n][2] = head.ordinal;
    }
  }
  /* Worst-case sizing: the rows past the receive name no expert, so a
   * fixed-size consumer (a captured graph) can run over every row. */
  for (int64_t r = n; (op->flags & MOE_EP_FLAG_WORST_CASE) && r < op->recv_capacity; r++) {
    for (int k = 0; k < K; k++) {
      op->recv_topk_idx[r * K + k] = -1;
      op->recv_topk_weights[r * K + k] = 0.0f;
    }
  }
  if (op->num_recv_tokens != NULL) *op->num_recv_tokens = n;
  op->handle->num_recv = n;
  free(op->handle->backend);
  op->handle->backend = tab;
  return MOE_EP_OK;
}
moe_ep_status_t mep_host_dispatch_read(moe_ep_group_t *g, mep_op_t *op) {
  mep_row_layout_t rl;
  mep_host_row_layout(op, &rl);
  read_count_words(g, op);
  MEP_CHECK(check_descs(g, op));
  if (op->mode == MOE_EP_MODE_HIGH_THROUGHPUT) MEP_CHECK(check_layer_call(g, op));
  MEP_CHECK(check_rows(g, op, &rl, mep_host_combine_width(g, op)));
  return op->mode == MOE_EP_MODE_LOW_LATENCY ? dispatch_recv_ll(g, op, &rl)
                                             : dispatch_recv_ht(g, op, &rl);
}
