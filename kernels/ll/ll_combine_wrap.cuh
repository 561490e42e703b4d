/* ll_combine_wrap.cuh: what keeps the combine epoch's words honest when the
 * epoch comes round. Pushed weights (comb_weights) and flagged partials
 * (comb_flag, one half per epoch parity) are taken when they carry the
 * current combine's epoch, which runs 1 .. MEP_LL_LAST_EPOCH and then
 * 2 .. again (mep_ll_next_epoch): a word left at a position no combine on
 * the set has written for a whole cycle would pass for a new one. So at
 * the last combine of a cycle and the first of the next, as each region
 * sees them (mep_epoch_wraps), each rank zeroes, in its own window, every
 * word of comb_weights and of the combine's half of comb_flag that no rank
 * writes in that combine. After those two, every word of the region is 0
 * or was written in the new cycle, so each epoch value is found only where
 * its own combine wrote it (epoch 0 is no combine's). The zeroed words are
 * not the ones written or read in that combine. The next writers of the
 * zeroed words come after the zeros: pushes of the next combine after that
 * combine's own receive of this one, which needs this send half's arrivals
 * (sent after a barrier and a system fence at these epochs); flagged rows
 * of this half after this rank's next combine send on the set, which
 * follows this receive (PROTOCOL.md, section 6). Four combines a cycle,
 * and the first three of a set. LSA only: the staged transports
 * never read these regions. The rules mirror the writers
 * (mep_combine_push_weights, mep_combine_send_partials_at): change them
 * together. */
#ifndef MEP_LL_COMBINE_WRAP_CUH_
#define MEP_LL_COMBINE_WRAP_CUH_

#include "kernels/ll/ll_launch.cuh"

/* The last combine of a cycle and the first of the next, for comb_weights
 * (every epoch: LAST, then 2) and for each half of comb_flag (odd: LAST,
 * then 3; even: LAST - 1, then 2); epoch 1 is a set's first combine. */
__device__ __forceinline__ bool mep_epoch_wraps(uint32_t epoch) {
  return epoch >= MEP_LL_LAST_EPOCH - 1u || epoch <= 3u;
}

/* The expert side (send half, before any arrival): every comb_weights word
 * of this window that this combine's sources do not push. Source s pushes
 * word t * K + k of its [max_tokens * K] block (this call's top_k K) where
 * it pushes its weights (MEP_LL_SRC_PUSHED in src_s), t is below its token
 * count and slot k routes here (its route is not ELSEWHERE, DROPPED
 * included: mep_combine_push_weights pushes by expert id); this rank's own
 * block is never pushed. The whole region is walked, so the words of any
 * layout an earlier call's top_k gave are covered. */
static __device__ __noinline__ void mep_clear_unpushed_weights(const MepLLParams &p,
                                                               const mep_ll_route_t *route,
                                                               const int *src_s, int top_k) {
  const uint64_t K = (uint64_t)top_k, M = (uint64_t)p.dims.max_tokens;
  uint64_t *w = reinterpret_cast<uint64_t *>(p.xp.local + p.set_off + p.lay.comb_weights);
  const uint64_t n = (p.lay.comb_flag - p.lay.comb_weights) / 8u;
  for (uint64_t j = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; j < n;
       j += (uint64_t)gridDim.x * blockDim.x) {
    const uint64_t s = j / (M * K), i = j % (M * K);
    bool pushed = false;
    if (s < (uint64_t)p.dims.world && (int)s != p.xp.rank) {
      const int v = src_s[s];
      if ((v & MEP_LL_SRC_PUSHED) && i / K < (uint64_t)MEP_LL_SRC_TOKENS(v))
        pushed = route[s * M * K + i].slot != MEP_LL_ROUTE_ELSEWHERE;
    }
    if (!pushed) w[j] = 0u;
  }
}

/* The source side (receive half): every comb_flag row [r][t] of this
 * window that rank r does not write in this combine, and the channels past
 * this call's hidden of those it writes. Rank r writes row t when this
 * rank's call is flagged, t is below its token count and token t names an
 * expert on r (the same rule as the ranks the sum visits). One warp per
 * row, 16-byte stores. */
/* (scalars, not the argument block: a reference to a kernel parameter
 * passed out of line would copy it to local memory on every launch) */
template <typename IdxT>
static __device__ __noinline__ void mep_clear_unwritten_flag_rows(
    const MepLLParams &p, const IdxT *topk, int tokens, int top_k, int num_experts,
    int local_experts, int hidden, int half, bool flagged) {
  const int lane = threadIdx.x & 31, R = p.dims.world, F = (int)p.lay.flag_tokens;
  const int nwarps = gridDim.x * (MEP_LL_THREADS / 32);
  const int gwarp = blockIdx.x * (MEP_LL_THREADS / 32) + threadIdx.x / 32;
  const int row16 = p.dims.hidden * 4 / 16; /* 16-byte stores per row */
  for (int u = gwarp; u < R * F; u += nwarps) {
    const int r = u / F, t = u % F;
    bool written = false;
    if (flagged && t < tokens) {
      const IdxT e = lane < top_k ? topk[t * top_k + lane] : (IdxT)-1;
      written = __any_sync(0xffffffffu,
                           e >= 0 && e < (IdxT)num_experts && (int)(e / local_experts) == r);
    }
    uint4 *row = reinterpret_cast<uint4 *>(p.xp.local + p.set_off +
                                           mep_ll_flag_row_off(&p.lay, &p.dims, half, r, t));
    for (int q = (written ? hidden * 4 / 16 : 0) + lane; q < row16; q += 32)
      row[q] = make_uint4(0u, 0u, 0u, 0u);
  }
}

/* The source side (receive half): every line row of this half of comb_recv
 * that no rank writes in this combine, and the steps past this call's
 * hidden of those written. Rank r writes row t * K + k when this rank's
 * call takes lines, t is below its token count and k is the first slot of
 * token t on r (the rows the lines sum reads). The whole half is walked
 * (max_tokens x the set's top_k rows), so the rows of any layout an
 * earlier call's top_k gave are covered. One warp per row, 16-byte
 * stores. */
template <typename IdxT>
static __device__ __noinline__ void mep_clear_unwritten_line_rows(
    const MepLLParams &p, const IdxT *topk, int tokens, int top_k, int num_experts,
    int local_experts, int hidden, int half, bool lines) {
  const int lane = threadIdx.x & 31;
  const int nwarps = gridDim.x * (MEP_LL_THREADS / 32);
  const int gwarp = blockIdx.x * (MEP_LL_THREADS / 32) + threadIdx.x / 32;
  const uint64_t rows = (uint64_t)p.dims.max_tokens * p.dims.top_k;
  const int row16 = (int)(mep_ll_line_row_bytes(p.dims.hidden) / 16u);
  const int written16 = (int)(mep_ll_line_row_bytes(hidden) / 16u);
  for (uint64_t j = gwarp; j < rows; j += nwarps) {
    const int t = (int)(j / (uint64_t)top_k), k = (int)(j % (uint64_t)top_k);
    bool written = false;
    if (lines && t < tokens) {
      int rank;
      written = (mep_token_first_slots(topk, t, top_k, num_experts, local_experts, &rank) >> k) &
                1u;
    }
    uint4 *row = reinterpret_cast<uint4 *>(p.xp.local + p.set_off +
                                           mep_ll_line_row_off(&p.lay, &p.dims, half, j));
    for (int q = (written ? written16 : 0) + lane; q < row16; q += 32)
      row[q] = make_uint4(0u, 0u, 0u, 0u);
  }
}

#endif /* MEP_LL_COMBINE_WRAP_CUH_ */
