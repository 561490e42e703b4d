/* ll_layout.h: byte layout of the LL symmetric buffer (two buffer sets) and
 * of the LL device state. Plain C, shared by the launchers, the kernels and
 * the runtime's sizing, so every rank computes the same offsets. */
#ifndef MEP_LL_LAYOUT_H_
#define MEP_LL_LAYOUT_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __CUDACC__
#define MEP_HD __host__ __device__
#else
#define MEP_HD
#endif

/* Per-row metadata (source token, k) travels in its own 16-byte record so a
 * row payload is one contiguous put. */
#define MEP_LL_META_BYTES 16

static inline MEP_HD uint64_t mep_ll_align16(uint64_t x) { return (x + 15u) & ~(uint64_t)15u; }

/* Bytes of one dispatched row: bf16 payload, or fp8 payload + one f32 scale
 * per 128 channels (scales always travel as f32; UE8M0 packing happens on
 * the receiver, so the wire format does not depend on the scale mode). */
static inline MEP_HD uint64_t mep_ll_dispatch_row_bytes(int64_t hidden, int fp8) {
  return fp8 ? mep_ll_align16((uint64_t)hidden + (uint64_t)(hidden / 128) * 4u)
             : mep_ll_align16((uint64_t)hidden * 2u);
}

/* Capacities the buffer was sized for. Offsets use these; row strides use
 * the call's hidden/top_k (every rank makes the same call). */
typedef struct mep_ll_dims {
  int32_t local_experts; /* E_local */
  int32_t world;         /* R */
  int32_t max_tokens;    /* per rank */
  int32_t hidden;        /* max hidden */
  int32_t top_k;         /* max top_k */
  int32_t fp8;           /* 1: sized for fp8 dispatch rows only */
} mep_ll_dims_t;

/* One buffer set, offsets relative to the set's start. Signals first:
 *   dispatch count signals [E_local][R], dispatch row signals [E_local][R],
 *   combine count signals [R], combine row signals [R]   (u64 each). */
typedef struct mep_ll_set_layout {
  uint64_t num_signals;   /* per set */
  uint64_t sig_bytes;
  uint64_t disp_recv;     /* [E_local][R][max_tokens] dispatch rows */
  uint64_t disp_meta;     /* [E_local][R][max_tokens] meta records */
  uint64_t comb_recv;     /* [max_tokens][top_k] bf16 rows */
  uint64_t stage;         /* send staging (GIN / GIN-emulated) */
  uint64_t stage_meta;    /* dispatch meta staging [max_tokens][top_k] */
  uint64_t set_bytes;
} mep_ll_set_layout_t;

static inline MEP_HD mep_ll_set_layout_t mep_ll_set_layout(const mep_ll_dims_t *d) {
  mep_ll_set_layout_t l;
  const uint64_t el = (uint64_t)d->local_experts, r = (uint64_t)d->world;
  const uint64_t t = (uint64_t)d->max_tokens, k = (uint64_t)d->top_k;
  const uint64_t row_d = mep_ll_dispatch_row_bytes(d->hidden, d->fp8);
  const uint64_t row_c = (uint64_t)d->hidden * 2u;
  const uint64_t slots = el * r * t;
  l.num_signals = 2u * el * r + 2u * r;
  l.sig_bytes = mep_ll_align16(l.num_signals * 8u);
  l.disp_recv = l.sig_bytes;
  l.disp_meta = l.disp_recv + slots * row_d;
  l.comb_recv = l.disp_meta + slots * MEP_LL_META_BYTES;
  l.stage = l.comb_recv + t * k * row_c;
  /* Staging holds either the dispatch rows (one per token, quantised once)
   * plus their meta records, or the combine rows (one per received slot):
   * never both at once within a set. */
  {
    uint64_t disp_stage = t * row_d + t * k * MEP_LL_META_BYTES;
    uint64_t comb_stage = slots * row_c;
    l.stage_meta = l.stage + t * row_d;
    l.set_bytes = l.stage + (disp_stage > comb_stage ? disp_stage : comb_stage);
  }
  l.set_bytes = mep_ll_align16(l.set_bytes);
  return l;
}

/* Signal indices within a set (also the GIN signal id, offset by the set). */
static inline MEP_HD uint32_t mep_ll_sig_disp_cnt(const mep_ll_dims_t *d, int le, int src) {
  return (uint32_t)(le * d->world + src);
}
static inline MEP_HD uint32_t mep_ll_sig_disp_row(const mep_ll_dims_t *d, int le, int src) {
  return (uint32_t)(d->local_experts * d->world + le * d->world + src);
}
static inline MEP_HD uint32_t mep_ll_sig_comb_cnt(const mep_ll_dims_t *d, int src) {
  return (uint32_t)(2 * d->local_experts * d->world + src);
}
static inline MEP_HD uint32_t mep_ll_sig_comb_row(const mep_ll_dims_t *d, int src) {
  return (uint32_t)(2 * d->local_experts * d->world + d->world + src);
}

/* Device state (ordinary device memory, zeroed once): signal shadows (the
 * value each signal had after the last completed receive), the senders'
 * row-completion counters (LSA) and the combine receive's block ticket.
 * Everything advances in device memory, so graph replays need no host. */
typedef struct mep_ll_state_layout {
  uint64_t shadows;    /* u64 [2 sets][num_signals] */
  uint64_t done_disp;  /* u32 [2 sets][num_experts_max] */
  uint64_t done_comb;  /* u32 [2 sets][R] */
  uint64_t tickets;    /* u32 [2 sets][4] */
  uint64_t abort_flag; /* u32: set once a wait timed out */
  uint64_t bytes;
} mep_ll_state_layout_t;

static inline MEP_HD mep_ll_state_layout_t mep_ll_state_layout(const mep_ll_dims_t *d) {
  mep_ll_state_layout_t s;
  const uint64_t nsig = 2u * (uint64_t)d->local_experts * d->world + 2u * (uint64_t)d->world;
  const uint64_t experts = (uint64_t)d->local_experts * d->world;
  s.shadows = 0;
  s.done_disp = mep_ll_align16(2u * nsig * 8u);
  s.done_comb = s.done_disp + mep_ll_align16(2u * experts * 4u);
  s.tickets = s.done_comb + mep_ll_align16(2u * (uint64_t)d->world * 4u);
  s.abort_flag = s.tickets + 2u * 4u * 4u;
  s.bytes = mep_ll_align16(s.abort_flag + 4u);
  return s;
}

#ifdef __cplusplus
}
#endif

#endif /* MEP_LL_LAYOUT_H_ */
