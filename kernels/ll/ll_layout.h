/* ll_layout.h: byte layout of the LL symmetric buffer (two buffer sets) and
 * of the LL device state. Plain C, shared by the launchers, the kernels and
 * the runtime's sizing, so every rank computes the same offsets. */
#ifndef MEP_LL_LAYOUT_H_
#define MEP_LL_LAYOUT_H_

#include <stddef.h>
#include <stdint.h>

#include "kernels/common/limits.h"
#include "kernels/common/row_desc.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __CUDACC__
#define MEP_HD __host__ __device__
#else
#define MEP_HD
#endif

static inline MEP_HD uint64_t mep_ll_align16(uint64_t x) { return (x + 15u) & ~(uint64_t)15u; }
/* Line partials' 128-byte lines must not straddle a 128-byte boundary (a
 * line is delivered whole only as one aligned 128-byte store): comb_recv
 * starts on one and every set's size is a multiple of 128, so each set
 * (set_off = set * set_bytes) starts on one too; the window itself is
 * allocated at the driver's granularity. */
static inline MEP_HD uint64_t mep_ll_align128(uint64_t x) {
  return (x + 127u) & ~(uint64_t)127u;
}

/* Bytes of one dispatched row: bf16 payload, or fp8 payload + one f32 scale
 * per 128 channels (scales always travel as f32; UE8M0 packing happens on
 * the receiver, so the wire format does not depend on the scale mode). */
static inline MEP_HD uint64_t mep_ll_dispatch_row_bytes(int64_t hidden, int fp8) {
  return fp8 ? mep_ll_align16((uint64_t)hidden + (uint64_t)(hidden / 128) * 4u)
             : mep_ll_align16((uint64_t)hidden * 2u);
}

/* Capacities the buffer was sized for. Offsets use these; row strides use
 * the call's hidden/top_k (every rank makes the same call; a receive checks
 * each source's row description, mep_head_desc_agrees, and a difference
 * fails the group with MISMATCH). */
typedef struct mep_ll_dims {
  int32_t local_experts; /* E_local */
  int32_t world;         /* R */
  int32_t max_tokens;    /* per rank */
  int32_t hidden;        /* max hidden */
  int32_t top_k;         /* max top_k */
  int32_t fp8;           /* 1: sized for fp8 dispatch rows only */
  int32_t num_sets;      /* buffer sets in the window: 1 or 2 (0 means 2) */
  /* 1: the window serves LSA only and has no staging (its largest part:
   * one bf16 row per received slot, E_local * R * max_tokens rows per
   * set); 0: sized for every transport. */
  int32_t lsa_only;
} mep_ll_dims_t;

/* Buffer sets a window holds (double_buffer: false needs one). */
static inline MEP_HD int mep_ll_num_sets(const mep_ll_dims_t *d) {
  return d->num_sets == 1 ? 1 : 2;
}

/* A source's dispatch slot list at a destination: one 8-byte head, padding
 * to 16 bytes, then max_tokens * top_k 8-byte words, one per (token, k).
 * Each is written with one 8-byte store and carries the call's tag, so a
 * reader that sees the tag sees the whole word: the destination scans the
 * lists while the rows are still in flight, before the count signal.
 *   word: weight f32 bits << 32 | (local expert + 1, 0: none there) << 16
 *         | tag
 *   head: row description << 44 | tokens << 32 | weighted << 16 | tag
 * Tags run 1..65535 per (buffer set, source) and every LSA call rewrites
 * every word of the list's capacity (max_tokens * the group's top_k; those
 * past its own words with no expert), so a word never still holds a tag
 * equal to the call's unless this call wrote it. The row description
 * (kernels/common/row_desc.h) is the call's hidden, top_k and row format: a
 * receiver reads a source's rows and words with its own call's, so one
 * that differs fails the group before any is read. */
#define MEP_LL_LIST_HEAD_BYTES 16u
static inline MEP_HD uint32_t mep_ll_next_tag(uint32_t tag) {
  return tag >= 0xffffu ? 1u : tag + 1u;
}
static inline MEP_HD uint64_t mep_ll_list_word(int local_expert, uint32_t weight_bits,
                                               uint32_t tag) {
  return ((uint64_t)weight_bits << 32) | ((uint64_t)(uint32_t)(local_expert + 1) << 16) |
         (uint64_t)(tag & 0xffffu);
}
static inline MEP_HD uint32_t mep_ll_list_tag(uint64_t w) { return (uint32_t)(w & 0xffffu); }
static inline MEP_HD int mep_ll_list_expert(uint64_t w) {
  return (int)((w >> 16) & 0xffffu) - 1;
}
static inline MEP_HD uint32_t mep_ll_list_weight_bits(uint64_t w) { return (uint32_t)(w >> 32); }

static inline MEP_HD uint64_t mep_ll_list_head(int tokens, int weighted, uint32_t desc,
                                               uint32_t tag) {
  return ((uint64_t)desc << 44) | ((uint64_t)(uint32_t)tokens << 32) |
         ((uint64_t)(weighted ? 1u : 0u) << 16) | (uint64_t)(tag & 0xffffu);
}
static inline MEP_HD int mep_ll_head_tokens(uint64_t h) { return (int)((h >> 32) & 0xfffu); }
static inline MEP_HD int mep_ll_head_weighted(uint64_t h) { return (int)((h >> 16) & 1u); }
static inline MEP_HD uint32_t mep_ll_head_desc(uint64_t h) { return (uint32_t)(h >> 44); }

/* Bytes of one source's slot list (head + max_tokens * top_k words). */
static inline MEP_HD uint64_t mep_ll_list_bytes(const mep_ll_dims_t *d) {
  return mep_ll_align16(MEP_LL_LIST_HEAD_BYTES +
                        (uint64_t)d->max_tokens * (uint64_t)d->top_k * 8u);
}

/* LSA expert lists: the sender, which holds the routing, also lists each
 * destination expert's entries from it, so the receiver needs no scan of
 * whole slot lists: per (local expert, source rank), one count word, then
 * up to max_tokens entry words in (token, k) order. Every word carries the
 * call's tag and is written with one 8-byte store, so the receiver reads
 * them as they land, before the rows' count signal. The receiver zeroes
 * every word it read once it is done with it, so a word holds either zero
 * or the current call's value (the next write to a set comes two calls
 * later, after a combine that orders it behind this receive).
 *   count: hits (uncapped) << 32 | source's tokens << 16 | tag
 *   entry: k << 27 | token << 16 | tag
 * (the slot's weight travels in the slot list, which the receiver reads for
 * every slot anyway). */
static inline MEP_HD uint64_t mep_ll_elist_count(uint32_t hits, int tokens, uint32_t tag) {
  return ((uint64_t)hits << 32) | ((uint64_t)((uint32_t)tokens & 0xffffu) << 16) |
         (uint64_t)(tag & 0xffffu);
}
static inline MEP_HD uint32_t mep_ll_elist_hits(uint64_t w) { return (uint32_t)(w >> 32); }
static inline MEP_HD int mep_ll_elist_tokens(uint64_t w) { return (int)((w >> 16) & 0xffffu); }
static inline MEP_HD uint64_t mep_ll_elist_entry(int token, int k, uint32_t tag) {
  return ((uint64_t)((uint32_t)k & 31u) << 27) | ((uint64_t)((uint32_t)token & 2047u) << 16) |
         (uint64_t)(tag & 0xffffu);
}
static inline MEP_HD int mep_ll_elist_token(uint64_t w) { return (int)((w >> 16) & 2047u); }
static inline MEP_HD int mep_ll_elist_k(uint64_t w) { return (int)((w >> 27) & 31u); }

/* Bytes of one (local expert, source) expert list: count + max_tokens
 * entries. */
static inline MEP_HD uint64_t mep_ll_elist_bytes(const mep_ll_dims_t *d) {
  return mep_ll_align16(((uint64_t)d->max_tokens + 1u) * 8u);
}

/* Pushed combine weights (LSA, a combine whose dispatch carried no
 * weights): the source writes each valid slot's weight into the slot's
 * expert rank when that is another rank, one 8-byte store per (token, k),
 * so that rank pre-reduces as if the dispatch had carried the weights.
 *   word: weight f32 bits << 32 | combine epoch
 * The epoch counts the combines on the buffer set, the same on every
 * rank, so a word carrying this combine's epoch was written by it (when
 * the count comes round, ll_combine_wrap.cuh); the reader needs no signal
 * and no fence. It runs 1 .. MEP_LL_LAST_EPOCH, then 2 .. (0 is no
 * combine's), so that its parity alternates from each combine on the set
 * to the next: the parity picks the half of the combine regions and
 * signals the combine uses (mep_ll_comb_half). */
#define MEP_LL_LAST_EPOCH 0xffffffffu
static inline MEP_HD uint32_t mep_ll_next_epoch(uint32_t epoch) {
  return epoch == MEP_LL_LAST_EPOCH ? 2u : epoch + 1u;
}
/* The half of a set's combine regions (comb_recv, comb_flag) and combine
 * signals a combine of this epoch uses. Consecutive combines on a set use
 * different halves, so a peer's next combine there never writes what this
 * rank's receive of the last one may still be reading: to reach this
 * combine's half again, that peer must have received the combine between,
 * which this rank sends only after that receive (PROTOCOL.md, section 6). */
static inline MEP_HD int mep_ll_comb_half(uint32_t epoch) { return (int)(epoch & 1u); }
static inline MEP_HD uint64_t mep_ll_weight_word(uint32_t weight_bits, uint32_t epoch) {
  return ((uint64_t)weight_bits << 32) | (uint64_t)epoch;
}

/* Flagged partials (LSA): a combine whose source sent at most
 * mep_ll_flag_tokens(d) tokens gets its partials as 8-byte words
 * {2 bf16 channels, 32-bit combine epoch}: each word is its own flag (a
 * 64-bit access is single-copy atomic), so the experts' ranks send them
 * with no release (their arrival, a relaxed add, comes first and only
 * keeps the ranks in step), and the source sums each partial as it lands.
 * Twice the bytes of a bf16 row, against line partials' 16/15 (below):
 * worth it only while the latency, not the link, bounds a call. Region
 * comb_flag:
 * [R][mep_ll_flag_tokens][hidden / 2] words, by sending rank.
 *
 * A source takes flagged words from each of its R - 1 peers, so the
 * limit is a budget of rows into one source: F = MEP_LL_FLAG_ROWS / (R - 1)
 * tokens, at most MEP_LL_FLAG_TOKENS and at least 1 (16 at EP2, 8 at EP4,
 * 3 at EP8). Set by measurements on H200 (tools/bench/RESULTS.md) against
 * the partials with a release that line partials replaced: at EP2 16
 * tokens flagged beat them and 32 lost; at EP4 16 lost by 2.4-3.1 us, and
 * at 8 the two traded about 1 us of the hook send half (flagged faster)
 * against the fused call, so 8 stays flagged. EP8's 3 follows the budget,
 * unmeasured. Against line partials, flagged words stay 0.2-0.3 us faster
 * at 1-8 tokens at EP2. */
#ifndef MEP_LL_FLAG_TOKENS
#define MEP_LL_FLAG_TOKENS 16
#endif
#ifndef MEP_LL_FLAG_ROWS
#define MEP_LL_FLAG_ROWS 24
#endif
static inline MEP_HD int mep_ll_flag_tokens(const mep_ll_dims_t *d) {
  int f = d->world > 1 ? MEP_LL_FLAG_ROWS / (d->world - 1) : MEP_LL_FLAG_TOKENS;
  if (f > MEP_LL_FLAG_TOKENS) f = MEP_LL_FLAG_TOKENS;
  if (f < 1) f = 1;
  return d->max_tokens < f ? d->max_tokens : f;
}
static inline MEP_HD uint64_t mep_ll_flag_word(uint32_t two_bf16, uint32_t epoch) {
  return ((uint64_t)epoch << 32) | (uint64_t)two_bf16;
}

/* Line partials (LSA, a source above the flagged limit): its partial rows
 * travel as 128-byte lines of 120 payload bytes and an 8-byte flag (the
 * combine epoch, twice). A warp step is 4 lines, 240 channels, one
 * 512-byte store instruction: lanes 0-6 of each 8-lane group carry 8
 * channels each (the step's first 224, in lane order g * 7 + l), and lane
 * 7 of group g (the flag lane) 4 more, channels 224 + 4 g, in its low 8
 * bytes, and the flag in its high 8. The receive sees a line's flag only
 * once the whole line has landed (NVLink delivers a warp's aligned
 * 128-byte store whole on the platforms NCCL enables its LL128 protocol
 * on, Hopper among them), so no release orders the data and the receive
 * sums each line as it lands. 16/15 of a bf16 row's bytes. A row of the
 * set's hidden width takes ceil(hidden / 240) steps; the rows sit in
 * comb_recv at [token * top_k + first slot on the sender], at that row
 * width whatever the call's hidden, so every flag lane keeps its place. */
#define MEP_LL_LINE_STEP 240
static inline MEP_HD uint64_t mep_ll_line_row_bytes(int hidden) {
  return (uint64_t)((hidden + MEP_LL_LINE_STEP - 1) / MEP_LL_LINE_STEP) * 512u;
}

/* Per-block state words beside the shadows: the last list tag received
 * from each source [R], the last sent [1], the last combine epoch sent [1]
 * and received [1] (the combine receive's, which mep_ll_await_combine
 * reads: the shadows it read may already have moved past that combine),
 * and the dispatch the last combine sent answers [1] (mep_ll_disp_ident,
 * for that combine's separate receive). */
static inline MEP_HD uint32_t mep_ll_tag_words(int world) { return (uint32_t)world + 4u; }
/* A dispatch as every rank names it: its list tag on its buffer set (the
 * set's tag word R, from its send until the set's next dispatch) and the
 * set. */
static inline MEP_HD uint32_t mep_ll_disp_ident(uint32_t list_tag, int set) {
  return (list_tag << 1) | ((uint32_t)set & 1u);
}

/* One buffer set, offsets relative to the set's start. Dispatch sends each
 * token once per destination rank (not once per expert): the receiver gets
 * the source's rows in token order plus, per (token, k), the local expert
 * it names on the receiver (-1: none there) and the slot's weight, and
 * builds the per-expert slots itself. Combine returns one bf16 partial
 * sum per (token, rank), written into the row of the token's first slot on
 * that rank (the expert side pre-reduces, with the dispatch's weights or,
 * over LSA, weights the source pushed into comb_weights), or over staged
 * transports without weights at dispatch one bf16 row per (token, k), from
 * which the source forms the same partials.
 * Signals first, u64 each, indexed by source rank:
 *   dispatch count [R], dispatch row [R], then per combine half
 *   (mep_ll_comb_half) combine count [R], combine row [R].
 * A dispatch count signal carries the source's token count, its
 * row-signalled puts (0 for LSA) and whether it sent weights, see
 * mep_ll_disp_code. */
typedef struct mep_ll_set_layout {
  uint64_t num_signals;   /* per set */
  uint64_t sig_bytes;
  uint64_t disp_recv;     /* [R][max_tokens] dispatch rows, by source rank */
  uint64_t disp_list;     /* [R] slot lists (mep_ll_list_bytes each) */
  uint64_t disp_elist;    /* [E_local][R] expert lists (LSA; mep_ll_elist_bytes each) */
  /* [2 halves][max_tokens][top_k] rows of mep_ll_line_row_bytes(hidden)
   * (line partials; staged transports' bf16 rows use the first 2 hidden
   * bytes of each) */
  uint64_t comb_recv;
  uint64_t comb_recv_half; /* bytes of one half of comb_recv */
  uint64_t comb_weights;  /* [R][max_tokens * top_k] pushed weight words (LSA) */
  /* [2 halves][R][mep_ll_flag_tokens][hidden / 2] flagged partial words (LSA) */
  uint64_t comb_flag;
  uint64_t comb_flag_half; /* bytes of one half of comb_flag */
  /* mep_ll_flag_tokens(d), kept here so that kernels read it instead of
   * working it out from the world size on every use */
  uint64_t flag_tokens;
  uint64_t stage;         /* send staging (GIN / GIN-emulated; empty when lsa_only) */
  uint64_t stage_list;    /* dispatch list staging [R][max_tokens * top_k] */
  uint64_t stage_partial; /* combine partial staging [R][max_tokens] bf16 rows */
  uint64_t set_bytes;
} mep_ll_set_layout_t;

static inline MEP_HD mep_ll_set_layout_t mep_ll_set_layout(const mep_ll_dims_t *d) {
  mep_ll_set_layout_t l;
  const uint64_t el = (uint64_t)d->local_experts, r = (uint64_t)d->world;
  const uint64_t t = (uint64_t)d->max_tokens, k = (uint64_t)d->top_k;
  const uint64_t row_d = mep_ll_dispatch_row_bytes(d->hidden, d->fp8);
  const uint64_t row_c = (uint64_t)d->hidden * 2u;
  const uint64_t list = mep_ll_list_bytes(d);
  l.num_signals = 6u * r;
  l.sig_bytes = mep_ll_align16(l.num_signals * 8u);
  l.disp_recv = l.sig_bytes;
  l.disp_list = l.disp_recv + r * t * row_d;
  l.disp_elist = l.disp_list + r * list;
  l.comb_recv = mep_ll_align128(l.disp_elist + el * r * mep_ll_elist_bytes(d));
  l.comb_recv_half = t * k * mep_ll_line_row_bytes(d->hidden);
  l.comb_weights = l.comb_recv + 2u * l.comb_recv_half;
  l.comb_flag = l.comb_weights + mep_ll_align16(r * t * k * 8u);
  l.flag_tokens = (uint64_t)mep_ll_flag_tokens(d);
  l.comb_flag_half = r * l.flag_tokens * (uint64_t)d->hidden * 4u;
  l.stage = mep_ll_align128(l.comb_flag + 2u * l.comb_flag_half);
  if (d->lsa_only) { /* LSA stores from the caller's tensors: no staging */
    l.stage_list = l.stage_partial = l.stage;
    l.set_bytes = l.stage;
    return l;
  }
  /* Staging holds either the dispatch rows (one per token, quantised once)
   * plus one list per destination, or the combine rows: one per received
   * slot for sources that want rows, then one partial per received token
   * for sources that want partials (both kinds can be in flight in one
   * combine). Never dispatch and combine at once within a set. */
  {
    uint64_t disp_stage = t * row_d + r * list;
    uint64_t comb_stage = el * r * t * row_c + r * t * row_c;
    l.stage_list = l.stage + t * row_d;
    l.stage_partial = l.stage + el * r * t * row_c;
    l.set_bytes = l.stage + (disp_stage > comb_stage ? disp_stage : comb_stage);
  }
  l.set_bytes = mep_ll_align128(l.set_bytes);
  return l;
}

/* Signal indices within a set (also the GIN signal id, offset by the set). */
static inline MEP_HD uint32_t mep_ll_sig_disp_cnt(const mep_ll_dims_t *d, int src) {
  (void)d;
  return (uint32_t)src;
}
static inline MEP_HD uint32_t mep_ll_sig_disp_row(const mep_ll_dims_t *d, int src) {
  return (uint32_t)(d->world + src);
}
static inline MEP_HD uint32_t mep_ll_sig_comb_cnt(const mep_ll_dims_t *d, int half, int src) {
  return (uint32_t)((2 + 2 * half) * d->world + src);
}
static inline MEP_HD uint32_t mep_ll_sig_comb_row(const mep_ll_dims_t *d, int half, int src) {
  return (uint32_t)((3 + 2 * half) * d->world + src);
}
/* Offsets, within the set, of a combine half's regions. */
static inline MEP_HD uint64_t mep_ll_comb_recv_off(const mep_ll_set_layout_t *l, int half) {
  return l->comb_recv + (uint64_t)half * l->comb_recv_half;
}
static inline MEP_HD uint64_t mep_ll_comb_flag_off(const mep_ll_set_layout_t *l, int half) {
  return l->comb_flag + (uint64_t)half * l->comb_flag_half;
}
/* Offset, within the set, of sending rank `src`'s flagged row for token
 * `t` (< l->flag_tokens) in a half's comb_flag: hidden / 2 words. The
 * one address the writer, the reader and the wrap's zeroing share. */
static inline MEP_HD uint64_t mep_ll_flag_row_off(const mep_ll_set_layout_t *l,
                                                  const mep_ll_dims_t *d, int half, int src,
                                                  int t) {
  return mep_ll_comb_flag_off(l, half) +
         ((uint64_t)src * l->flag_tokens + (uint64_t)t) * (uint64_t)d->hidden * 4u;
}

/* The line-partial row `row` (token * top_k + slot) in a half's comb_recv. */
static inline MEP_HD uint64_t mep_ll_line_row_off(const mep_ll_set_layout_t *l,
                                                  const mep_ll_dims_t *d, int half,
                                                  uint64_t row) {
  return mep_ll_comb_recv_off(l, half) + row * mep_ll_line_row_bytes(d->hidden);
}

/* The dispatch count signal's increment: token count, row-signalled put
 * count (both <= max_tokens + 1) and whether the source's slot lists carry
 * weights (combine then pre-reduces for that source), in one add, so the
 * receiver needs no other message to know what to wait for. */
static inline MEP_HD uint64_t mep_ll_disp_code(int tokens, int puts, int weighted,
                                               int max_tokens) {
  const uint64_t m1 = (uint64_t)max_tokens + 1u;
  return 1u + (uint64_t)tokens + m1 * ((uint64_t)puts + (m1 + 1u) * (weighted ? 1u : 0u));
}

/* Inverse of mep_ll_disp_code for code = increment - 1. Returns 0 for a
 * value no sender produces (the receiver then reads nothing). */
static inline MEP_HD int mep_ll_disp_decode(uint64_t code, int max_tokens, int *tokens,
                                            int *puts, int *weighted) {
  const uint64_t m1 = (uint64_t)max_tokens + 1u;
  const uint64_t rest = code / m1;
  /* range-checked in 64 bits: a piled-up or corrupt signal can be huge */
  if (rest / (m1 + 1u) > 1u) {
    *tokens = *puts = *weighted = 0;
    return 0;
  }
  *tokens = (int)(code % m1);
  *puts = (int)(rest % (m1 + 1u));
  *weighted = (int)(rest / (m1 + 1u));
  return 1;
}

/* Count signals under LSA carry arrivals: every block of a send half adds
 * one arrival (bit 48) after its own stores (a combine's toward a source
 * with flagged partials: at its start, relaxed), and block 0's add also
 * carries the grid size (bits 32..47) and the code (bits 0..31:
 * mep_ll_disp_code; for combine 1, or 2 toward a flagged source). The receiver reads a signal's increase since
 * its last receive: complete once the arrivals equal the grid size. No
 * grid-wide ticket, and no last block that signals after everyone else. */
#define MEP_LL_ARRIVAL_ONE (1ull << 48)
#define MEP_LL_ARRIVAL_GRID_SHIFT 32
static inline MEP_HD uint64_t mep_ll_arrival_add(uint64_t code, uint32_t block, uint32_t grid) {
  return MEP_LL_ARRIVAL_ONE +
         (block == 0 ? ((uint64_t)grid << MEP_LL_ARRIVAL_GRID_SHIFT) + code : 0u);
}
/* 1: complete (*code = block 0's code); 0: arrivals still missing; -1: more
 * arrivals than the grid field accounts for (a partly piled-up or corrupt
 * signal). Two whole launches piled up read as one with summed fields: the
 * dispatch receive then catches them only if the code does not decode or
 * disagrees with the list head. */
static inline MEP_HD int mep_ll_arrival_state(uint64_t increase, uint64_t *code) {
  const uint64_t arrived = increase >> 48;
  const uint64_t grid = (increase >> MEP_LL_ARRIVAL_GRID_SHIFT) & 0xffffu;
  *code = increase & 0xffffffffu;
  if (grid == 0) return 0;
  return arrived < grid ? 0 : arrived == grid ? 1 : -1;
}

/* Device state (ordinary device memory, zeroed once): signal shadows (the
 * value each signal had after the last completed receive), the staged
 * dispatch's and combine's per-destination put counters (contiguous with
 * the tickets, the help words and the abort flag: mep_ll_clear_abort
 * zeroes them as one range), one block ticket per staged send kernel and
 * set (its last block sends the count signals), and the dispatch
 * receive's help words. Everything advances in device memory, so
 * graph replays need no host.
 *
 * The list tags (mep_ll_list_word) and the combine epoch
 * (mep_ll_weight_word) live beside the shadows: mep_ll_tag_words.
 *
 * Every block keeps its own copy of the shadows and tags (slot = block
 * index), so a launch ends without a grid-wide ticket: block b reads slot
 * b, and at its end writes the new value into slots b, b + grid, b +
 * 2 grid, ... Between launches all slots are equal, whatever grid the next
 * launch has; launches use at most MEP_LL_SHADOW_SLOTS blocks. */
#define MEP_LL_SHADOW_SLOTS 256
enum {
  MEP_LL_TICKET_DISPATCH_SEND = 0,
  MEP_LL_TICKET_COMBINE_SEND = 1,
  MEP_LL_NUM_TICKETS = 2
};

/* A set's block tickets take MEP_LL_TICKET_BYTES; the dispatch receive's
 * help words follow them, one u64 per local expert (the launcher's
 * MepLLParams.tickets points at the set's tickets). A help word is 0 but
 * while the expert's own receive block shares its rows past the first
 * ones it copies itself: then the expert's slots (bits 32..63) and the
 * next slot to claim (bits 0..31), which any block may take with an
 * atomic add (ll_dispatch_copy.cuh). */
#define MEP_LL_TICKET_BYTES 16
static inline MEP_HD uint64_t mep_ll_set_counter_bytes(const mep_ll_dims_t *d) {
  return MEP_LL_TICKET_BYTES + (uint64_t)d->local_experts * 8u;
}

typedef struct mep_ll_state_layout {
  uint64_t shadows;    /* u64 [2 sets][MEP_LL_SHADOW_SLOTS][num_signals] */
  uint64_t tags;       /* u32 [2 sets][MEP_LL_SHADOW_SLOTS][mep_ll_tag_words(R)] */
  uint64_t puts;       /* u32 [2 sets][R] staged dispatch puts per destination */
  uint64_t comb_puts;  /* u32 [2 sets][R] staged combine partial puts per destination */
  uint64_t tickets;    /* [2 sets][mep_ll_set_counter_bytes]: u32 tickets, u64 help words */
  uint64_t abort_flag; /* u32: set once a wait timed out */
  uint64_t bytes;
} mep_ll_state_layout_t;

static inline MEP_HD mep_ll_state_layout_t mep_ll_state_layout(const mep_ll_dims_t *d) {
  mep_ll_state_layout_t s;
  const uint64_t nsig = mep_ll_set_layout(d).num_signals;
  s.shadows = 0;
  const uint64_t sets = MEP_NUM_BUFFER_SETS;
  s.tags = mep_ll_align16(sets * MEP_LL_SHADOW_SLOTS * nsig * 8u);
  s.puts = s.tags + mep_ll_align16(sets * MEP_LL_SHADOW_SLOTS * mep_ll_tag_words(d->world) * 4u);
  s.comb_puts = s.puts + mep_ll_align16(sets * (uint64_t)d->world * 4u);
  s.tickets = s.comb_puts + mep_ll_align16(sets * (uint64_t)d->world * 4u);
  s.abort_flag = s.tickets + sets * mep_ll_set_counter_bytes(d);
  s.bytes = mep_ll_align16(s.abort_flag + 4u);
  return s;
}

#ifdef __cplusplus
}
#define MEP_LL_STATIC_ASSERT(cond, why) static_assert(cond, why)
#else
#define MEP_LL_STATIC_ASSERT(cond, why) _Static_assert(cond, why)
#endif

MEP_LL_STATIC_ASSERT(MEP_MAX_TOKENS_LL < 4096, "a slot-list head's tokens field is 12 bits");

#endif /* MEP_LL_LAYOUT_H_ */
