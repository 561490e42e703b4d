/* ll_combine_partial.cuh: the LL combine's pre-reduction on the expert
 * side, when the dispatch carried the routing weights or (LSA) the source
 * pushed them at the start of its combine. Each rank sums, for every token
 * it received, its local slots' expert outputs (w * y, f32 fmaf in k
 * order, from 0) and returns one bf16 partial row per (token, rank) instead
 * of one row per (token, expert): top_k / ranks-per-token times fewer bytes
 * on the link (4x at EP2, top-8). The partial lands in the source's combine
 * region at the row of the token's first slot on that rank, so the region
 * keeps its [max_tokens][top_k] size for any world. The source adds its
 * partials in f32, from 0, in the order the token's ranks first appear in
 * its top-k list, and rounds once to bf16: deterministic, the documented
 * LL sum (ll.h).
 *
 * Pushed weights: the source stores each valid slot's weight into its
 * expert's rank as one 8-byte word carrying the combine's epoch
 * (mep_ll_weight_word); a partial unit loads the word beside its route and
 * waits (bounded) only where the word has not landed yet. No signal and no
 * fence: the word is its own flag.
 *
 * Over LSA the partials travel with their own flags, so no release orders
 * them: as flagged words for small calls (mep_ll_flag_word) and as line
 * partials beyond (mep_ll_line_row_bytes: 128-byte lines whose last 8
 * bytes carry the epoch). Staged transports count their puts.
 *
 * Included by ll_combine_body.cuh; its send body pushes and calls the send
 * part for the sources that get partials, its receive body the sum. */
#ifndef MEP_LL_COMBINE_PARTIAL_CUH_
#define MEP_LL_COMBINE_PARTIAL_CUH_

#include "kernels/common/bf16_vec.cuh"
#include "kernels/ll/ll_launch.cuh"

/* Channels of one warp step: a lane's 8 bf16 channels (one uint4), 256
 * per warp. */
constexpr int kMepPartialStep = 256;
/* Steps of one work unit when the units would take more than a pass or two
 * of the grid's warps (large batches, small grids): a lane then issues
 * every step of a batch of slots as one group (steps x batch = 16 uint4
 * loads) instead of one 512-byte step per slot; the reductions are bound
 * by load latency (one block of 16 warps per SM), and fewer, longer units
 * leave no partial last pass. The send's loads are unpredicated
 * (mep_steps_load_all): predicated ones kept only 4 of the 16 in flight
 * under the kernels' 128-register cap (tools/bench/load_depth.py). Small
 * batches keep one step per unit: more warps, each on its own SM
 * (mep_ll_spread_warp), finish sooner. EP1, H200, hidden 7168, 256
 * experts: the send half at 256 tokens 19.6 -> 17.2 us, at 128 tokens
 * with 24 SMs 24.5 -> 19.7 us; at 1-8 tokens 1.1-1.5 us slower with 4
 * steps than with 1. */
constexpr int kMepPartialWideSteps = 4;
/* Channels of one staged put (GIN, GIN-emulated): a row goes in pieces, so
 * a row's steps spread over several warps instead of one warp walking the
 * whole row (7168 channels: 7 warps of 4 steps, not 1 warp of 28). */
constexpr int kMepPartialPiece = 1024;
/* Channels of a line-partial warp step (4 lines of 60 channels). */
constexpr int kMepLineStep = MEP_LL_LINE_STEP;

/* A lane's first channel in a line-partial step (mep_ll_line_row_bytes):
 * lanes 0-6 of group g carry 8 channels from (7 g + lane) * 8, the flag
 * lane (lane 7) 4 channels from 224 + 4 g. */
__device__ __forceinline__ int mep_line_lane_channel(int lane) {
  const int g = lane >> 3, l = lane & 7;
  return l < 7 ? (7 * g + l) * 8 : 224 + 4 * g;
}
__device__ __forceinline__ bool mep_line_flag_lane(int lane) { return (lane & 7) == 7; }
/* The flag lane's high 8 bytes: the epoch, twice. */
__device__ __forceinline__ uint64_t mep_line_flag_word(uint32_t epoch) {
  return (uint64_t)epoch << 32 | epoch;
}
/* The 8 channels a lane of a line step computes in the send: its own,
 * or for a flag lane the aligned 8 that hold its 4 (the neighbouring flag
 * lane computes the same 8: the same sector, no extra traffic; each
 * channel's sum is the same fmaf chain whoever computes it). */
__device__ __forceinline__ int mep_line_send_channel(int c, bool flag_lane) {
  return flag_lane ? (c & ~7) : c;
}

/* The lowest lane left in `mask`, taken off it, for a batch of loads
 * issued before any is used: *use says whether one was left (lane 0 stands
 * in when not, and its load is skipped). */
__device__ __forceinline__ int mep_take_lane(unsigned *mask, bool *use) {
  *use = *mask != 0;
  const int k = *use ? __ffs(*mask) - 1 : 0;
  *mask &= *mask - 1u;
  return k;
}

/* Lane `lane` (< 32) of a warp computes channels [c + kStride j, + 8)
 * for j < S (those below `limit`; rows are `hidden` channels) of the
 * partial from the slots whose bits are set in `live` (k order, in batches
 * of 16 / S slots, 8 for S = 1); entries holds lane k's route. Every lane
 * runs every shuffle (live is warp-uniform). Per channel the sum is the
 * same fmaf chain in k order whatever S is. */
template <int S, int kStride = kMepPartialStep>
__device__ __forceinline__ void mep_partial_chunks(const __nv_bfloat16 *y, int hidden, int limit,
                                                   mep_ll_route_t entry, unsigned live, int c,
                                                   uint4 out[S]) {
  constexpr int B = S >= 2 ? 16 / S : 8;
  float acc[S][8];
  mep_steps_zero<S>(acc);
  while (live != 0) {
    uint4 v[B][S];
    float w[B];
    bool use[B];
    int first = 0; /* the batch's first slot (always used): the row an
                    * unused entry loads again and ignores */
#pragma unroll
    for (int i = 0; i < B; ++i) {
      const int k = mep_take_lane(&live, &use[i]);
      const int slot = __shfl_sync(0xffffffffu, entry.slot, k);
      if (i == 0) first = slot;
      w[i] = __int_as_float(__shfl_sync(0xffffffffu, entry.weight_bits, k));
      mep_steps_load_all<S, kStride>(v[i], y + (size_t)(use[i] ? slot : first) * hidden, c,
                                     limit);
    }
#pragma unroll
    for (int i = 0; i < B; ++i)
      if (use[i]) mep_steps_fma<S>(acc, v[i], w[i]);
  }
#pragma unroll
  for (int j = 0; j < S; ++j) out[j] = mep_bf16x8_pack(acc[j]);
}

/* The source's side of pushed weights (mep_combine_pushes): each valid
 * slot's weight, as one 8-byte word with this combine's epoch, into its
 * expert's rank at [this rank][token * top_k + k]. Not to this rank: its
 * own units read the weights tensor, so no block of a send launch waits
 * for another block of the same launch (a separate send kernel need not be
 * co-resident). Whole grid. */
template <class Tp>
__device__ __forceinline__ void mep_combine_push_weights(const MepLLParams &p,
                                                         const MepCombineArgs &a,
                                                         uint32_t epoch) {
  const int n = a.tokens * a.top_k;
  const uint64_t base = p.set_off + p.lay.comb_weights +
                        (uint64_t)p.xp.rank * (uint64_t)p.dims.max_tokens * a.top_k * 8u;
  for (int i = blockIdx.x + gridDim.x * threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const int64_t e = a.idx_bytes == 8 ? static_cast<const int64_t *>(a.topk)[i]
                                       : static_cast<const int32_t *>(a.topk)[i];
    if (e < 0 || e >= a.num_experts) continue; /* dispatch sent this slot nowhere */
    const int d = (int)(e / a.local_experts);
    if (d == p.xp.rank) continue; /* read from a.weights there */
    uint64_t *w = static_cast<uint64_t *>(Tp::peer_ptr(p.xp, d, base + (uint64_t)i * 8u));
    mep_st_relaxed_sys(w, mep_ll_weight_word(__float_as_uint(a.weights[i]), epoch));
  }
}

/* The slow path of a pushed weight's read, out of line: source `src`'s
 * word at w once it carries `epoch`. A word that never comes because the
 * source combines another dispatch (its arrival, sent right after its
 * pushes, names another than this block's mep_comb_dident:
 * mep_ll_comb_code) is recorded as
 * MEP_LL_OP_COMBINE_OTHER_DISPATCH at once; an expired wait as
 * COMBINE_WEIGHTS. Both are fatal and give weight 0. */
template <class Tp>
static __device__ __noinline__ uint32_t mep_weight_wait(const MepLLParams &p, const uint64_t *w,
                                                        uint32_t epoch, int src) {
  const uint32_t dident = mep_comb_dident;
  const uint32_t sig = mep_ll_sig_comb_cnt(&p.dims, mep_ll_comb_half(epoch), src);
  const uint64_t base = mep_shadow(p, sig);
  /* the dispatch the source's block 0 arrival names, or dident before it came */
  auto theirs = [&] {
    const uint64_t inc = Tp::read_signal(p.xp, sig) - base;
    const bool coded = ((inc >> MEP_LL_ARRIVAL_GRID_SHIFT) & 0xffffu) != 0;
    return coded ? (uint32_t)(inc & 0xffffffffu) >> MEP_LL_COMB_KIND_BITS : dident;
  };
  uint64_t seen = 0;
  if (mep_wait(p.wc, [&] { return (uint64_t)(uint32_t)mep_ld_relaxed_sys(w); },
               [&](uint64_t v) { return v == epoch || theirs() != dident; }, epoch,
               MEP_LL_OP_COMBINE_WEIGHTS, src, -1, &seen)) {
    const uint64_t word = mep_ld_relaxed_sys(w);
    if ((uint32_t)word == epoch) return (uint32_t)(word >> 32);
    mep_record_timeout(p.wc, MEP_LL_OP_COMBINE_OTHER_DISPATCH, src, -1, dident, theirs());
  }
  return 0u;
}

/* The send half's partial rows for the sources that get them (src_s: their
 * src_tokens words, shared memory, with MEP_LL_SRC_PUSHED where the source
 * pushes its weights: those come from the pushed words, not the route).
 * Units (token, source, piece). LSA: kLines picks the sources this loop
 * serves, line-partial ones (pieces of S 240-channel steps, stored as
 * lines into the source's comb_recv row) or flagged ones (S 256-channel
 * steps, stored as flagged words into its comb_flag row); the other kind
 * is skipped, so a call that mixes them runs both loops. Staged transports
 * compute a kMepPartialPiece-channel piece into the staging row, then put
 * it with a row signal, counted in comb_puts for the count signal the
 * caller sends. */
template <class Tp, int S, bool kLines>
__device__ __forceinline__ void mep_combine_send_partials_at(const MepLLParams &p,
                                                             const MepCombineArgs &a,
                                                             const int *src_s, int longest,
                                                             uint32_t epoch) {
  const int lane = threadIdx.x & 31;
  const int nwarps = gridDim.x * (MEP_LL_THREADS / 32);
  const int gwarp = mep_ll_spread_warp();
  const int R = p.dims.world, M = p.dims.max_tokens, K = a.top_k;
  const uint32_t row_bytes = (uint32_t)a.hidden * 2u;
  const int half = mep_ll_comb_half(epoch);
  const uint32_t row_sig = mep_ll_sig_comb_row(&p.dims, half, p.xp.rank);
  const int piece = Tp::kStaged ? kMepPartialPiece : (kLines ? kMepLineStep : kMepPartialStep) * S;
  const int npieces = (a.hidden + piece - 1) / piece;
  /* token-major, so the first pass of the grid covers every source's first
   * tokens */
  for (int u = gwarp; u < longest * R * npieces; u += nwarps) {
    const int pc = u % npieces, ts = u / npieces, s = ts % R, t = ts / R;
    const int v = src_s[s];
    if (!(v & MEP_LL_SRC_PARTIALS) || t >= MEP_LL_SRC_TOKENS(v)) continue; /* warp-uniform */
    if (!Tp::kStaged && ((v & MEP_LL_SRC_FLAGGED) != 0) == kLines) continue; /* the other loop's */
    mep_ll_route_t entry = lane < K ? a.route[((size_t)s * M + t) * K + lane]
                                    : mep_ll_route_t{MEP_LL_ROUTE_ELSEWHERE, 0};
    /* the pushed word (this rank's own weight) is loaded beside the route,
     * before it is known to be needed: no second round trip once the words
     * have landed */
    const bool pushed = !Tp::kStaged && (v & MEP_LL_SRC_PUSHED) && lane < K;
    const bool own = s == p.xp.rank; /* warp-uniform */
    const uint64_t *wp = reinterpret_cast<const uint64_t *>(
        p.xp.local + p.set_off + p.lay.comb_weights + (((size_t)s * M + t) * K + lane) * 8u);
    const uint64_t word = pushed ? (own ? (uint64_t)__float_as_uint(a.weights[t * K + lane]) << 32
                                        : mep_ld_relaxed_sys(wp))
                                 : 0u;
    const unsigned mine = __ballot_sync(0xffffffffu, entry.slot != MEP_LL_ROUTE_ELSEWHERE);
    if (mine == 0) continue; /* the token has no expert here */
    if (pushed && entry.slot >= 0)
      entry.weight_bits = (int32_t)(own || (uint32_t)word == epoch
                                        ? (uint32_t)(word >> 32)
                                        : mep_weight_wait<Tp>(p, wp, epoch, s));
    const unsigned live = __ballot_sync(0xffffffffu, entry.slot >= 0);
    const int kf = __ffs(mine) - 1;
    const int c0 = pc * piece;
    if constexpr (!Tp::kStaged && kLines) {
      /* lines of [t * K + kf] of the source's comb_recv half: one 512-byte
       * warp store per step, the flag lanes' epoch in the same instruction */
      const bool fl = mep_line_flag_lane(lane);
      const int c = c0 + mep_line_lane_channel(lane);
      uint4 o[S];
      mep_partial_chunks<S, kMepLineStep>(a.y, a.hidden, a.hidden, entry, live,
                                          mep_line_send_channel(c, fl), o);
      const bool high = fl && (c & 7) != 0; /* a flag lane's 4 in the high half */
      char *dst = static_cast<char *>(Tp::peer_ptr(
                      p.xp, s, p.set_off + mep_ll_line_row_off(&p.lay, &p.dims, half,
                                                                (uint64_t)t * K + kf))) +
                  (size_t)pc * S * 512u + 16u * lane;
      const uint64_t flag = mep_line_flag_word(epoch);
#pragma unroll
      for (int j = 0; j < S; ++j)
        if (c0 + j * kMepLineStep < a.hidden) /* warp-uniform */
          mep_st_volatile_u64x2(reinterpret_cast<uint64_t *>(dst + j * 512),
                                high ? (uint64_t)o[j].w << 32 | o[j].z
                                     : (uint64_t)o[j].y << 32 | o[j].x,
                                fl ? flag : (uint64_t)o[j].w << 32 | o[j].z);
    } else if constexpr (!Tp::kStaged) {
      /* [this rank][t] of the source's comb_flag: 4 words per lane-step */
      const int c = c0 + lane * 8;
      uint4 o[S];
      mep_partial_chunks<S>(a.y, a.hidden, a.hidden, entry, live, c, o);
      uint64_t *dst = static_cast<uint64_t *>(Tp::peer_ptr(
          p.xp, s,
          p.set_off + mep_ll_flag_row_off(&p.lay, &p.dims, half, p.xp.rank, t) +
              (uint64_t)c * 4u));
#pragma unroll
      for (int j = 0; j < S; ++j)
        if (c + j * kMepPartialStep < a.hidden) {
          uint64_t *w = dst + j * (kMepPartialStep / 2);
          mep_st_volatile_u64x2(w, mep_ll_flag_word(o[j].x, epoch),
                                mep_ll_flag_word(o[j].y, epoch));
          mep_st_volatile_u64x2(w + 2, mep_ll_flag_word(o[j].z, epoch),
                                mep_ll_flag_word(o[j].w, epoch));
        }
    } else {
      /* GIN reads its source from the window: stage the piece. */
      const int c1 = a.hidden - c0 < piece ? a.hidden : c0 + piece;
      const uint64_t dst_off =
          p.set_off + mep_ll_comb_recv_off(&p.lay, half) + (uint64_t)(t * K + kf) * row_bytes +
          2u * (uint64_t)c0;
      const uint64_t stage_off = p.set_off + p.lay.stage_partial +
                                 ((uint64_t)s * M + t) * row_bytes + 2u * (uint64_t)c0;
      for (int cs = c0; cs < c1; cs += S * kMepPartialStep) {
        const int c = cs + lane * 8;
        uint4 o[S];
        mep_partial_chunks<S>(a.y, a.hidden, c1, entry, live, c, o);
#pragma unroll
        for (int j = 0; j < S; ++j) {
          const int cj = c + j * kMepPartialStep;
          if (cj < c1)
            *reinterpret_cast<uint4 *>(p.xp.local + stage_off + 2u * (uint64_t)(cj - c0)) = o[j];
        }
      }
      __syncwarp();
      Tp::put_warp(p.xp, s, dst_off, nullptr, stage_off, 2u * (uint32_t)(c1 - c0), row_sig);
      if (lane == 0) atomicAdd(&p.comb_puts[s], 1u);
    }
  }
}

/* Which LSA partial kinds a send half's sources take (mep_combine_send_partials). */
#define MEP_LL_KIND_FLAGGED 1
#define MEP_LL_KIND_LINES 2

/* The send partials with the unit width the work calls for (see
 * kMepPartialWideSteps): one step per unit while the units fit in two
 * passes of the grid's warps. Flagged sources (at most flag_tokens tokens
 * each) always take one step; staged transports keep their
 * kMepPartialPiece units, one step at a time. kinds: MEP_LL_KIND_* of
 * this call's LSA sources. */
template <class Tp>
__device__ __forceinline__ void mep_combine_send_partials(const MepLLParams &p,
                                                          const MepCombineArgs &a,
                                                          const int *src_s, int longest,
                                                          uint32_t epoch, int kinds) {
  const int64_t units = (int64_t)longest * p.dims.world *
                        ((a.hidden + kMepPartialStep - 1) / kMepPartialStep);
  const int64_t nwarps = (int64_t)gridDim.x * (MEP_LL_THREADS / 32);
  const bool narrow = units <= 2 * nwarps;
  if constexpr (Tp::kStaged) {
    mep_combine_send_partials_at<Tp, 1, false>(p, a, src_s, longest, epoch);
  } else {
    if (kinds & MEP_LL_KIND_FLAGGED)
      mep_combine_send_partials_at<Tp, 1, false>(p, a, src_s, longest, epoch);
    if (kinds & MEP_LL_KIND_LINES) {
      if (narrow)
        mep_combine_send_partials_at<Tp, 1, true>(p, a, src_s, longest, epoch);
      else
        mep_combine_send_partials_at<Tp, kMepPartialWideSteps, true>(p, a, src_s, longest,
                                                                     epoch);
    }
  }
}

/* The ranks token t reaches, for a receive unit: lane k (< top_k) gets slot
 * k's rank in *rank (-1: none; in the index's own width as dispatch
 * decides, so an int64 id past 2^31 cannot wrap into a valid expert), and
 * the result has the slots where a rank first appears in top-k (the sum's
 * rank order; the row each rank's partial lands in). Every lane calls. */
template <typename IdxT>
__device__ __forceinline__ unsigned mep_token_first_slots(const IdxT *topk, int t, int top_k,
                                                          int num_experts, int local_experts,
                                                          int *rank) {
  const int lane = threadIdx.x & 31;
  const IdxT e = lane < top_k ? topk[t * top_k + lane] : (IdxT)-1;
  *rank = e >= 0 && e < (IdxT)num_experts ? (int)(e / local_experts) : -1;
  const unsigned same = __match_any_sync(0xffffffffu, *rank);
  return __ballot_sync(0xffffffffu, *rank >= 0 && (same & ((1u << lane) - 1u)) == 0);
}

/* The receive's units: (token, S steps) over the grid. Per unit, lane k
 * holds slot k's rank (-1: none; in the index's own width as dispatch
 * decides, so an int64 id past 2^31 cannot wrap into a valid expert) and
 * `first` has the slots where a rank first appears in top-k;
 * sum(t, c, first, rank, acc) adds the token's partials in that order into
 * acc (false: stop, a wait failed), and the unit stores bf16 once. */
template <typename IdxT, int S, typename Sum>
__device__ __forceinline__ bool mep_partial_units(const MepLLParams &p, const MepCombineArgs &a,
                                                  Sum sum) {
  const int lane = threadIdx.x & 31;
  const int nwarps = gridDim.x * (MEP_LL_THREADS / 32);
  const int gwarp = mep_ll_spread_warp();
  const int K = a.top_k;
  const int nunits = (a.hidden + S * kMepPartialStep - 1) / (S * kMepPartialStep);
  const IdxT *topk = reinterpret_cast<const IdxT *>(a.topk);
  for (int u = gwarp; u < a.tokens * nunits; u += nwarps) {
    const int t = u / nunits;
    const int c = (u - t * nunits) * S * kMepPartialStep + lane * 8;
    int rank;
    const unsigned first =
        mep_token_first_slots(topk, t, K, a.num_experts, a.local_experts, &rank);
    float acc[S][8];
    mep_steps_zero<S>(acc);
    if (!sum(t, c, first, rank, acc)) return false;
    mep_steps_store<S>(a.out + (size_t)t * a.hidden, acc, c, a.hidden);
  }
  return true;
}

/* Staged transports' receive reduction (after the count/row waits): out =
 * sum of the token's bf16 partials from comb_recv (the row of the token's
 * first slot on each rank) in the order its ranks first appear in top-k
 * (f32, from 0), bf16 once. */
template <typename IdxT, int S>
__device__ __forceinline__ void mep_combine_sum_partials_at(const MepLLParams &p,
                                                            const MepCombineArgs &a, int half) {
  constexpr int B = S >= 2 ? 16 / S : 8;
  const int K = a.top_k;
  const __nv_bfloat16 *region = reinterpret_cast<const __nv_bfloat16 *>(
      p.xp.local + p.set_off + mep_ll_comb_recv_off(&p.lay, half));
  mep_partial_units<IdxT, S>(p, a, [&](int t, int c, unsigned first, int, float(&acc)[S][8]) {
    while (first != 0) {
      uint4 v[B][S];
      bool use[B];
#pragma unroll
      for (int i = 0; i < B; ++i) {
        const int k = mep_take_lane(&first, &use[i]);
        mep_steps_load<S>(v[i], region + (size_t)(t * K + k) * a.hidden, c, a.hidden, use[i]);
      }
      /* w = 1: exactly acc + partial */
#pragma unroll
      for (int i = 0; i < B; ++i)
        if (use[i]) mep_steps_fma<S>(acc, v[i], 1.0f);
    }
    return true;
  });
}

/* The slow path of a flagged read, out of line: spins until the 4 words
 * at w carry `epoch` (rank `src`'s partial); false when the wait expired
 * (recorded) or another wait aborted. */
static __device__ __noinline__ bool mep_flag_wait(const MepLLParams &p, const uint64_t *w,
                                                  uint32_t epoch, int src) {
  uint64_t seen = 0;
  return mep_wait(p.wc,
                  [&] {
                    uint64_t x0, x1, x2, x3;
                    mep_ld_volatile_u64x2(w, &x0, &x1);
                    mep_ld_volatile_u64x2(w + 2, &x2, &x3);
                    /* the first word not yet of this combine, else the epoch */
                    const uint32_t e0 = (uint32_t)(x0 >> 32), e1 = (uint32_t)(x1 >> 32),
                                   e2 = (uint32_t)(x2 >> 32), e3 = (uint32_t)(x3 >> 32);
                    return (uint64_t)(e0 != epoch ? e0
                                      : e1 != epoch ? e1
                                      : e2 != epoch ? e2
                                                    : e3);
                  },
                  [&](uint64_t v) { return v == epoch; }, epoch, MEP_LL_OP_COMBINE_FLAGGED, src,
                  -1, &seen);
}

/* Loads one lane-step (8 channels) of a flagged partial: the data of the
 * 4 words at w into *v, and the XOR of each word's epoch with `epoch`
 * into *bad (0: every word is of this combine). */
__device__ __forceinline__ void mep_flag_load(const uint64_t *w, uint32_t epoch, uint4 *v,
                                              uint32_t *bad) {
  uint64_t x0, x1, x2, x3;
  mep_ld_volatile_u64x2(w, &x0, &x1);
  mep_ld_volatile_u64x2(w + 2, &x2, &x3);
  *v = make_uint4((uint32_t)x0, (uint32_t)x1, (uint32_t)x2, (uint32_t)x3);
  *bad = ((uint32_t)(x0 >> 32) ^ epoch) | ((uint32_t)(x1 >> 32) ^ epoch) |
         ((uint32_t)(x2 >> 32) ^ epoch) | ((uint32_t)(x3 >> 32) ^ epoch);
}

/* The receive half's sum for a flagged call (this rank sent at most
 * mep_ll_flag_tokens tokens, LSA; after the count waits, which the
 * senders' early arrivals make short): each unit (token, S steps) reads
 * the partials of the ranks the token reaches from comb_flag, in the order
 * they first appear in top-k, waiting (bounded) for words not yet of this
 * combine, and sums them as mep_combine_sum_partials does, so the result
 * is the same bits. A batch's loads (up to 4 ranks at one step, 1 at
 * four) are all issued before its first flag check. A failed wait ends
 * the warp's units. */
template <typename IdxT, int S>
__device__ __forceinline__ bool mep_combine_sum_flagged_at(const MepLLParams &p,
                                                           const MepCombineArgs &a,
                                                           uint32_t epoch) {
  constexpr int B = S >= 2 ? 1 : 4;
  const int half = mep_ll_comb_half(epoch);
  return mep_partial_units<IdxT, S>(p, a, [&](int t, int c, unsigned first, int rank,
                                              float(&acc)[S][8]) {
    while (first != 0) {
      uint4 v[B][S];
      uint32_t bad[B][S];
      bool use[B], ok = true;
      const uint64_t *row[B];
      int src[B];
      /* every load first, then the flags: one round trip when all landed */
#pragma unroll
      for (int i = 0; i < B; ++i) {
        const int k = mep_take_lane(&first, &use[i]);
        src[i] = __shfl_sync(0xffffffffu, rank, k);
        row[i] = reinterpret_cast<const uint64_t *>(
                     p.xp.local + p.set_off +
                     mep_ll_flag_row_off(&p.lay, &p.dims, half, use[i] ? src[i] : 0, t)) +
                 c / 2;
#pragma unroll
        for (int j = 0; j < S; ++j) {
          bad[i][j] = 0;
          v[i][j] = make_uint4(0u, 0u, 0u, 0u);
          if (use[i] && c + j * kMepPartialStep < a.hidden)
            mep_flag_load(row[i] + j * (kMepPartialStep / 2), epoch, &v[i][j], &bad[i][j]);
        }
      }
#pragma unroll
      for (int i = 0; i < B; ++i)
#pragma unroll
        for (int j = 0; j < S; ++j)
          while (ok && bad[i][j] != 0) { /* not landed yet: wait, then read again */
            const uint64_t *w = row[i] + j * (kMepPartialStep / 2);
            if (mep_flag_wait(p, w, epoch, src[i]))
              mep_flag_load(w, epoch, &v[i][j], &bad[i][j]);
            else
              ok = false;
          }
      if (__any_sync(0xffffffffu, !ok)) return false;
      /* w = 1: exactly acc + partial, in first-appearance order */
#pragma unroll
      for (int i = 0; i < B; ++i)
        if (use[i]) mep_steps_fma<S>(acc, v[i], 1.0f);
    }
    return true;
  });
}

/* One step of a line-partial row for the lines sum: this lane's 16 bytes
 * at `at` into *v (a flag lane's: its 4 channels, then zeros; a step past
 * the call's hidden is not read), and bit j of *bad set where this lane is
 * a flag lane and its flag is not `flag` (the line has not landed yet). */
__device__ __forceinline__ void mep_line_load(const char *at, bool in_row, bool flag_lane,
                                              uint64_t flag, int j, uint4 *v, uint32_t *bad) {
  uint64_t x0 = 0, x1 = flag;
  if (in_row) mep_ld_volatile_u64x2(reinterpret_cast<const uint64_t *>(at), &x0, &x1);
  *v = make_uint4((uint32_t)x0, (uint32_t)(x0 >> 32), flag_lane ? 0u : (uint32_t)x1,
                  flag_lane ? 0u : (uint32_t)(x1 >> 32));
  if (flag_lane && x1 != flag) *bad |= 1u << j;
}

/* The slow path of a line read, out of line: spins until the flag lane's
 * flag (the high 8 of its 16 bytes at w) is `flag` (rank `src`'s line);
 * false when the wait expired (recorded) or another wait aborted. */
static __device__ __noinline__ bool mep_line_wait(const MepLLParams &p, const uint64_t *w,
                                                  uint64_t flag, int src) {
  uint64_t seen = 0;
  return mep_wait(p.wc,
                  [&] {
                    uint64_t x0, x1;
                    mep_ld_volatile_u64x2(w, &x0, &x1);
                    return x1;
                  },
                  [&](uint64_t v) { return v == flag; }, flag, MEP_LL_OP_COMBINE_FLAGGED, src, -1,
                  &seen);
}

/* The receive half's sum for a call above the flagged limit (LSA, after
 * the count waits, which the senders' early arrivals make short): each
 * unit (token, S 240-channel steps) loads, for the ranks the token reaches
 * in the order they first appear in top-k (B ranks a batch), the lines of
 * its steps from comb_recv [t * K + that rank's first slot]; a line is
 * taken once the flag lane of the same load saw this combine's epoch, else
 * the flag lane waits (bounded) and the warp loads the rank's steps again.
 * Every lane adds each partial of its channels (a flag lane's 4) in f32
 * from 0 and stores bf16 once: the same bits as the flagged and staged
 * sums. A failed wait ends the warp's units. */
template <typename IdxT, int S>
__device__ __forceinline__ bool mep_combine_sum_lines_at(const MepLLParams &p,
                                                         const MepCombineArgs &a,
                                                         uint32_t epoch) {
  constexpr int B = S >= 2 ? 2 : 4;
  const int lane = threadIdx.x & 31;
  const bool fl = mep_line_flag_lane(lane);
  const int nwarps = gridDim.x * (MEP_LL_THREADS / 32);
  const int gwarp = mep_ll_spread_warp();
  const int K = a.top_k;
  const int half = mep_ll_comb_half(epoch);
  const int nunits = (a.hidden + S * kMepLineStep - 1) / (S * kMepLineStep);
  const IdxT *topk = reinterpret_cast<const IdxT *>(a.topk);
  const uint64_t flag = mep_line_flag_word(epoch);
  const char *region = reinterpret_cast<const char *>(p.xp.local) + p.set_off;
  for (int u = gwarp; u < a.tokens * nunits; u += nwarps) {
    const int t = u / nunits, un = u - t * nunits;
    const int c0 = un * S * kMepLineStep;
    int rank;
    unsigned first = mep_token_first_slots(topk, t, K, a.num_experts, a.local_experts, &rank);
    float acc[S][8];
    mep_steps_zero<S>(acc);
    while (first != 0) {
      uint4 v[B][S];
      uint32_t bad[B];
      bool use[B];
      const char *at[B];
      int src[B];
      /* every load first, then the flags: one round trip when all landed */
#pragma unroll
      for (int i = 0; i < B; ++i) {
        const int k = mep_take_lane(&first, &use[i]);
        src[i] = __shfl_sync(0xffffffffu, rank, k);
        at[i] = region + mep_ll_line_row_off(&p.lay, &p.dims, half, (uint64_t)t * K + k) +
                (size_t)un * S * 512u + 16u * lane;
        bad[i] = 0;
#pragma unroll
        for (int j = 0; j < S; ++j)
          mep_line_load(at[i] + j * 512, use[i] && c0 + j * kMepLineStep < a.hidden, fl, flag, j,
                        &v[i][j], &bad[i]);
      }
#pragma unroll
      for (int i = 0; i < B; ++i)
        while (__any_sync(0xffffffffu, bad[i] != 0)) { /* not landed yet: wait, load again */
          const bool ok =
              bad[i] == 0 ||
              mep_line_wait(p, reinterpret_cast<const uint64_t *>(at[i] + (__ffs(bad[i]) - 1) * 512),
                            flag, src[i]);
          if (__any_sync(0xffffffffu, !ok)) return false;
          bad[i] = 0;
#pragma unroll
          for (int j = 0; j < S; ++j)
            mep_line_load(at[i] + j * 512, c0 + j * kMepLineStep < a.hidden, fl, flag, j,
                          &v[i][j], &bad[i]);
        }
      /* w = 1: exactly acc + partial, in first-appearance order */
#pragma unroll
      for (int i = 0; i < B; ++i)
        if (use[i]) mep_steps_fma<S>(acc, v[i], 1.0f);
    }
    const int c = c0 + mep_line_lane_channel(lane);
    __nv_bfloat16 *orow = a.out + (size_t)t * a.hidden;
#pragma unroll
    for (int j = 0; j < S; ++j)
      if (c + j * kMepLineStep < a.hidden) {
        const uint4 o = mep_bf16x8_pack(acc[j]);
        if (fl) /* 4 channels, 8-byte aligned */
          *reinterpret_cast<uint2 *>(orow + c + j * kMepLineStep) = make_uint2(o.x, o.y);
        else
          *reinterpret_cast<uint4 *>(orow + c + j * kMepLineStep) = o;
      }
  }
  return true;
}

/* The lines sum with the unit width the host picked (recv_steps). */
template <typename IdxT>
__device__ __forceinline__ bool mep_combine_sum_lines(const MepLLParams &p,
                                                      const MepCombineArgs &a, uint32_t epoch) {
  return a.recv_steps == 1 ? mep_combine_sum_lines_at<IdxT, 1>(p, a, epoch)
                           : mep_combine_sum_lines_at<IdxT, kMepPartialWideSteps>(p, a, epoch);
}

/* How many units mep_combine_sum_lines deals this call, one per warp in
 * mep_ll_spread_warp's order (recv_steps line steps wide). */
__device__ __forceinline__ int mep_combine_line_units(const MepCombineArgs &a) {
  const int width = (a.recv_steps == 1 ? 1 : kMepPartialWideSteps) * kMepLineStep;
  return a.tokens * ((a.hidden + width - 1) / width);
}

/* False when a wait failed (recorded). One step per unit whatever
 * recv_steps says: a flagged call has at most 16 tokens, so the wide units
 * would matter only on a grid of under 28 SMs, and a second instance of
 * the loop would grow every LSA receive kernel (the units are a grid-stride
 * loop, correct on any grid). */
template <typename IdxT>
__device__ __forceinline__ bool mep_combine_sum_flagged(const MepLLParams &p,
                                                        const MepCombineArgs &a, uint32_t epoch) {
  return mep_combine_sum_flagged_at<IdxT, 1>(p, a, epoch);
}

/* The staged sum with the unit width the host picked
 * (MepCombineArgs.recv_steps, mep_combine_recv_steps). */
template <typename IdxT>
__device__ __forceinline__ void mep_combine_sum_partials(const MepLLParams &p,
                                                         const MepCombineArgs &a, int half) {
  if (a.recv_steps == 1)
    mep_combine_sum_partials_at<IdxT, 1>(p, a, half);
  else
    mep_combine_sum_partials_at<IdxT, kMepPartialWideSteps>(p, a, half);
}

#endif /* MEP_LL_COMBINE_PARTIAL_CUH_ */
