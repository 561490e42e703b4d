/* ll_combine_body.cuh: the LL combine's two halves as device functions,
 * shared by the separate send/receive kernels (hooks) and the fused kernel.
 *
 * Two reductions, picked per source rank by whether its dispatch carried
 * the weights (MEP_LL_SRC_WEIGHTED). Without: every valid slot's expert
 * output row goes back to its source rank, into the (token, k) row of the
 * source's combine region, and the receive half computes out[t] =
 * sum_k w[t,k] * y_k in f32, k ascending, bf16 out. With: the expert side
 * pre-reduces (ll_combine_partial.cuh). Either way the send half ends
 * with one count signal per source rank (LSA: every block's arrival;
 * staged: the last block's add); every receiving block waits all peers'
 * counts (and staged transports' rows), and at its end advances its own
 * copies of the signal shadows. */
#ifndef MEP_LL_COMBINE_BODY_CUH_
#define MEP_LL_COMBINE_BODY_CUH_

#include "kernels/ll/ll_launch.cuh"

/* Both halves' arguments (device copy of mep_ll_combine_args_t). */
struct MepCombineArgs {
  const __nv_bfloat16 *y;
  const int32_t *recv_count, *slot_src, *src_count;
  const void *topk;
  const float *weights;
  __nv_bfloat16 *out;
  int tokens, hidden, top_k, num_experts, local_experts;
  const mep_ll_route_t *route;
  const int32_t *src_tokens; /* per source: tokens | MEP_LL_SRC_WEIGHTED */
  int partials;              /* this rank's dispatch was weighted */
  int recv_steps;            /* 256-channel steps per receive unit */
};

#include "kernels/ll/ll_combine_partial.cuh"

/* Steps (256 channels) of one per-slot receive unit: a lane loads that
 * many vectors of each of a batch of 8 slots before the first FMA (EP1,
 * H200, hidden 7168: the receive half at 128 / 256 tokens 10.3 / 14.4 ->
 * 9.5 / 12.8 us against one step; no change at 1-32 tokens). */
constexpr int kMepSlotRecvSteps = 2;

/* Steps per receive unit: per-slot sums kMepSlotRecvSteps; partial sums
 * one while a unit per warp of the whole grid covers the call, else
 * kMepPartialWideSteps (EP1, H200, hidden 7168: 128 / 256 tokens 7.8 /
 * 10.5 -> 6.8 / 7.3 us; at 8-32 tokens 0.2-0.5 us slower than one step). */
static inline int mep_combine_recv_steps(int grid_max, const mep_ll_combine_args_t *a) {
  if (!a->partials) return kMepSlotRecvSteps;
  const int64_t units = (int64_t)a->num_tokens * ((a->hidden + 255) / 256);
  return units <= (int64_t)grid_max * (MEP_LL_THREADS / 32) ? 1 : kMepPartialWideSteps;
}

/* grid_max: mep_ll_grid(ctx), which the launcher reads once per launch. */
static inline MepCombineArgs mep_combine_args(const mep_ll_ctx_t *ctx,
                                              const mep_ll_combine_args_t *a, int grid_max) {
  MepCombineArgs k;
  k.y = (const __nv_bfloat16 *)a->y;
  k.recv_count = a->recv_count;
  k.slot_src = a->slot_src;
  k.src_count = a->src_count;
  k.topk = a->topk_idx;
  k.weights = a->topk_weights;
  k.out = (__nv_bfloat16 *)a->out;
  k.tokens = a->num_tokens;
  k.hidden = a->hidden;
  k.top_k = a->top_k;
  k.num_experts = a->num_experts;
  k.local_experts = a->num_experts / ctx->dims.world;
  k.route = a->route;
  k.src_tokens = a->src_tokens;
  k.partials = a->partials != 0;
  k.recv_steps = mep_combine_recv_steps(grid_max, a);
  return k;
}

/* The pointer rules of each half (after mep_ll_combine_check). */
static inline mep_kstatus_t mep_combine_check_send_ptrs(const char *op,
                                                          const mep_ll_combine_args_t *a) {
  if (a->y == nullptr || a->route == nullptr || a->src_tokens == nullptr)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "%s: y and the handle's route and src_tokens must not be NULL", op);
  return MEP_KSTATUS_OK;
}
static inline mep_kstatus_t mep_combine_check_recv_ptrs(const char *op,
                                                          const mep_ll_combine_args_t *a) {
  /* Pre-reduced partials need no weights on the source side. */
  if (a->partials != 0 && a->partials != 1)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT, "%s: partials is %d; it must be 0 or 1",
                             op, a->partials);
  /* No tokens: nothing reads them (an empty tensor may carry NULL data). */
  if (a->num_tokens > 0 && (a->topk_idx == nullptr || a->out == nullptr ||
                            (!a->partials && a->topk_weights == nullptr)))
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "%s: topk_idx, out and (without a dispatch that carried the "
                             "weights) topk_weights must not be NULL", op);
  return MEP_KSTATUS_OK;
}

/* Dynamic shared memory of each half (mep_combine_send_body,
 * mep_combine_recv_body). */
static inline size_t mep_combine_send_smem(const mep_ll_ctx_t *ctx, const MepCombineArgs *k) {
  return (size_t)(k->local_experts + ctx->dims.world) * sizeof(int);
}
static inline size_t mep_combine_recv_smem(const mep_ll_ctx_t *ctx) {
  return (size_t)ctx->dims.world * 2 * sizeof(uint64_t);
}

/* Receive units, one per warp: (token, k->recv_steps 256-channel steps). */
static inline int64_t mep_combine_recv_units(const MepCombineArgs *k) {
  const int step = 256 * k->recv_steps;
  return (int64_t)k->tokens * ((k->hidden + step - 1) / step);
}

/* smem: E_local + R ints of dynamic shared memory (rows per local expert,
 * then each source's src_tokens word). Sources whose dispatch was weighted
 * get pre-reduced partials, the others one row per slot. */
template <class Tp>
__device__ __forceinline__ void mep_combine_send_body(const MepLLParams &p,
                                                      const MepCombineArgs &a, int *smem) {
  const int lane = threadIdx.x & 31;
  const int nwarps = gridDim.x * (MEP_LL_THREADS / 32);
  const int gwarp = mep_ll_spread_warp();
  const int R = p.dims.world, cap = R * p.dims.max_tokens;
  const int EL = a.local_experts;
  const uint32_t row_bytes = (uint32_t)a.hidden * 2u;
  const uint32_t row_sig = mep_ll_sig_comb_row(&p.dims, p.xp.rank);
  int *count_s = smem, *src_s = smem + EL;

  /* Every block keeps the counts in shared memory and stops at the longest
   * expert (or source): no dependent global load per visited slot. */
  __shared__ int longest, longest_tokens, any_weighted, any_plain;
  if (threadIdx.x == 0) longest = longest_tokens = any_weighted = any_plain = 0;
  __syncthreads();
  for (int le = threadIdx.x; le < EL; le += blockDim.x) {
    const int c = __ldg(a.recv_count + le);
    count_s[le] = c;
    if (c > 0) atomicMax(&longest, c < cap ? c : cap);
  }
  for (int r = threadIdx.x; r < R; r += blockDim.x) {
    const int v = __ldg(a.src_tokens + r);
    src_s[r] = v;
    const int n = MEP_LL_SRC_TOKENS(v);
    if (v & MEP_LL_SRC_WEIGHTED) {
      any_weighted = 1;
      if (n > 0) atomicMax(&longest_tokens, n < p.dims.max_tokens ? n : p.dims.max_tokens);
    } else {
      any_plain = 1;
    }
  }
  __syncthreads();
  if (any_weighted) mep_combine_send_partials<Tp>(p, a, src_s, longest_tokens);

  /* Slots are visited slot-index-major (u = s * E_local + le), so the first
   * pass of the grid covers the first few rows of every expert, where the
   * valid rows are: one row per warp instead of several valid rows landing
   * on the same warp (expert-major order with a stride of the warp count). */
  for (int u = gwarp; any_plain && u < EL * longest; u += nwarps) {
    const int s = u / EL, le = u - s * EL;
    const int j = le * cap + s;
    if (s >= count_s[le]) continue;
    const int v = __ldg(a.slot_src + j);
    const int r = MEP_LL_SLOT_RANK(v), t = MEP_LL_SLOT_TOKEN(v), k = MEP_LL_SLOT_K(v);
    if (src_s[r] & MEP_LL_SRC_WEIGHTED) continue; /* pre-reduced above */
    const __nv_bfloat16 *yrow = a.y + (size_t)j * a.hidden;
    const uint64_t stage_off = p.set_off + p.lay.stage + (uint64_t)j * row_bytes;
    if (Tp::kStaged) {
      /* GIN reads its source from the window */
      mep_copy_warp(p.xp.local + stage_off, yrow, row_bytes);
      __syncwarp();
    }
    Tp::put_warp(p.xp, r, p.set_off + p.lay.comb_recv + (uint64_t)(t * a.top_k + k) * row_bytes,
                 yrow, stage_off, row_bytes, row_sig);
  }

  /* LSA: every block's arrival releases its rows; the receiver needs no
   * row count. */
  if constexpr (!Tp::kRowSignals) {
    mep_arrive<Tp>(p, mep_ll_sig_comb_cnt(&p.dims, p.xp.rank), [](int) { return (uint64_t)1; });
    return;
  }
  /* Staged: one count signal per source, 1 + the rows it must wait for
   * (partial puts, or every slot row from it). */
  if (mep_last_block(&p.tickets[MEP_LL_TICKET_COMBINE_SEND])) {
    for (int r = threadIdx.x / 32; r < R; r += MEP_LL_THREADS / 32) {
      int count = 0;
      if (src_s[r] & MEP_LL_SRC_WEIGHTED) {
        if (Tp::kStaged && lane == 0) {
          count = (int)mep_ld_volatile_u32(&p.comb_puts[r]);
          p.comb_puts[r] = 0;
        }
      } else {
        for (int le = lane; le < EL; le += 32) count += __ldg(a.src_count + le * R + r);
#pragma unroll
        for (int m = 16; m >= 1; m >>= 1) count += __shfl_xor_sync(0xffffffffu, count, m);
      }
      if (lane == 0)
        Tp::signal(p.xp, r, mep_ll_sig_comb_cnt(&p.dims, p.xp.rank), (uint64_t)count + 1);
    }
  }
  Tp::flush_warp(p.xp);
}

/* The per-slot reduction of the receive half (the dispatch carried no
 * weights): out[t] = sum_k w[t,k] * y_k. */
template <typename IdxT>
__device__ __forceinline__ void mep_combine_sum_slots(const MepLLParams &p,
                                                      const MepCombineArgs &a) {
  constexpr int S = kMepSlotRecvSteps;
  const int lane = threadIdx.x & 31;
  /* Work unit = (token, S 256-channel steps): T * ceil(H / 256 S) units
   * spread over every warp of the grid (not one warp per token), and each
   * unit issues the loads of up to 8 slots' rows before the first FMA. No
   * shuffles: every branch below may diverge safely (a hidden that is not a
   * multiple of 256 leaves some lanes of the last step idle). */
  const int nwarps = gridDim.x * (MEP_LL_THREADS / 32);
  const int gwarp = mep_ll_spread_warp();
  const int K = a.top_k;
  const uint32_t row_elems = (uint32_t)a.hidden;
  const int nunits = (a.hidden + S * 256 - 1) / (S * 256);
  const __nv_bfloat16 *region =
      reinterpret_cast<const __nv_bfloat16 *>(p.xp.local + p.set_off + p.lay.comb_recv);
  const IdxT *topk = reinterpret_cast<const IdxT *>(a.topk);
  for (int u = gwarp; u < a.tokens * nunits; u += nwarps) {
    const int t = u / nunits;
    const int c = (u - t * nunits) * S * 256 + lane * 8;
    float acc[S][8];
    mep_steps_zero<S>(acc);
    for (int k0 = 0; k0 < K; k0 += 8) {
      uint4 v[8][S];
      float w[8];
      bool use[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int k = k0 + i;
        /* in the index's own width, as dispatch decides (an int64 id past
         * 2^31 must not wrap into a valid expert) */
        const IdxT e = k < K ? topk[t * K + k] : (IdxT)-1;
        w[i] = k < K ? a.weights[t * K + k] : 0.f;
        use[i] = e >= 0 && e < (IdxT)a.num_experts;
        mep_steps_load<S, true>(v[i], region + (size_t)(t * K + k) * row_elems, c, a.hidden,
                                use[i]);
      }
      /* k ascending, one fmaf per slot: the documented (deterministic)
       * order, unchanged. */
#pragma unroll
      for (int i = 0; i < 8; ++i)
        if (use[i]) mep_steps_fma<S>(acc, v[i], w[i]);
    }
    mep_steps_store<S>(a.out + (size_t)t * a.hidden, acc, c, a.hidden);
  }
}

/* smem: 2 R u64 (each source's count and row signal shadows after this
 * receive). */
template <class Tp, typename IdxT>
__device__ __forceinline__ void mep_combine_recv_body(const MepLLParams &p,
                                                      const MepCombineArgs &a, int *smem) {
  __shared__ int failed;
  const int R = p.dims.world;
  uint64_t *next = reinterpret_cast<uint64_t *>(smem);
  if (threadIdx.x == 0) failed = 0;
  __syncthreads();
  for (int r = threadIdx.x; r < R; r += blockDim.x) {
    uint64_t base = 0, increase = 0, code = 0;
    if (mep_wait_count<Tp>(p, mep_ll_sig_comb_cnt(&p.dims, r), MEP_LL_OP_COMBINE_RECV, r, &base,
                           &increase, &code)) {
      next[r] = base + increase;
      if (Tp::kRowSignals) { /* the code is 1 + the rows to wait for */
        const uint32_t rs = mep_ll_sig_comb_row(&p.dims, r);
        next[R + r] = mep_shadow(p, rs) + (code - 1);
        uint64_t rseen;
        if (!mep_wait_ge(p.wc, [&] { return Tp::read_signal(p.xp, rs); }, next[R + r],
                         MEP_LL_OP_COMBINE_RECV, r, -1, &rseen))
          failed = 1;
      }
    } else {
      failed = 1;
    }
  }
  __syncthreads();
  if (failed) return;

  if (a.partials)
    mep_combine_sum_partials<IdxT>(p, a);
  else
    mep_combine_sum_slots<IdxT>(p, a);

  /* Only this block reads its shadow copies: no grid-wide ticket. */
  mep_store_shadows<Tp>(p, next, [&](int r) { return mep_ll_sig_comb_cnt(&p.dims, r); },
                        [&](int r) { return mep_ll_sig_comb_row(&p.dims, r); });
}

#endif /* MEP_LL_COMBINE_BODY_CUH_ */
