/* ll_combine_partial.cuh: the LL combine when the dispatch carried the
 * routing weights: the expert side pre-reduces. Each rank sums, for every
 * token it received, its local slots' expert outputs (w * y, f32 fmaf in k
 * order, from 0) and returns one bf16 partial row per (token, rank) instead
 * of one row per (token, expert): top_k / ranks-per-token times fewer bytes
 * on the link (4x at EP2, top-8). The partial lands in the source's combine
 * region at the row of the token's first slot on that rank, so the region
 * keeps its [max_tokens][top_k] size for any world. The source adds its
 * partials in f32, from 0, in the order the token's ranks first appear in
 * its top-k list, and rounds once to bf16: deterministic, and one bf16
 * rounding per partial more than the per-slot path.
 *
 * Included by ll_combine_body.cuh; its send body calls the send part for
 * the sources whose dispatch was weighted, its receive body the sum when
 * this rank's own dispatch was. */
#ifndef MEP_LL_COMBINE_PARTIAL_CUH_
#define MEP_LL_COMBINE_PARTIAL_CUH_

#include "kernels/common/bf16_vec.cuh"
#include "kernels/ll/ll_launch.cuh"

/* Channels of one step: a lane's 8 bf16 channels, 256 per warp. */
constexpr int kMepPartialStep = 256;
/* Channels of one staged put (GIN, GIN-emulated): a row goes in pieces, so
 * a row's steps spread over several warps instead of one warp walking the
 * whole row (7168 channels: 7 warps of 4 steps, not 1 warp of 28). */
constexpr int kMepPartialPiece = 1024;

/* Lane `lane` (< 32) of a warp computes channels [c, c + 8) of the partial
 * from the slots whose bits are set in `live` (k order); entries holds lane
 * k's route. Every lane runs every shuffle (live is warp-uniform). */
__device__ __forceinline__ uint4 mep_partial_chunk(const __nv_bfloat16 *y, int hidden,
                                                   mep_ll_route_t entry, unsigned live, int c) {
  const bool valid = c < hidden;
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  while (live != 0) {
    uint4 v[8];
    float w[8];
    bool use[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      use[i] = live != 0;
      const int k = use[i] ? __ffs(live) - 1 : 0;
      live &= live - 1u;
      const int slot = __shfl_sync(0xffffffffu, entry.slot, k);
      w[i] = __int_as_float(__shfl_sync(0xffffffffu, entry.weight_bits, k));
      v[i] = use[i] && valid
                 ? __ldg(reinterpret_cast<const uint4 *>(y + (size_t)slot * hidden + c))
                 : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (use[i]) mep_bf16x8_fma(acc, v[i], w[i]);
  }
  return mep_bf16x8_pack(acc);
}

/* The send half's partial rows for the weighted sources (src_s: their
 * src_tokens words, shared memory). Units (token, source, piece): LSA
 * pieces are one step, stored straight into the source's row; staged
 * transports compute a kMepPartialPiece-channel piece into the staging row,
 * then put it with a row signal, counted in comb_puts for the count signal
 * the caller sends. */
template <class Tp>
__device__ __forceinline__ void mep_combine_send_partials(const MepLLParams &p,
                                                          const MepCombineArgs &a,
                                                          const int *src_s, int longest) {
  const int lane = threadIdx.x & 31;
  const int nwarps = gridDim.x * (MEP_LL_THREADS / 32);
  const int gwarp = blockIdx.x * (MEP_LL_THREADS / 32) + threadIdx.x / 32;
  const int R = p.dims.world, M = p.dims.max_tokens, K = a.top_k;
  const uint32_t row_bytes = (uint32_t)a.hidden * 2u;
  const uint32_t row_sig = mep_ll_sig_comb_row(&p.dims, p.xp.rank);
  const int piece = Tp::kStaged ? kMepPartialPiece : kMepPartialStep;
  const int npieces = (a.hidden + piece - 1) / piece;
  /* token-major, so the first pass of the grid covers every source's first
   * tokens */
  for (int u = gwarp; u < longest * R * npieces; u += nwarps) {
    const int pc = u % npieces, ts = u / npieces, s = ts % R, t = ts / R;
    const int v = src_s[s];
    if (!(v & MEP_LL_SRC_WEIGHTED) || t >= MEP_LL_SRC_TOKENS(v)) continue; /* warp-uniform */
    const mep_ll_route_t entry = lane < K ? a.route[((size_t)s * M + t) * K + lane]
                                          : mep_ll_route_t{MEP_LL_ROUTE_ELSEWHERE, 0};
    const unsigned mine = __ballot_sync(0xffffffffu, entry.slot != MEP_LL_ROUTE_ELSEWHERE);
    if (mine == 0) continue; /* the token has no expert here */
    const unsigned live = __ballot_sync(0xffffffffu, entry.slot >= 0);
    const int kf = __ffs(mine) - 1;
    const int c0 = pc * piece;
    const int c1 = a.hidden - c0 < piece ? a.hidden : c0 + piece;
    const uint64_t dst_off =
        p.set_off + p.lay.comb_recv + (uint64_t)(t * K + kf) * row_bytes + 2u * (uint64_t)c0;
    if constexpr (!Tp::kStaged) {
      const int c = c0 + lane * 8;
      const uint4 o = mep_partial_chunk(a.y, a.hidden, entry, live, c);
      if (c < a.hidden)
        *reinterpret_cast<uint4 *>(static_cast<char *>(Tp::peer_ptr(p.xp, s, dst_off)) +
                                   16 * lane) = o;
    } else {
      /* GIN reads its source from the window: stage the piece. */
      const uint64_t stage_off = p.set_off + p.lay.stage_partial +
                                 ((uint64_t)s * M + t) * row_bytes + 2u * (uint64_t)c0;
      for (int cs = c0; cs < c1; cs += kMepPartialStep) {
        const int c = cs + lane * 8;
        const uint4 o = mep_partial_chunk(a.y, a.hidden, entry, live, c);
        if (c < c1)
          *reinterpret_cast<uint4 *>(p.xp.local + stage_off + 2u * (uint64_t)(c - c0)) = o;
      }
      __syncwarp();
      Tp::put_warp(p.xp, s, dst_off, nullptr, stage_off, 2u * (uint32_t)(c1 - c0), row_sig);
      if (lane == 0) atomicAdd(&p.comb_puts[s], 1u);
    }
  }
}

/* Receive half's reduction (after the count/row waits): units (token,
 * 256-channel step) over the grid; out = sum of the token's partials in the
 * order its ranks first appear in top-k (f32, from 0), bf16 once. */
template <typename IdxT>
__device__ __forceinline__ void mep_combine_sum_partials(const MepLLParams &p,
                                                         const MepCombineArgs &a) {
  const int lane = threadIdx.x & 31;
  const int nwarps = gridDim.x * (MEP_LL_THREADS / 32);
  const int gwarp = blockIdx.x * (MEP_LL_THREADS / 32) + threadIdx.x / 32;
  const int K = a.top_k;
  const int nsteps = (a.hidden + kMepPartialStep - 1) / kMepPartialStep;
  const __nv_bfloat16 *region =
      reinterpret_cast<const __nv_bfloat16 *>(p.xp.local + p.set_off + p.lay.comb_recv);
  const IdxT *topk = reinterpret_cast<const IdxT *>(a.topk);
  for (int u = gwarp; u < a.tokens * nsteps; u += nwarps) {
    const int t = u / nsteps;
    const int c = (u - t * nsteps) * kMepPartialStep + lane * 8;
    /* lane k: slot k's rank, in the index's own width as dispatch decides
     * (an int64 id past 2^31 must not wrap into a valid expert) */
    const IdxT e = lane < K ? topk[t * K + lane] : (IdxT)-1;
    const int rank = e >= 0 && e < (IdxT)a.num_experts ? (int)(e / a.local_experts) : -1;
    const unsigned same = __match_any_sync(0xffffffffu, rank);
    unsigned first =
        __ballot_sync(0xffffffffu, rank >= 0 && (same & ((1u << lane) - 1u)) == 0);
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    const bool valid = c < a.hidden;
    while (first != 0) {
      uint4 v[8];
      bool use[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        use[i] = first != 0 && valid;
        const int k = first != 0 ? __ffs(first) - 1 : 0;
        first &= first - 1u;
        v[i] = use[i] ? __ldcg(reinterpret_cast<const uint4 *>(
                            region + (size_t)(t * K + k) * a.hidden + c))
                      : make_uint4(0u, 0u, 0u, 0u);
      }
      /* w = 1: exactly acc + partial */
#pragma unroll
      for (int i = 0; i < 8; ++i)
        if (use[i]) mep_bf16x8_fma(acc, v[i], 1.0f);
    }
    if (valid) *reinterpret_cast<uint4 *>(a.out + (size_t)t * a.hidden + c) = mep_bf16x8_pack(acc);
  }
}

#endif /* MEP_LL_COMBINE_PARTIAL_CUH_ */
