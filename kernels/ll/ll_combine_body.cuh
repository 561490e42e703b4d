/* ll_combine_body.cuh: the LL combine's two halves as device functions,
 * shared by the separate send/receive kernels (hooks) and the fused kernel.
 *
 * Two reductions, one sum (the rank order, ll.h). The expert side
 * pre-reduces (ll_combine_partial.cuh) for a source whose dispatch carried
 * the weights (MEP_LL_SRC_WEIGHTED) and, over LSA, for every other source,
 * which pushes its weights at the start of the combine (MEP_LL_SRC_PUSHED).
 * Over staged transports the others get every valid slot's expert output
 * row back, into the (token, k) row of the source's combine region, and
 * the receive half forms the same per-rank partials and their sum. Over
 * LSA the partials carry their own flags: flagged words for a source of at
 * most mep_ll_flag_tokens tokens, line partials beyond (ll_layout.h).
 * Either way the send half gives one count signal per source rank (LSA:
 * every block's relaxed arrival at its start, which only keeps the ranks
 * in step; staged: the last block's add after its puts); every receiving
 * block waits all peers' counts (and staged transports' rows), and at its
 * end advances its own copies of the signal shadows. */
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
  /* The sources' partials come back to this rank: its dispatch was
   * weighted, or it pushes its weights (push_weights). */
  int partials;
  int push_weights; /* mep_combine_pushes */
  int idx_bytes;    /* topk's element size: 4 or 8 */
  int recv_steps;   /* 256-channel steps per receive unit */
  int dispatch_set;
  const uint32_t *disp_tags; /* the dispatch set's tag words (ll_launch.cuh's p.tags) */
};

/* Whether this rank's combine pushes its weights to the expert ranks
 * (mep_ll_weight_word), which then pre-reduce: over LSA, whenever its
 * dispatch carried no weights. Every rank decides the same (the expert
 * side from the dispatch's src_tokens), and the sum is the same either way
 * (the rank order, ll.h). Staged transports send one row per slot instead,
 * summed here in that order. */
static inline int mep_combine_pushes(const mep_ll_ctx_t *ctx, const mep_ll_combine_args_t *a) {
  return ctx->transport == MEP_LL_TRANSPORT_LSA && !a->partials;
}
/* The expert side's flag for such a source, beside MEP_LL_SRC_WEIGHTED in
 * the send half's shared copy of src_tokens. */
#define MEP_LL_SRC_PUSHED (1 << 17)
#define MEP_LL_SRC_PARTIALS (MEP_LL_SRC_WEIGHTED | MEP_LL_SRC_PUSHED)
/* ... and for a source that gets flagged partials (mep_combine_flagged). */
#define MEP_LL_SRC_FLAGGED (1 << 18)
/* The code of an LSA combine arrival (block 0's): the sender's view of the
 * source, line partials or flagged words, checked by the source's receive
 * (a disagreement is recorded as MEP_LL_OP_BAD_SIGNAL instead of reading
 * the wrong region), and above those two bits the dispatch the sender's
 * combine answers (mep_ll_disp_ident: 17 bits). */
#define MEP_LL_COMB_LINES 1u
#define MEP_LL_COMB_FLAGGED 2u
#define MEP_LL_COMB_KIND_BITS 2
static inline MEP_HD uint32_t mep_ll_comb_code(uint32_t kind, uint32_t tag) {
  return kind | (tag << MEP_LL_COMB_KIND_BITS);
}
/* A staged combine's count add: 1 + the rows to wait for (below bit 32),
 * and the dispatch it answers above. */
#define MEP_LL_COMB_TAG_SHIFT 32
static inline MEP_HD uint64_t mep_ll_comb_count(uint32_t rows, uint32_t tag) {
  return (uint64_t)rows + 1u + ((uint64_t)tag << MEP_LL_COMB_TAG_SHIFT);
}

/* The dispatch this block's combine answers (mep_ll_disp_ident), set by
 * thread 0 at the start of the send half, read after its first barrier:
 * in shared memory rather than a register that would be live across the
 * whole send half (it made the fused line kernel spill). */
static __shared__ uint32_t mep_comb_dident;

/* Whether a combine's source with `tokens` tokens gets flagged partials
 * (mep_ll_flag_word): over LSA, small calls. The source decides from its
 * own token count, the experts' ranks from the count its dispatch sent:
 * the same number. */
template <class Tp>
__device__ __forceinline__ bool mep_combine_flagged(const MepLLParams &p, int tokens) {
  return !Tp::kStaged && tokens <= (int)p.lay.flag_tokens;
}

#include "kernels/ll/ll_combine_partial.cuh"
#include "kernels/ll/ll_combine_wrap.cuh"

/* Steps (256 channels) of one per-slot receive unit (staged transports;
 * over LSA every combine pre-reduces). One: the rank-order sum holds all 8
 * slots' vectors and a partial beside the sum, and two steps spill. */
constexpr int kMepSlotRecvSteps = 1;

/* Steps per receive unit: per-slot sums kMepSlotRecvSteps; partial sums
 * one while a unit per warp of the whole grid covers the call, else
 * kMepPartialWideSteps (EP1, H200, hidden 7168: 128 / 256 tokens 7.8 /
 * 10.5 -> 6.8 / 7.3 us; at 8-32 tokens 0.2-0.5 us slower than one step). */
static inline int mep_combine_recv_steps(int grid_max, const mep_ll_combine_args_t *a,
                                         int partials) {
  if (!partials) return kMepSlotRecvSteps;
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
  k.push_weights = mep_combine_pushes(ctx, a);
  k.partials = a->partials != 0 || k.push_weights;
  k.idx_bytes = a->topk_idx_bytes;
  k.recv_steps = mep_combine_recv_steps(grid_max, a, k.partials);
  k.dispatch_set = a->dispatch_set;
  k.disp_tags = (const uint32_t *)((const char *)ctx->state +
                                   mep_ll_state_layout(&ctx->dims).tags) +
                (uint64_t)a->dispatch_set * MEP_LL_SHADOW_SLOTS *
                    mep_ll_tag_words(ctx->dims.world);
  return k;
}

/* The pointer rules of each half (after mep_ll_combine_check). */
static inline mep_kstatus_t mep_combine_check_send_ptrs(const char *op, const mep_ll_ctx_t *ctx,
                                                          const mep_ll_combine_args_t *a) {
  if (a->y == nullptr || a->route == nullptr || a->src_tokens == nullptr)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "%s: y and the handle's route and src_tokens must not be NULL", op);
  if (mep_combine_pushes(ctx, a) && a->num_tokens > 0 &&
      (a->topk_idx == nullptr || a->topk_weights == nullptr))
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "%s: topk_idx and topk_weights must not be NULL: over LSA a combine "
                             "whose dispatch carried no weights sends them to the experts' ranks",
                             op);
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
  /* 2 R shadows, then the failure word and the count waiter's state */
  return (size_t)ctx->dims.world * 2 * sizeof(uint64_t) + 2 * sizeof(int);
}
/* Where the fused kernel's receive half keeps its shared memory: after
 * the send half's, 8-byte aligned, in ints (a warp's receive may start
 * while other warps of its block still read the send's). */
__host__ __device__ inline int mep_combine_recv_smem_off(int local_experts, int world) {
  return (local_experts + world + 1) & ~1;
}
/* The receive half's two block words (LSA), after its 2 R shadows: the
 * failure word and the count waiter's state (mep_combine_line_block_counts);
 * zeroed before a barrier that comes before the receive. */
__device__ __forceinline__ void mep_combine_recv_flag_zero(int *recv_smem, int world) {
  if (threadIdx.x == 0) recv_smem[4 * world] = recv_smem[4 * world + 1] = 0;
}

/* Receive units, one per warp: (token, k->recv_steps 256-channel steps). */
static inline int64_t mep_combine_recv_units(const MepCombineArgs *k) {
  const int step = 256 * k->recv_steps;
  return (int64_t)k->tokens * ((k->hidden + step - 1) / step);
}

/* smem: E_local + R ints of dynamic shared memory (rows per local expert,
 * then each source's src_tokens word). Sources whose dispatch was weighted,
 * and over LSA every source (the others push their weights), get
 * pre-reduced partials; over staged transports the others one row per
 * slot. Returns the epoch. The dispatch this combine answers
 * (mep_comb_dident) is read at the start: the set's next dispatch may
 * start once this half's arrivals are in, and replaces its tag. */
template <class Tp>
__device__ __forceinline__ uint32_t mep_combine_send_body(const MepLLParams &p,
                                                      const MepCombineArgs &a, int *smem) {
  const int lane = threadIdx.x & 31;
  const int nwarps = gridDim.x * (MEP_LL_THREADS / 32);
  const int gwarp = mep_ll_spread_warp();
  const int R = p.dims.world, cap = R * p.dims.max_tokens;
  const int EL = a.local_experts;
  const uint32_t row_bytes = (uint32_t)a.hidden * 2u;
  int *count_s = smem, *src_s = smem + EL;

  /* This combine's epoch: every rank counts the combines on the set. Its
   * parity picks the half of the combine regions and signals. */
  const uint32_t epoch = mep_ll_next_epoch(mep_tag(p, R + 1));
  if (threadIdx.x == 0)
    mep_comb_dident = mep_ll_disp_ident(
        a.disp_tags[(uint64_t)blockIdx.x * mep_ll_tag_words(R) + (uint32_t)R], a.dispatch_set);
  const int half = mep_ll_comb_half(epoch);
  const uint32_t row_sig = mep_ll_sig_comb_row(&p.dims, half, p.xp.rank);
  const uint32_t cnt_sig = mep_ll_sig_comb_cnt(&p.dims, half, p.xp.rank);
  /* First, so the words are on their way before anything else. */
  if constexpr (!Tp::kStaged)
    if (a.push_weights) mep_combine_push_weights<Tp>(p, a, epoch);

  /* Every block keeps the counts in shared memory and stops at the longest
   * expert (or source): no dependent global load per visited slot. */
  __shared__ int longest, longest_tokens, any_partials, any_plain, kinds;
  if (threadIdx.x == 0) longest = longest_tokens = any_partials = any_plain = kinds = 0;
  __syncthreads(); /* also: every thread has read this block's epoch copy, and
                    * mep_comb_dident is set */
  /* Over LSA every source gets partials (weighted, or pushing): the
   * per-slot pass and its counts are compiled out of those kernels. */
  if constexpr (Tp::kStaged)
    for (int le = threadIdx.x; le < EL; le += blockDim.x) {
      const int c = __ldg(a.recv_count + le);
      count_s[le] = c;
      if (c > 0) atomicMax(&longest, c < cap ? c : cap);
    }
  for (int r = threadIdx.x; r < R; r += blockDim.x) {
    int v = __ldg(a.src_tokens + r);
    const int n = MEP_LL_SRC_TOKENS(v);
    /* mep_combine_pushes, from the expert side */
    if (!Tp::kStaged && !(v & MEP_LL_SRC_WEIGHTED)) v |= MEP_LL_SRC_PUSHED;
    if (mep_combine_flagged<Tp>(p, n)) v |= MEP_LL_SRC_FLAGGED;
    src_s[r] = v;
    if (v & MEP_LL_SRC_PARTIALS) {
      any_partials = 1;
      atomicOr(&kinds, v & MEP_LL_SRC_FLAGGED ? MEP_LL_KIND_FLAGGED : MEP_LL_KIND_LINES);
      if (n > 0) atomicMax(&longest_tokens, n < p.dims.max_tokens ? n : p.dims.max_tokens);
    } else {
      any_plain = 1;
    }
  }
  __syncthreads();
  /* When the epoch comes round: the words of this window no source pushes
   * now, zeroed before any arrival (ll_combine_wrap.cuh). */
  if constexpr (!Tp::kStaged)
    if (mep_epoch_wraps(epoch)) {
      mep_clear_unpushed_weights(p, a.route, src_s, a.top_k);
      __threadfence_system(); /* the zeros before any arrival below */
      __syncthreads();
    }
  /* LSA: every source gets this block's arrival now, a relaxed add with
   * the code of what it takes (flagged words or lines): both carry their
   * own flags, and the arrival only tells the source that this rank has
   * started its combine, so has finished its dispatch receive (what lets
   * the source reuse the set, section 6 of PROTOCOL.md). */
  if constexpr (!Tp::kStaged)
    for (int d = threadIdx.x; d < R; d += blockDim.x) {
      /* block 0's add carries the code */
      const uint32_t code =
          blockIdx.x != 0 ? 0u
                          : mep_ll_comb_code(src_s[d] & MEP_LL_SRC_FLAGGED ? MEP_LL_COMB_FLAGGED
                                                                           : MEP_LL_COMB_LINES,
                                             mep_comb_dident);
      Tp::signal_relaxed(p.xp, d, cnt_sig, mep_ll_arrival_add(code, blockIdx.x, gridDim.x));
    }
  /* The epoch is stored at the end (the dispatch stores its tag last
   * too); the send kernel also stores the dispatch answered, for its
   * separate receive (ll_combine_send.cu: here it made the fused line
   * kernel spill). */
  auto store_epoch = [&] {
    mep_slots_store(p.tags, mep_ll_tag_words(R), 1, [&](int) { return R + 1; },
                    [&](int) { return epoch; });
  };
  /* Weighted and pushing sources in one pass: separate passes (one without
   * the pushed words' code) made the LSA send kernel spill, and the pushed
   * combine 3 / 12 us slower at 128 / 256 tokens (EP2, H200). */
  if (any_partials)
    mep_combine_send_partials<Tp>(p, a, src_s, longest_tokens, epoch, kinds);

  /* Slots are visited slot-index-major (u = s * E_local + le), so the first
   * pass of the grid covers the first few rows of every expert, where the
   * valid rows are: one row per warp instead of several valid rows landing
   * on the same warp (expert-major order with a stride of the warp count). */
  if constexpr (Tp::kStaged)
    for (int u = gwarp; any_plain && u < EL * longest; u += nwarps) {
      const int s = u / EL, le = u - s * EL;
      const int j = le * cap + s;
      if (s >= count_s[le]) continue;
      const int v = __ldg(a.slot_src + j);
      const int r = MEP_LL_SLOT_RANK(v), t = MEP_LL_SLOT_TOKEN(v), k = MEP_LL_SLOT_K(v);
      if (src_s[r] & MEP_LL_SRC_PARTIALS) continue; /* pre-reduced above */
      const __nv_bfloat16 *yrow = a.y + (size_t)j * a.hidden;
      const uint64_t stage_off = p.set_off + p.lay.stage + (uint64_t)j * row_bytes;
      /* GIN reads its source from the window */
      mep_copy_warp(p.xp.local + stage_off, yrow, row_bytes);
      __syncwarp();
      Tp::put_warp(p.xp, r,
                   p.set_off + mep_ll_comb_recv_off(&p.lay, half) +
                       (uint64_t)(t * a.top_k + k) * row_bytes,
                   yrow, stage_off, row_bytes, row_sig);
    }

  /* LSA: the arrivals went out at the start; the partials carry their
   * own flags. */
  if constexpr (!Tp::kRowSignals) {
    store_epoch();
    return epoch;
  }
  /* Staged: one count signal per source, 1 + the rows it must wait for
   * (partial puts, or every slot row from it), with the dispatch tag. */
  if (mep_last_block(&p.tickets[MEP_LL_TICKET_COMBINE_SEND])) {
    for (int r = threadIdx.x / 32; r < R; r += MEP_LL_THREADS / 32) {
      int count = 0;
      if (src_s[r] & MEP_LL_SRC_PARTIALS) {
        if (lane == 0) { /* staged: the partial puts it counted */
          count = (int)mep_ld_volatile_u32(&p.comb_puts[r]);
          p.comb_puts[r] = 0;
        }
      } else {
        for (int le = lane; le < EL; le += 32) count += __ldg(a.src_count + le * R + r);
#pragma unroll
        for (int m = 16; m >= 1; m >>= 1) count += __shfl_xor_sync(0xffffffffu, count, m);
      }
      if (lane == 0)
        Tp::signal(p.xp, r, cnt_sig, mep_ll_comb_count((uint32_t)count, mep_comb_dident));
    }
  }
  store_epoch();
  Tp::flush_warp(p.xp);
  return epoch;
}

/* The per-slot receive's units: (token, S 256-channel steps) over every
 * warp of the grid; unit() sums one into acc. */
template <typename IdxT, typename Unit>
__device__ __forceinline__ void mep_combine_slot_units(const MepLLParams &p,
                                                       const MepCombineArgs &a, int half,
                                                       Unit unit) {
  constexpr int S = kMepSlotRecvSteps;
  const int lane = threadIdx.x & 31;
  const int nwarps = gridDim.x * (MEP_LL_THREADS / 32);
  const int gwarp = mep_ll_spread_warp();
  const int nunits = (a.hidden + S * 256 - 1) / (S * 256);
  const __nv_bfloat16 *region = reinterpret_cast<const __nv_bfloat16 *>(
      p.xp.local + p.set_off + mep_ll_comb_recv_off(&p.lay, half));
  const IdxT *topk = reinterpret_cast<const IdxT *>(a.topk);
  for (int u = gwarp; u < a.tokens * nunits; u += nwarps) {
    const int t = u / nunits;
    const int c = (u - t * nunits) * S * 256 + lane * 8;
    float acc[S][8];
    mep_steps_zero<S>(acc);
    /* unit(row of slot k, id of slot k, weight of slot k, c, acc) */
    unit([&](int k) { return region + (size_t)(t * a.top_k + k) * a.hidden; },
         [&](int k) { return topk[t * a.top_k + k]; },
         [&](int k) { return a.weights[t * a.top_k + k]; }, c, acc);
    mep_steps_store<S>(a.out + (size_t)t * a.hidden, acc, c, a.hidden);
  }
}

/* top_k <= 8: every slot's vector in registers at once, then the groups. */
template <typename IdxT>
__device__ __forceinline__ void mep_combine_sum_slots_top8(const MepLLParams &p,
                                                           const MepCombineArgs &a, int half) {
  constexpr int S = kMepSlotRecvSteps;
  const int K = a.top_k;
  mep_combine_slot_units<IdxT>(p, a, half, [&](auto row, auto id, auto weight, int c,
                                         float (&acc)[S][8]) {
    uint4 v[8][S];
    float w[8];
    int rank[8];
    unsigned left = 0; /* slots not yet summed */
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      /* in the index's own width, as dispatch decides (an int64 id past
       * 2^31 must not wrap into a valid expert) */
      const IdxT e = i < K ? id(i) : (IdxT)-1;
      const bool use = e >= 0 && e < (IdxT)a.num_experts;
      w[i] = use ? weight(i) : 0.f;
      rank[i] = use ? (int)(e / a.local_experts) : -1;
      left |= use ? 1u << i : 0u;
      mep_steps_load<S>(v[i], row(i), c, a.hidden, use);
    }
    /* Every row is in registers before the first group: otherwise the
     * compiler may sink a group's loads into its branch below, one load
     * round trip per rank instead of one per unit. */
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int j = 0; j < S; ++j)
        asm volatile("" : "+r"(v[i][j].x), "+r"(v[i][j].y), "+r"(v[i][j].z), "+r"(v[i][j].w));
    while (left != 0) {
      const int first = __ffs(left) - 1;
      int r = -1;
#pragma unroll
      for (int i = 0; i < 8; ++i)
        if (i == first) r = rank[i];
      float part[S][8];
      mep_steps_zero<S>(part);
#pragma unroll
      for (int i = 0; i < 8; ++i)
        if ((left >> i & 1u) && rank[i] == r) {
          mep_steps_fma<S>(part, v[i], w[i]);
          left &= ~(1u << i);
        }
      mep_steps_add_rounded<S>(acc, part);
    }
  });
}

/* top_k above 8: lane k holds slot k's rank; each rank's slots are loaded
 * in batches of 8 (one batch per rank and 8 slots). */
template <typename IdxT>
__device__ __forceinline__ void mep_combine_sum_slots_wide(const MepLLParams &p,
                                                           const MepCombineArgs &a, int half) {
  constexpr int S = kMepSlotRecvSteps;
  const int lane = threadIdx.x & 31, K = a.top_k;
  mep_combine_slot_units<IdxT>(p, a, half, [&](auto row, auto id, auto weight, int c,
                                         float (&acc)[S][8]) {
    const IdxT e = lane < K ? id(lane) : (IdxT)-1;
    const bool valid = e >= 0 && e < (IdxT)a.num_experts;
    const int rank = valid ? (int)(e / a.local_experts) : -1;
    const float wl = valid ? weight(lane) : 0.f;
    const unsigned same = __match_any_sync(0xffffffffu, rank);
    unsigned left = __ballot_sync(0xffffffffu, valid);
    while (left != 0) {
      unsigned group = __shfl_sync(0xffffffffu, same, __ffs(left) - 1);
      left &= ~group;
      float part[S][8];
      mep_steps_zero<S>(part);
      while (group != 0) {
        uint4 v[8][S];
        float w[8];
        bool use[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const int k = mep_take_lane(&group, &use[i]);
          w[i] = __shfl_sync(0xffffffffu, wl, k);
          mep_steps_load<S>(v[i], row(k), c, a.hidden, use[i]);
        }
#pragma unroll
        for (int i = 0; i < 8; ++i)
          if (use[i]) mep_steps_fma<S>(part, v[i], w[i]);
      }
      mep_steps_add_rounded<S>(acc, part);
    }
  });
}

/* The per-slot reduction of the receive half (the sources sent one row
 * per slot), in the rank order every LL combine sums in (ll.h): per rank
 * the token reaches, in the order its ranks first appear in top-k, a
 * partial = its slots' fmaf(w, y, .) in k order from +0, rounded to bf16;
 * out = those partials added in f32 from +0, rounded to bf16. The same
 * value the expert side's pre-reduction gives, so where the weights are
 * applied, and which transport carried the rows, never changes the sum.
 * Work unit = (token, S 256-channel steps), T * ceil(H / 256 S) units over
 * every warp of the grid. */
template <typename IdxT>
__device__ __forceinline__ void mep_combine_sum_slots(const MepLLParams &p,
                                                      const MepCombineArgs &a, int half) {
  if (a.top_k <= 8)
    mep_combine_sum_slots_top8<IdxT>(p, a, half);
  else
    mep_combine_sum_slots_wide<IdxT>(p, a, half);
}

/* Whether source r's combine answered this rank's dispatch: its tag (from
 * its count) is ours. Else recorded (MEP_LL_OP_COMBINE_OTHER_DISPATCH). */
__device__ __forceinline__ bool mep_combine_same_dispatch(const MepLLParams &p, int r,
                                                          uint64_t theirs, uint32_t ours) {
  if (theirs == ours) return true;
  mep_record_timeout(p.wc, MEP_LL_OP_COMBINE_OTHER_DISPATCH, r, -1, ours, theirs);
  return false;
}

/* Records why source r's LSA combine code is not `want` (out of line: the
 * cold path of every count check): another dispatch than ours, else
 * another view of what this rank takes (BAD_SIGNAL). */
static __device__ __noinline__ void mep_combine_code_refused(const MepLLParams &p, int r,
                                                             uint64_t want, uint64_t code) {
  if (mep_combine_same_dispatch(p, r, code >> MEP_LL_COMB_KIND_BITS,
                                (uint32_t)want >> MEP_LL_COMB_KIND_BITS))
    mep_record_timeout(p.wc, MEP_LL_OP_BAD_SIGNAL, r, -1, want, code);
}

/* Source r's count of this combine over LSA: waits it, keeps its shadow
 * in next[r] and checks the code against what this rank takes (kind:
 * flagged words or lines) and the dispatch it answers (tag). False when
 * the wait failed or the code differs (recorded). */
template <class Tp>
__device__ __forceinline__ bool mep_combine_lsa_count(const MepLLParams &p, int half, int r,
                                                   uint32_t kind, uint32_t tag,
                                                   uint64_t *next) {
  uint64_t base = 0, increase = 0, code = 0;
  if (!mep_wait_count<Tp>(p, mep_ll_sig_comb_cnt(&p.dims, half, r), MEP_LL_OP_COMBINE_RECV, r,
                          &base, &increase, &code))
    return false;
  next[r] = base + increase;
  const uint64_t want = mep_ll_comb_code(kind, tag);
  if (code == want) return true;
  mep_combine_code_refused(p, r, want, code);
  return false;
}

/* One warp of an LSA receive of line partials: every source's count (its
 * lanes take the sources in turn). False, in every lane, when one failed. */
template <class Tp>
__device__ __forceinline__ bool mep_combine_line_counts(const MepLLParams &p, int half,
                                                     uint64_t *next) {
  bool ok = true;
  for (int r = threadIdx.x & 31; r < p.dims.world; r += 32)
    if (!mep_combine_lsa_count<Tp>(p, half, r, MEP_LL_COMB_LINES, mep_comb_dident, next))
      ok = false;
  return __all_sync(0xffffffffu, ok);
}

/* The counts of an LSA receive of line partials, once per block: the
 * first warp here claims the wait (mep_combine_line_counts) and publishes
 * its verdict in the block's state word (2 ok, 3 failed); a later warp
 * reads the verdict from shared memory. So a warp whose send units are done sums without a
 * block barrier, and only one warp of a block spins on the count words
 * (every summing warp spinning on them made 128-token calls 0.3 us
 * slower, and every warp of the grid 1-token calls' p99 1.4x p50). The
 * spin on the state word is bounded by the claimer's bounded waits: the
 * claimer publishes a verdict on every path. */
template <class Tp>
__device__ __forceinline__ bool mep_combine_line_block_counts(const MepLLParams &p, int half,
                                                           uint64_t *next,
                                                           volatile int *state) {
  int claimed = 0;
  if ((threadIdx.x & 31) == 0) claimed = atomicCAS((int *)state, 0, 1) == 0;
  if (__shfl_sync(0xffffffffu, claimed, 0)) {
    const bool ok = mep_combine_line_counts<Tp>(p, half, next);
    __syncwarp();
    __threadfence_block(); /* next[] before the verdict */
    if ((threadIdx.x & 31) == 0) *state = ok ? 2 : 3;
    return ok;
  }
  int v;
  while ((v = *state) < 2) {
  }
  __threadfence_block();
  return v == 2;
}

/* Which receive a body is built for: calls of either kind of sum (the
 * receive kernel, staged transports, and the fused LSA kernel of small
 * calls, whose flagged words it sums), or the fused LSA kernel of calls
 * above the flagged limit, which sums line partials early. The host picks
 * the fused kernel by the call's token count as mep_combine_flagged
 * decides it, so a small call runs the same code whatever the large ones
 * do (a kernel carrying both receives, or one built for flagged words
 * alone, was slower at 1-8 tokens or spilled). */
enum { MEP_COMB_RECV_ANY = 0, MEP_COMB_RECV_LINES = 1 };

/* smem: 2 R u64 (each source's count and row signal shadows after this
 * receive), then (MEP_COMB_RECV_LINES) the block's failure word and count
 * waiter's state, zeroed before the send half's first barrier
 * (mep_combine_recv_flag_zero); apart from the send half's in the fused
 * kernel (mep_combine_recv_smem_off). epoch: this combine's
 * (mep_combine_send_body's result, or its copy in this block's tag words
 * once the send half has run); the dispatch it answers is in
 * mep_comb_dident (set by the send half in a fused kernel, else by the
 * receive kernel before this body's first barrier). */
template <class Tp, typename IdxT, int kKind>
__device__ __forceinline__ void mep_combine_recv_body(const MepLLParams &p,
                                                      const MepCombineArgs &a, int *smem,
                                                      uint32_t epoch) {
  const int R = p.dims.world;
  const int half = mep_ll_comb_half(epoch);
  uint64_t *next = reinterpret_cast<uint64_t *>(smem);
  bool flagged = false;
  if constexpr (!Tp::kStaged && kKind == MEP_COMB_RECV_ANY)
    flagged = mep_combine_flagged<Tp>(p, a.tokens);
  if constexpr (!Tp::kStaged && kKind == MEP_COMB_RECV_LINES) {
    /* A warp with units of this call's sum starts them as soon as its
     * block's counts are seen and their codes checked (short: the senders'
     * arrivals came at the start of their send halves), so no block
     * barrier holds its sums behind its block's slowest send units; one
     * barrier at the end, for the shadows. Warp 0 takes part even without
     * units, so that every block keeps its shadows. */
    const bool sums = mep_ll_spread_warp() < mep_combine_line_units(a);
    bool ok = true;
    if (sums || threadIdx.x < 32)
      ok = mep_combine_line_block_counts<Tp>(p, half, next, smem + 4 * R + 1);
    if (ok && sums) ok = mep_combine_sum_lines<IdxT>(p, a, epoch);
    volatile int *failed = smem + 4 * R;
    if (!ok) *failed = 1;
    __syncthreads();
    if (*failed) return; /* a failed wait was recorded: no shadow moves */
  } else {
    __shared__ int failed;
    if (threadIdx.x == 0) failed = 0;
    __syncthreads();
    /* Flagged partials (LSA, small calls): the senders' arrivals came at
     * the start of their send halves, so the count waits below cost
     * little, and their code check comes before any word is read. */
    for (int r = threadIdx.x; r < R; r += blockDim.x) {
      if constexpr (!Tp::kRowSignals) {
        if (!mep_combine_lsa_count<Tp>(p, half, r,
                                       flagged ? MEP_LL_COMB_FLAGGED : MEP_LL_COMB_LINES,
                                       mep_comb_dident, next))
          failed = 1;
      } else {
        uint64_t base = 0, increase = 0, code = 0;
        if (mep_wait_count<Tp>(p, mep_ll_sig_comb_cnt(&p.dims, half, r), MEP_LL_OP_COMBINE_RECV,
                               r, &base, &increase, &code) &&
            mep_combine_same_dispatch(p, r, code >> MEP_LL_COMB_TAG_SHIFT, mep_comb_dident)) {
          next[r] = base + increase;
          /* the code is 1 + the rows to wait for (mep_ll_comb_count) */
          const uint32_t rs = mep_ll_sig_comb_row(&p.dims, half, r);
          next[R + r] = mep_shadow(p, rs) + ((code & 0xffffffffu) - 1);
          uint64_t rseen;
          if (!mep_wait_ge(p.wc, [&] { return Tp::read_signal(p.xp, rs); }, next[R + r],
                           MEP_LL_OP_COMBINE_RECV, r, -1, &rseen))
            failed = 1;
        } else {
          failed = 1;
        }
      }
    }
    __syncthreads();
    if (failed) return;

    /* over LSA always partials (mep_combine_pushes), flagged words or lines:
     * the comb_recv and per-slot sums are compiled out of those kernels */
    if constexpr (!Tp::kStaged) {
      if (!(flagged ? mep_combine_sum_flagged<IdxT>(p, a, epoch)
                    : mep_combine_sum_lines<IdxT>(p, a, epoch)))
        failed = 1;
      __syncthreads(); /* a failed wait was recorded: no shadow moves */
      if (failed) return;
    } else if (a.partials) {
      mep_combine_sum_partials<IdxT>(p, a, half);
    } else {
      mep_combine_sum_slots<IdxT>(p, a, half);
    }
  }
  /* When the epoch comes round: the flagged rows and the line rows of this
   * half no rank wrote now, zeroed before this rank's next combine send on
   * the set (ll_combine_wrap.cuh). */
  if constexpr (!Tp::kStaged)
    if (mep_epoch_wraps(epoch)) {
      mep_clear_unwritten_flag_rows<IdxT>(p, static_cast<const IdxT *>(a.topk), a.tokens,
                                          a.top_k, a.num_experts, a.local_experts, a.hidden,
                                          half, flagged);
      mep_clear_unwritten_line_rows<IdxT>(p, static_cast<const IdxT *>(a.topk), a.tokens,
                                          a.top_k, a.num_experts, a.local_experts, a.hidden,
                                          half, !flagged);
    }
  /* Only this block reads its shadow copies: no grid-wide ticket. The
   * epoch received beside them: a dispatch's wait that read them before
   * they moved ends on it (mep_ll_await_combine). */
  mep_store_shadows<Tp>(p, next, [&](int r) { return mep_ll_sig_comb_cnt(&p.dims, half, r); },
                        [&](int r) { return mep_ll_sig_comb_row(&p.dims, half, r); });
  mep_slots_store(p.tags, mep_ll_tag_words(R), 1, [&](int) { return R + 2; },
                  [&](int) { return epoch; });
}

#endif /* MEP_LL_COMBINE_BODY_CUH_ */
