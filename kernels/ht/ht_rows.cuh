/* ht_rows.cuh: the HT dispatch row and how each side writes and reads it.
 * A ring row is the payload (bf16 [2H], or fp8 [H] then the scales' words,
 * 16-aligned) and the token's K routing slots as seen by the ranks the
 * ring serves: expert ids counted from the first of those ranks (-1 for an
 * expert elsewhere) and their weights (0 elsewhere). A ring to one rank
 * carries that rank's local expert ids; a network ring to a relay carries
 * ids local to the relay's node (PROTOCOL.md "Relays"). */
#ifndef MEP_HT_ROWS_CUH_
#define MEP_HT_ROWS_CUH_

#include <stdint.h>

#include "kernels/ht/ht_device.cuh"

/* Index of the o-th set bit of `bits` (o < popc(bits)). */
__device__ __forceinline__ int mep_ht_nth_bit(uint32_t bits, int o) {
  for (int i = 0; i < o; ++i) bits &= bits - 1;
  return __ffs(bits) - 1;
}

/* Ranks [lo, lo + span): one destination rank (span 1) or a relay's node. */
struct MepHtSpan {
  int lo, span;
};

/* The span's bits of a token's rank mask. */
__device__ __forceinline__ bool mep_ht_in_span(uint64_t m, MepHtSpan sp) {
  return ((m >> sp.lo) & ((sp.span >= 64 ? 0ull : 1ull << sp.span) - 1ull)) != 0;
}

/* Slot k of a token's routing as the span sees it. The raw id and weight
 * are loaded by mep_ht_slot_load before the row's copy, so their load
 * latency overlaps the copy's instead of following it. */
struct MepHtSlot {
  int64_t e;
  float w;
};
__device__ __forceinline__ MepHtSlot mep_ht_slot_load(const mep_ht_dispatch_args_t &a, int t) {
  const int lane = threadIdx.x & 31;
  MepHtSlot s = {-1, 0.0f};
  if (lane < a.top_k) {
    const int64_t i = (int64_t)t * a.top_k + lane;
    s.e = mep_ht_topk(a.topk_idx, a.topk_idx_bytes, i);
    s.w = a.topk_weights[i];
  }
  return s;
}
__device__ __forceinline__ int32_t mep_ht_slot(const mep_ht_dispatch_args_t &a, MepHtSlot s,
                                               MepHtSpan sp, int e_local, float *w) {
  const int64_t first = (int64_t)sp.lo * e_local;
  const bool here = s.e >= 0 && s.e < a.num_experts && s.e >= first &&
                    s.e < first + (int64_t)sp.span * e_local;
  *w = here ? s.w : 0.0f;
  return here ? (int32_t)(s.e - first) : -1;
}

/* The ring row of token t for the span. */
__device__ __forceinline__ void mep_ht_write_row(const mep_ht_dispatch_args_t &a, uint64_t payload,
                                                 int t, MepHtSpan sp, int e_local, char *dst) {
  const int H = a.hidden, K = a.top_k, lane = threadIdx.x & 31;
  const MepHtSlot slot = mep_ht_slot_load(a, t);
  if (a.fp8) {
    mep_copy_warp<kMepHtCopyU>(dst, static_cast<const uint8_t *>(a.x) + (uint64_t)t * H, (uint32_t)H);
    mep_ht_copy_words(reinterpret_cast<uint32_t *>(dst + H),
                      static_cast<const uint32_t *>(a.x_scales) + (uint64_t)t * a.scale_words,
                      a.scale_words);
  } else {
    mep_copy_warp<kMepHtCopyU>(dst, static_cast<const uint16_t *>(a.x) + (uint64_t)t * H, 2u * (uint32_t)H);
  }
  if (lane < K) {
    float w;
    reinterpret_cast<int32_t *>(dst + payload)[lane] = mep_ht_slot(a, slot, sp, e_local, &w);
    reinterpret_cast<float *>(dst + payload + 4u * K)[lane] = w;
  }
}

/* Token t of this rank's own rows, straight into output row `out` (no
 * ring: the receiver would only copy it again). */
__device__ __forceinline__ void mep_ht_place_own(const mep_ht_dispatch_args_t &a, int t, int me,
                                                 int e_local, int64_t out, int32_t *hist) {
  const int H = a.hidden, K = a.top_k, lane = threadIdx.x & 31;
  const MepHtSlot slot = mep_ht_slot_load(a, t);
  if (a.fp8) {
    mep_copy_warp<kMepHtCopyU>(static_cast<uint8_t *>(a.recv_x) + out * H,
                               static_cast<const uint8_t *>(a.x) + (int64_t)t * H, (uint32_t)H);
    mep_ht_copy_words(static_cast<uint32_t *>(a.recv_scales) + out * a.scale_words,
                      static_cast<const uint32_t *>(a.x_scales) + (int64_t)t * a.scale_words,
                      a.scale_words);
  } else {
    mep_copy_warp<kMepHtCopyU>(static_cast<uint16_t *>(a.recv_x) + out * H,
                               static_cast<const uint16_t *>(a.x) + (int64_t)t * H,
                               2u * (uint32_t)H);
  }
  if (lane < K) {
    float w;
    const int32_t lid = mep_ht_slot(a, slot, MepHtSpan{me, 1}, e_local, &w);
    a.recv_topk_idx[out * K + lane] = lid;
    a.recv_topk_weights[out * K + lane] = w;
    if (lid >= 0) atomicAdd(&hist[lid], 1);
  }
}

/* Which of the chunk's tokens [base, min(base + 32, t1)) have an expert
 * in the span (bit i: token base + i), from the channel's masks. Whole
 * warp. */
__device__ __forceinline__ uint32_t mep_ht_chunk_ballot(const mep_ht_dispatch_args_t &a,
                                                        const MepHtMasks &mc, int base,
                                                        MepHtSpan sp, int e_local) {
  const uint32_t m =
      mep_ht_lane_mask(mc, a.topk_idx, a.topk_idx_bytes, base, a.top_k, a.num_experts, e_local);
  return __ballot_sync(~0u, mep_ht_in_span(m, sp));
}

/* A ring row's slot k (lane k) as the rank whose experts start at id
 * `first` of the row's numbering sees it: its local expert, or -1 with
 * weight 0. A row of a ring to one rank has first = 0 and keeps its ids. */
__device__ __forceinline__ int32_t mep_ht_row_slot(const char *src, uint64_t payload, int K,
                                                   int first, int e_local, float *w) {
  const int lane = threadIdx.x & 31;
  const int32_t raw = __ldcg(reinterpret_cast<const int32_t *>(src + payload) + lane);
  const float rw = __ldcg(reinterpret_cast<const float *>(src + payload + 4u * K) + lane);
  const bool here = raw >= first && raw < first + e_local;
  *w = here ? rw : 0.0f;
  return here ? raw - first : -1;
}

/* Copies one ring row into output row `out`, its slots as seen from the
 * experts starting at `first` (mep_ht_row_slot). */
__device__ __forceinline__ void mep_ht_read_row(const mep_ht_dispatch_args_t &a, uint64_t payload,
                                                const char *src, int64_t out, int first,
                                                int e_local, int32_t *hist) {
  const int H = a.hidden, K = a.top_k, lane = threadIdx.x & 31;
  /* The slots first: their loads overlap the payload's. */
  int32_t lid = -1;
  float w = 0.0f;
  if (lane < K) lid = mep_ht_row_slot(src, payload, K, first, e_local, &w);
  if (a.fp8) {
    mep_copy_warp<kMepHtCopyU>(static_cast<uint8_t *>(a.recv_x) + out * H, src, (uint32_t)H);
    mep_ht_copy_words(static_cast<uint32_t *>(a.recv_scales) + out * a.scale_words,
                      reinterpret_cast<const uint32_t *>(src + H), a.scale_words);
  } else {
    mep_copy_warp<kMepHtCopyU>(static_cast<uint16_t *>(a.recv_x) + out * H, src, 2u * (uint32_t)H);
  }
  if (lane < K) {
    a.recv_topk_idx[out * K + lane] = lid;
    a.recv_topk_weights[out * K + lane] = w;
    if (lid >= 0) atomicAdd(&hist[lid], 1);
  }
}

/* A relay's copy of a network ring row into another rank's ring: the
 * payload verbatim, the slots renumbered for the rank whose experts start
 * at `first`. Whole warp. */
__device__ __forceinline__ void mep_ht_forward_row(uint64_t payload, int K, const char *src,
                                                   char *dst, int first, int e_local) {
  const int lane = threadIdx.x & 31;
  int32_t lid = -1;
  float w = 0.0f;
  if (lane < K) lid = mep_ht_row_slot(src, payload, K, first, e_local, &w);
  mep_copy_warp<kMepHtCopyU>(dst, src, (uint32_t)payload);
  if (lane < K) {
    reinterpret_cast<int32_t *>(dst + payload)[lane] = lid;
    reinterpret_cast<float *>(dst + payload + 4u * K)[lane] = w;
  }
}

#endif /* MEP_HT_ROWS_CUH_ */
