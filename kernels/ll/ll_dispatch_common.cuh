/* ll_dispatch_common.cuh: what both LL dispatch halves and all three
 * transports share: the device argument block, the send's routing and
 * row helpers, the receive's row copy, count-signal waits and tagged list
 * reads. ll_dispatch_copy.cuh (the receive's end), ll_dispatch_lsa.cuh
 * (LSA expert lists) and ll_dispatch_body.cuh (the halves) build on it. */
#ifndef MEP_LL_DISPATCH_COMMON_CUH_
#define MEP_LL_DISPATCH_COMMON_CUH_

#include "kernels/common/fastdiv.h"
#include "kernels/common/fp8.cuh"
#include "kernels/ll/ll_launch.cuh"
#include "kernels/ll/ll_units.h"

/* Both halves' arguments (device copy of mep_ll_dispatch_args_t). */
struct MepDispatchArgs {
  const __nv_bfloat16 *x;
  const void *topk;
  int tokens, hidden, top_k, local_experts, scale_mode;
  int chunk; /* LSA row unit channels: kMepDispatchStep or kMepDispatchChunkMax */
  uint32_t row_bytes;
  int weighted;
  void *recv_x;
  void *recv_scales;
  int32_t *recv_count;
  int32_t *slot_src;
  int32_t *src_count;
  const float *weights;   /* NULL: the lists carry weight 0 */
  mep_ll_route_t *route;
  int32_t *src_tokens;
  /* The send's (mep_dispatch_send_args): chunks per row, and the fast
   * dividers (mep_fastdiv_mul) of its index math by chunks per row, world
   * size and local experts. 128 bytes in all, as before they were added:
   * more would move every line of MepLLParams that a launch reads
   * (ll_params.cuh), which cost the receive kernel 0.2-0.3 us at 1 token
   * (EP1, H200). */
  int nch;
  uint32_t mul_nch, mul_world, mul_local;
};
static_assert(sizeof(MepDispatchArgs) == 128, "MepDispatchArgs: two 64-byte lines");

/* Expert e's rank (returned) and local expert there (*le); a send half's
 * (MepDispatchArgs.mul_local). 0 <= e < the call's experts. */
__device__ __forceinline__ int mep_expert_home(const MepDispatchArgs &a, int e, int *le) {
  const int d = mep_fastdiv(e, mep_fastdiv_of(a.local_experts, a.mul_local));
  *le = e - d * a.local_experts;
  return d;
}

/* An fp8 call's scales are powers of two (the UE8M0 formats). */
__device__ __forceinline__ bool mep_scales_pow2(const MepDispatchArgs &a) {
  return a.scale_mode != MEP_FP8_SCALE_F32;
}

/* Channels per LSA work unit (MepDispatchArgs.chunk): one 512-channel
 * quantiser step (fp8) while every send unit of the call fits in one pass
 * of the grid's warps, so a token spreads over twice the warps and each warp's
 * loads, quantisation and stores take half as long; two steps with their
 * loads in flight together beyond (more units than warps: fewer, longer
 * units). EP2 fp8 dispatch, hidden 7168, 2 x H200: 512 against 1024 at
 * 1 / 8 / 32 tokens 12.6-13.0 / 12.9-13.2 / 13.7-13.9 us against
 * 13.7-14.2 / 13.7-14.0 / 14.2-14.8; equal at 128; at 256 1.5 us slower.
 * (2048 measured 16.1 us at 1 token against 14.8 for 1024.) */
constexpr int kMepDispatchStep = 512;
constexpr int kMepDispatchChunkMax = 2 * kMepDispatchStep;

/* Warp-sized work units of the send half with `chunk`-channel row units:
 * LSA units are one per expert (its list), (token, destination, chunk),
 * and 32-word pieces of each destination's slot list past the call's
 * words (rewritten with the call's tag); staged ones tokens. */
static inline int64_t mep_dispatch_units_at(const mep_ll_ctx_t *ctx,
                                            const mep_ll_dispatch_args_t *a, int chunk) {
  if (ctx->transport != MEP_LL_TRANSPORT_LSA) return (int64_t)a->num_tokens;
  const int64_t R = ctx->dims.world;
  const int64_t fill = (int64_t)ctx->dims.max_tokens * ctx->dims.top_k -
                       (int64_t)a->num_tokens * a->top_k;
  return (int64_t)a->num_experts + (int64_t)a->num_tokens * R * ((a->hidden + chunk - 1) / chunk) +
         R * ((fill + 31) / 32);
}
/* The row unit's channels for this call (see kMepDispatchStep). bf16 rows
 * are copied, not quantised, and keep 1024 (512 measured equal at 1 and 32
 * tokens and 0.3 us slower at 8). */
static inline int mep_dispatch_chunk(const mep_ll_ctx_t *ctx, const mep_ll_dispatch_args_t *a) {
  const int64_t warps = (int64_t)mep_ll_grid(ctx) * (MEP_LL_THREADS / 32);
  return a->fp8 && mep_dispatch_units_at(ctx, a, kMepDispatchStep) <= warps
             ? kMepDispatchStep
             : kMepDispatchChunkMax;
}

static inline MepDispatchArgs mep_dispatch_args(const mep_ll_ctx_t *ctx,
                                                const mep_ll_dispatch_args_t *a) {
  MepDispatchArgs k;
  k.x = (const __nv_bfloat16 *)a->x;
  k.topk = a->topk_idx;
  k.tokens = a->num_tokens;
  k.hidden = a->hidden;
  k.top_k = a->top_k;
  k.local_experts = a->num_experts / ctx->dims.world;
  k.scale_mode = a->scale_mode;
  k.row_bytes = (uint32_t)mep_ll_dispatch_row_bytes(a->hidden, a->fp8);
  k.recv_x = a->recv_x;
  k.recv_scales = a->recv_scales;
  k.recv_count = a->recv_count;
  k.slot_src = a->slot_src;
  k.src_count = a->src_count;
  k.weights = a->topk_weights;
  k.weighted = a->weighted != 0;
  k.route = a->route;
  k.src_tokens = a->src_tokens;
  /* the send halves' (mep_dispatch_send_args); no receive reads them */
  k.chunk = k.nch = 0;
  k.mul_nch = k.mul_world = k.mul_local = 0;
  return k;
}
/* The arguments of a launch that sends: with the call's row unit, which
 * needs the grid's size (a device query), so only senders pay it. */
static inline MepDispatchArgs mep_dispatch_send_args(const mep_ll_ctx_t *ctx,
                                                     const mep_ll_dispatch_args_t *a) {
  MepDispatchArgs k = mep_dispatch_args(ctx, a);
  k.chunk = mep_dispatch_chunk(ctx, a);
  k.nch = (a->hidden + k.chunk - 1) / k.chunk;
  k.mul_nch = mep_fastdiv_mul(k.nch);
  k.mul_world = mep_fastdiv_mul(ctx->dims.world);
  k.mul_local = mep_fastdiv_mul(k.local_experts);
  return k;
}


/* Notes the first out-of-range routing entry of a launch (the slot is
 * dropped, as -1 would be); the runtime reports it once through
 * group_poll_error. Never aborts anything. */
static __device__ __noinline__ void mep_record_bad_routing(const MepLLParams &p, int token, int k,
                                                           int value) {
  if (p.wc.notice != nullptr)
    mep_publish_record(p.wc.notice, p.wc, MEP_LL_OP_BAD_ROUTING, -1, value, (uint64_t)token,
                       (uint64_t)k);
}

/* Notes that source r listed `listed` (> max_tokens) slots for local
 * expert le, the excess dropped (an expert repeated within a token); the
 * runtime reports it once through group_poll_error, as a bad id. */
static __device__ __noinline__ void mep_record_repeated_expert(const MepLLParams &p, int r, int le,
                                                               int listed) {
  if (p.wc.notice != nullptr)
    mep_publish_record(p.wc.notice, p.wc, MEP_LL_OP_REPEATED_EXPERT, r, le,
                       (uint64_t)p.dims.max_tokens, (uint64_t)listed);
}

/* Lane k < K: the destination rank of token t's slot k (-1: no expert or an
 * invalid id, which is dropped) and, through *le, its local expert there. */
template <typename IdxT>
__device__ __forceinline__ int mep_slot_dst(const MepLLParams &p, const MepDispatchArgs &a, int t,
                                            int lane, int *le) {
  *le = -1;
  if (lane >= a.top_k) return -1;
  const IdxT raw = reinterpret_cast<const IdxT *>(a.topk)[t * a.top_k + lane];
  const int E = a.local_experts * p.dims.world;
  if (raw < -1 || raw >= (IdxT)E)
    mep_record_bad_routing(p, t, lane, raw < (IdxT)INT32_MIN ? INT32_MIN
                                       : raw > (IdxT)INT32_MAX ? INT32_MAX : (int)raw);
  const int e = (int)raw;
  if (raw < 0 || raw >= (IdxT)E) return -1;
  return mep_expert_home(a, e, le);
}

/* Lane k's slot-list word for destination d: its local expert there (or
 * none) and its weight w, tagged (mep_ll_list_word). */
__device__ __forceinline__ uint64_t mep_list_word(float w, int dst, int le, int d, uint32_t tag) {
  const bool here = dst == d;
  return mep_ll_list_word(here ? le : -1, here ? __float_as_uint(w) : 0u, tag);
}

/* Lane k < K: token t's weight k (0 without weights), loaded beside the
 * routing load rather than after it. */
__device__ __forceinline__ float mep_slot_weight(const MepDispatchArgs &a, int t, int lane) {
  return lane < a.top_k && a.weights != nullptr ? __ldg(a.weights + t * a.top_k + lane) : 0.f;
}

/* Token row xr into dispatch row drow: fp8 bytes plus their f32 scales
 * (one per 128 channels), or bf16. Whole warp. */
template <bool kFp8>
__device__ __forceinline__ void mep_write_row(const MepDispatchArgs &a, const __nv_bfloat16 *xr,
                                              char *drow) {
  if (kFp8) {
    float *sc = reinterpret_cast<float *>(drow + a.hidden);
    mep_fp8_quantize_row_warp(xr, a.hidden, reinterpret_cast<uint8_t *>(drow),
                              mep_scales_pow2(a), [&](int g, float s) { sc[g] = s; });
  } else {
    mep_copy_warp(drow, xr, (uint32_t)a.hidden * 2u);
  }
}

/* An LSA work unit's channels [c0, c0 + n) of a token row (n <=
 * kMepDispatchChunkMax), as up to four 16-byte registers per lane. Loaded
 * before the routing load, so the two latencies overlap; stored (fp8:
 * quantised) once the unit's destination is known to take the token. The
 * second quantiser step runs only when n reaches into it (warp-uniform). */
static_assert(kMepDispatchChunkMax == 2 * 512 && kMepDispatchChunkMax == 4 * 32 * 8,
              "an LSA chunk is at most two 512-channel quantiser steps, or four uint4 per lane");
template <bool kFp8>
__device__ __forceinline__ void mep_chunk_load(const __nv_bfloat16 *xc, int n, uint4 v[4]) {
  if (kFp8) {
    mep_fp8_load_step(xc, 0, n, v);
    if (n > kMepDispatchStep) mep_fp8_load_step(xc, kMepDispatchStep, n, v + 2);
  } else {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int i = u * 32 + lane;
      v[u] = i < n / 8 ? __ldg(reinterpret_cast<const uint4 *>(xc) + i) : make_uint4(0u, 0u, 0u, 0u);
    }
  }
}
template <bool kFp8>
__device__ __forceinline__ void mep_chunk_store(const MepDispatchArgs &a, const uint4 v[4],
                                                char *drow, int c0, int n) {
  if (kFp8) {
    float *sc = reinterpret_cast<float *>(drow + a.hidden) + c0 / 128;
    uint8_t *q = reinterpret_cast<uint8_t *>(drow) + c0;
    auto put = [&](int g, float s) { sc[g] = s; };
    const bool pow2 = mep_scales_pow2(a);
    mep_fp8_quantize_step(v, 0, n, q, pow2, put);
    if (n > kMepDispatchStep) mep_fp8_quantize_step(v + 2, kMepDispatchStep, n, q, pow2, put);
  } else {
    const int lane = threadIdx.x & 31;
    uint4 *dst = reinterpret_cast<uint4 *>(drow + 2 * (size_t)c0);
#pragma unroll
    for (int u = 0; u < 4; ++u)
      if (u * 32 + lane < n / 8) dst[u * 32 + lane] = v[u];
  }
}

constexpr int kMepWarps = MEP_LL_THREADS / 32;
/* Slot-list words per scanning thread in one step of the staged receive's
 * scan: consecutive words, so one block barrier orders kMepScanPer times
 * as many words. */
constexpr int kMepScanPer = 2;

/* Scale groups (and packed UE8M0 words) per lane for the largest hidden:
 * the receive loads a row's scales into registers before its payload copy,
 * so the two loads overlap instead of following each other. */
constexpr int kMepScalesPerLane = MEP_MAX_HIDDEN / MEP_HIDDEN_ALIGN / 32;
constexpr int kMepScaleWordsPerLane = (kMepScalesPerLane + 3) / 4;

/* 16-byte loads per lane per step of a received row's copy: the copy
 * follows the count wait on the receive's critical path, and 16 moves a
 * hidden-7168 fp8 row in one load round trip instead of two. */
constexpr uint32_t kMepRecvCopyU = 16;

/* Slot sources of a block's first local expert kept in shared memory by the
 * scan, so the copy that follows reads them (and the expert's count)
 * without a global round trip; slots past it are read from slot_src. */
constexpr int kMepSlotCache = 1024;
/* The list counts (recv_count) of a block's first kMepFilledCache local
 * experts, kept in shared memory by the scan for the copy that follows:
 * read back from recv_count, each expert past the first cost a global
 * round trip on the path, rows or none (EP1, H200: the fused dispatch
 * 0.7-1.3 us faster with 1024 experts or 24 SMs, 0.1-0.3 with two experts
 * per block). */
constexpr int kMepFilledCache = 32;

/* Row `src_row` of the receive area into recv_x slot dst_slot (and its
 * scales, converted to the caller's format). Whole warp. */
template <bool kFp8>
__device__ __forceinline__ void mep_copy_recv_row(const MepDispatchArgs &a, const char *row, uint64_t dst_slot) {
  const int lane = threadIdx.x & 31;
  if (!kFp8) {
    mep_copy_warp<kMepRecvCopyU>((char *)a.recv_x + dst_slot * a.hidden * 2, row,
                                 (uint32_t)a.hidden * 2);
    return;
  }
  const float *sc = reinterpret_cast<const float *>(row + a.hidden);
  const int groups = a.hidden / 128;
  if (a.scale_mode == MEP_FP8_SCALE_UE8M0_PACKED) {
    const int words = (groups + 3) / 4;
    uint32_t v[kMepScaleWordsPerLane];
#pragma unroll
    for (int i = 0; i < kMepScaleWordsPerLane; ++i) {
      const int w = lane + 32 * i;
      v[i] = 0;
#pragma unroll
      for (int b = 0; b < 4; ++b)
        if (w < words && w * 4 + b < groups)
          v[i] |= ((__float_as_uint(__ldcg(sc + w * 4 + b)) >> 23) & 0xffu) << (8 * b);
    }
    mep_copy_warp<kMepRecvCopyU>((char *)a.recv_x + dst_slot * a.hidden, row, (uint32_t)a.hidden);
    int32_t *dst = (int32_t *)a.recv_scales + dst_slot * words;
#pragma unroll
    for (int i = 0; i < kMepScaleWordsPerLane; ++i)
      if (lane + 32 * i < words) dst[lane + 32 * i] = (int32_t)v[i];
  } else {
    float f[kMepScalesPerLane];
#pragma unroll
    for (int i = 0; i < kMepScalesPerLane; ++i)
      f[i] = lane + 32 * i < groups ? __ldcg(sc + lane + 32 * i) : 0.f;
    mep_copy_warp<kMepRecvCopyU>((char *)a.recv_x + dst_slot * a.hidden, row, (uint32_t)a.hidden);
    float *dst = (float *)a.recv_scales + dst_slot * groups;
#pragma unroll
    for (int i = 0; i < kMepScalesPerLane; ++i)
      if (lane + 32 * i < groups) dst[lane + 32 * i] = f[i];
  }
}

/* The receive's dynamic shared memory (mep_dispatch_recv_smem): 2 R u64,
 * then 5 R ints, each indexed by source rank; then, for launches whose
 * blocks hold several local experts, the LSA receive's list batch
 * (MepElistBatch) at mep_recv_smem_base(R). */
__host__ __device__ inline size_t mep_recv_smem_base(int R) {
  return ((size_t)R * (2 * sizeof(uint64_t) + 5 * sizeof(int)) + 15) / 16 * 16;
}
struct MepRecvSmem {
  uint64_t *next; /* signal shadows after this receive: count [R], then row
                     signals (staged) or the count codes (LSA) [R] */
  int *tokens, *puts, *weighted;
  int *tag; /* expected list tag */
  int *cnt; /* LSA: the current expert's list count */
};
__device__ __forceinline__ MepRecvSmem mep_recv_smem(int *smem, int R) {
  MepRecvSmem m;
  m.next = reinterpret_cast<uint64_t *>(smem);
  m.tokens = smem + 4 * R;
  m.puts = m.tokens + R;
  m.weighted = m.puts + R;
  m.tag = m.weighted + R;
  m.cnt = m.tag + R;
  return m;
}

/* Source r's slot list in this set: its head, then its words. */
__device__ __forceinline__ const uint64_t *mep_list_head(const MepLLParams &p, int r) {
  return reinterpret_cast<const uint64_t *>(p.xp.local + p.set_off + p.lay.disp_list +
                                            (uint64_t)r * mep_ll_list_bytes(&p.dims));
}
__device__ __forceinline__ const uint64_t *mep_list_words(const MepLLParams &p, int r) {
  return mep_list_head(p, r) + MEP_LL_LIST_HEAD_BYTES / 8;
}

/* Waits for source r's count signal: *total = the signal after this
 * receive, *code = the sender's code. An expired wait is recorded. */
template <class Tp>
__device__ __forceinline__ bool mep_dispatch_count_wait(const MepLLParams &p, int r,
                                                        uint64_t *total, uint64_t *code) {
  uint64_t base = 0, increase = 0;
  if (!mep_wait_count<Tp>(p, mep_ll_sig_disp_cnt(&p.dims, r), MEP_LL_OP_DISPATCH_RECV, r, &base,
                          &increase, code))
    return false;
  *total = base + increase;
  return true;
}

/* Source r made this call with this rank's hidden, top_k and row format
 * (its list head's row description); else recorded (MEP_LL_OP_ROW_DESC,
 * fatal) before any of its rows is copied with this call's layout.
 * Not judged when this thread's wait for the head failed (*failed, set by
 * mep_list_fresh): the head it returns then is a stand-in, and an aborted
 * wait must leave no record. */
template <bool kFp8>
__device__ __forceinline__ bool mep_head_desc_agrees(const MepLLParams &p,
                                                     const MepDispatchArgs &a, uint64_t h, int r,
                                                     const int *failed) {
  const uint32_t mine = mep_row_desc(a.hidden, a.top_k, kFp8, a.scale_mode);
  if (mep_ll_head_desc(h) == mine || *reinterpret_cast<const volatile int *>(failed)) return true;
  mep_record_timeout(p.wc, MEP_LL_OP_ROW_DESC, r, -1, mine, mep_ll_head_desc(h));
  return false;
}

/* A count's code no sender makes, or one that disagrees with the list
 * head (a corrupt or piled-up signal), fails the group like an expired
 * wait. */
__device__ __forceinline__ void mep_dispatch_bad_code(const MepLLParams &p, int r,
                                                      const uint64_t *next, int *failed) {
  mep_record_timeout(p.wc, MEP_LL_OP_BAD_SIGNAL, r, -1,
                     mep_shadow(p, mep_ll_sig_disp_cnt(&p.dims, r)), next[r]);
  *failed = 1;
}

/* LSA, after the count warp's waits (next[r]: each source's signal,
 * next[R + r] its code): each code must be the one the source's list head
 * implies, an LSA sender putting nothing. Compared, not decoded: decoding
 * (64-bit divisions and their remainders) cost every block ~0.45 us
 * between its join and the row copy (EP1, H200, phase stamps). Fills
 * puts[]; sets *failed. Threads r < R. */
__device__ __forceinline__ void mep_dispatch_check_codes(const MepLLParams &p,
                                                         const uint64_t *next, const int *tokens,
                                                         int *puts, const int *weighted,
                                                         int *failed) {
  const int R = p.dims.world, M = p.dims.max_tokens;
  for (int r = threadIdx.x; r < R; r += blockDim.x) {
    if (next[R + r] != mep_ll_disp_code(tokens[r], 0, weighted[r], M))
      mep_dispatch_bad_code(p, r, next, failed);
    puts[r] = 0;
  }
}

/* Staged transports: waits for every source's count signal and its row
 * puts; the code gives the source's tokens, mode and puts (its list head
 * is read afterwards). Fills next[] (the signal shadows after this
 * receive), tokens[], weighted[] and puts[]; sets *failed. Threads r < R. */
template <class Tp>
__device__ __forceinline__ void mep_dispatch_wait_counts(const MepLLParams &p, uint64_t *next,
                                                         int *tokens, int *puts, int *weighted,
                                                         int *failed) {
  const int R = p.dims.world, M = p.dims.max_tokens;
  for (int r = threadIdx.x; r < R; r += blockDim.x) {
    uint64_t code = 0;
    int n = 0, q = 0, w = 0;
    if (!mep_dispatch_count_wait<Tp>(p, r, &next[r], &code)) {
      *failed = 1;
      continue;
    }
    if (!mep_ll_disp_decode(code - 1, M, &n, &q, &w)) {
      mep_dispatch_bad_code(p, r, next, failed);
      continue;
    }
    tokens[r] = n;
    weighted[r] = w;
    puts[r] = q;
    if (Tp::kRowSignals) {
      const uint32_t rs = mep_ll_sig_disp_row(&p.dims, r);
      next[R + r] = mep_shadow(p, rs) + (uint64_t)q;
      uint64_t rseen;
      if (q > 0 && !mep_wait_ge(p.wc, [&] { return Tp::read_signal(p.xp, rs); }, next[R + r],
                                MEP_LL_OP_DISPATCH_RECV, r, -1, &rseen))
        *failed = 1;
    }
  }
}

/* The slow path of mep_list_fresh, out of line: the scan inlines the
 * check once per word it holds, and the wait loop would bloat each copy. */
static __device__ __noinline__ uint64_t mep_list_wait(const MepLLParams &p, const uint64_t *w,
                                                      uint32_t tag, int peer, int *failed) {
  uint64_t seen = 0;
  if (MEP_LL_STAMPS && p.stamps != nullptr)
    atomicAdd(reinterpret_cast<unsigned long long *>(
                  &p.stamps[blockIdx.x * MEP_LL_STAMP_POINTS + MEP_LL_STAMP_WORD_WAITS]),
              1ull);
  /* Waits on the tag alone, so an expired wait records tags, not words;
   * once the tag is this call's the word is final, and is read again. */
  if (mep_wait(p.wc, [&] { return (uint64_t)mep_ll_list_tag(mep_ld_relaxed_sys(w)); },
               [&](uint64_t v) { return v == tag; }, tag, MEP_LL_OP_DISPATCH_LIST, peer, -1,
               &seen))
    return mep_ld_relaxed_sys(w);
  *failed = 1;
  return mep_ll_list_word(-1, 0u, tag);
}

/* Word `w` of a slot list once it carries `tag` (`seen`: its value as
 * loaded): LSA lists may still be in flight when the receive scans them.
 * On an expired wait (recorded) sets *failed and returns a word with no
 * expert. One lane. */
__device__ __forceinline__ uint64_t mep_list_fresh(const MepLLParams &p, const uint64_t *w,
                                                   uint64_t seen, uint32_t tag, int peer,
                                                   int *failed) {
  return mep_ll_list_tag(seen) == tag ? seen : mep_list_wait(p, w, tag, peer, failed);
}

#endif /* MEP_LL_DISPATCH_COMMON_CUH_ */
