/* ll_dispatch_body.cuh: the LL dispatch's two halves as device functions,
 * shared by the separate send/receive kernels (hooks) and the fused kernel
 * (one launch when the receive is not deferred).
 *
 * Send: each token goes once to each rank that holds at least one of its
 * experts, into the (source rank, token) row of that rank's receive area,
 * together with the token's slot-list words as the destination sees them
 * (local expert per k, or none; the weight; the call's tag), and a list
 * head (tokens, weighted, tag); the receiver builds the per-expert slots
 * (deterministic order) itself. LSA: work unit = (token, destination,
 * 1024-channel chunk); the warp loads its chunk, then the routing, and
 * quantises straight into the peer's row (16-byte stores); every block
 * then adds its arrival to each destination's count signal (the fused
 * kernel leaves that to its receive half's last warp). Staged transports
 * (GIN, GIN-emulated): one warp per token quantises once into the local
 * staging row (a put's source must be in the window), puts it once per
 * destination, and the last block puts each destination's list and sends
 * the count signals.
 *
 * Receive: LSA reads every source's list head and scans the lists as their
 * tagged words arrive, before the rows are complete; staged transports wait
 * for the counts and puts first. For each local expert, and each source
 * rank in order, a block-wide stable compaction of that source's list gives
 * the expert's slots (source rank, then token, then k). Then (LSA) the
 * count signals, which cover the rows, and warps copy the rows into the
 * slots. Writes the handle (slot sources, counts, and each received slot's
 * route for combine). Each block then advances its own copies of the
 * signal shadows and list tags. */
#ifndef MEP_LL_DISPATCH_BODY_CUH_
#define MEP_LL_DISPATCH_BODY_CUH_

#include "kernels/fp8.cuh"
#include "kernels/ll_launch.cuh"

/* Both halves' arguments (device copy of mep_ll_dispatch_args_t). */
struct MepDispatchArgs {
  const __nv_bfloat16 *x;
  const void *topk;
  int tokens, hidden, top_k, num_experts, local_experts, scale_mode;
  bool pow2;
  uint32_t row_bytes;
  void *recv_x;
  void *recv_scales;
  int32_t *recv_count;
  int32_t *slot_src;
  int32_t *src_count;
  const float *weights;   /* NULL: the lists carry weight 0 */
  int weighted;
  mep_ll_route_t *route;
  int32_t *src_tokens;
};

static inline MepDispatchArgs mep_dispatch_args(const mep_ll_ctx_t *ctx,
                                                const mep_ll_dispatch_args_t *a) {
  MepDispatchArgs k;
  k.x = (const __nv_bfloat16 *)a->x;
  k.topk = a->topk_idx;
  k.tokens = a->num_tokens;
  k.hidden = a->hidden;
  k.top_k = a->top_k;
  k.num_experts = a->num_experts;
  k.local_experts = a->num_experts / ctx->dims.world;
  k.scale_mode = a->scale_mode;
  k.pow2 = a->fp8 && a->scale_mode != MOE_EP_FP8_SCALE_F32;
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
  return k;
}

/* Channels per LSA work unit: two 512-channel quantiser steps with their
 * loads in flight together, so one token spreads over several warps (at
 * 1 token per rank 1024 measured 14.8 us against 16.1 us for 2048, EP2
 * fp8 dispatch on 2 x H200; equal at 128 and 256 tokens). */
constexpr int kMepDispatchChunk = 1024;

/* Lane k < K: the destination rank of token t's slot k (-1: no expert or an
 * invalid id, which is dropped) and, through *le, its local expert there. */
template <typename IdxT>
__device__ __forceinline__ int mep_slot_dst(const MepLLParams &p, const MepDispatchArgs &a, int t,
                                            int lane, int *le) {
  *le = -1;
  if (lane >= a.top_k) return -1;
  const IdxT raw = reinterpret_cast<const IdxT *>(a.topk)[t * a.top_k + lane];
  if (raw < -1 || raw >= (IdxT)a.num_experts)
    mep_record_bad_routing(p, t, lane, raw < (IdxT)INT32_MIN ? INT32_MIN
                                       : raw > (IdxT)INT32_MAX ? INT32_MAX : (int)raw);
  const int e = (int)raw;
  if (raw < 0 || raw >= (IdxT)a.num_experts) return -1;
  *le = e % a.local_experts;
  return e / a.local_experts;
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
    mep_fp8_quantize_row_warp(xr, a.hidden, reinterpret_cast<uint8_t *>(drow), a.pow2,
                              [&](int g, float s) { sc[g] = s; });
  } else {
    mep_copy_warp(drow, xr, (uint32_t)a.hidden * 2u);
  }
}

/* An LSA work unit's channels [c0, c0 + n) of a token row (n <=
 * kMepDispatchChunk), as four 16-byte registers per lane. Loaded before the
 * routing load, so the two latencies overlap; stored (fp8: quantised) once
 * the unit's destination is known to take the token. */
static_assert(kMepDispatchChunk == 2 * 512 && kMepDispatchChunk == 4 * 32 * 8,
              "an LSA chunk is two 512-channel quantiser steps, or four uint4 per lane");
template <bool kFp8>
__device__ __forceinline__ void mep_chunk_load(const __nv_bfloat16 *xc, int n, uint4 v[4]) {
  if (kFp8) {
    mep_fp8_load_step(xc, 0, n, v);
    mep_fp8_load_step(xc, 512, n, v + 2);
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
    mep_fp8_quantize_step(v, 0, n, q, a.pow2, put);
    mep_fp8_quantize_step(v + 2, 512, n, q, a.pow2, put);
  } else {
    const int lane = threadIdx.x & 31;
    uint4 *dst = reinterpret_cast<uint4 *>(drow + 2 * (size_t)c0);
#pragma unroll
    for (int u = 0; u < 4; ++u)
      if (u * 32 + lane < n / 8) dst[u * 32 + lane] = v[u];
  }
}

/* kArrive = false (the fused LSA kernel): the block's arrival is left to
 * the receive half, whose last warp sends it while the others scan
 * (mep_dispatch_recv_body<.., true>). */
template <class Tp, bool kFp8, typename IdxT, bool kArrive = true>
__device__ __forceinline__ void mep_dispatch_send_body(const MepLLParams &p,
                                                       const MepDispatchArgs &a) {
  static_assert(kArrive || !Tp::kStaged, "only LSA leaves its arrival to the receive half");
  const int lane = threadIdx.x & 31;
  const int nwarps = gridDim.x * (MEP_LL_THREADS / 32);
  const int gwarp = blockIdx.x * (MEP_LL_THREADS / 32) + threadIdx.x / 32;
  const int K = a.top_k, R = p.dims.world, T = a.tokens, M = p.dims.max_tokens;
  const uint64_t list_bytes = mep_ll_list_bytes(&p.dims);
  const uint64_t my_row = (uint64_t)p.rank * M; /* this rank's rows at every destination */
  const uint64_t my_list = p.set_off + p.lay.disp_list + (uint64_t)p.rank * list_bytes;
  /* This call's list tag: every block's copy holds the last one sent. */
  const uint32_t tag = mep_ll_next_tag(mep_tag(p, R));
  const uint64_t head = mep_ll_list_head(T, a.weighted, tag);
  mep_stamp(p, MEP_LL_STAMP_ENTRY);

  if constexpr (!Tp::kStaged) {
    auto words_at = [&](int d) {
      return reinterpret_cast<uint64_t *>(
          static_cast<char *>(Tp::peer_ptr(p, d, my_list)) + MEP_LL_LIST_HEAD_BYTES);
    };
    if (blockIdx.x == 0)
      for (int d = threadIdx.x; d < R; d += blockDim.x)
        mep_st_relaxed_sys(static_cast<uint64_t *>(Tp::peer_ptr(p, d, my_list)), head);
    const int nch = (a.hidden + kMepDispatchChunk - 1) / kMepDispatchChunk;
    for (int u = gwarp; u < T * R * nch; u += nwarps) {
      const int ch = u % nch, td = u / nch, d = td % R, t = td / R;
      const int c0 = ch * kMepDispatchChunk;
      const int n = a.hidden - c0 < kMepDispatchChunk ? a.hidden - c0 : kMepDispatchChunk;
      uint4 v[4];
      mep_chunk_load<kFp8>(a.x + (size_t)t * a.hidden + c0, n, v);
      const float w = ch == 0 ? mep_slot_weight(a, t, lane) : 0.f;
      int le;
      const int dst = mep_slot_dst<IdxT>(p, a, t, lane, &le);
      if (ch == 0 && lane < K)
        mep_st_relaxed_sys(words_at(d) + t * K + lane, mep_list_word(w, dst, le, d, tag));
      if (__ballot_sync(0xffffffffu, dst == d) == 0) continue;
      char *drow = static_cast<char *>(
          Tp::peer_ptr(p, d, p.set_off + p.lay.disp_recv + (my_row + t) * a.row_bytes));
      mep_chunk_store<kFp8>(a, v, drow, c0, n);
    }
    /* Every other word of the list's capacity (max_tokens * the group's
     * top_k, whatever this call's top_k) gets this call's tag too, with no
     * expert, so no word keeps a tag old enough to come round again
     * (mep_ll_list_word). */
    const int words = M * p.dims.top_k;
    const int fill = words - T * K, fill_units = (fill + 31) / 32;
    for (int u = gwarp; u < R * fill_units; u += nwarps) {
      const int d = u % R, i = T * K + (u / R) * 32 + lane;
      if (i < words) mep_st_relaxed_sys(words_at(d) + i, mep_ll_list_word(-1, 0u, tag));
    }
    mep_stamp(p, MEP_LL_STAMP_SENT);
    if constexpr (kArrive) {
      const uint64_t code = mep_ll_disp_code(T, 0, a.weighted, M);
      mep_arrive<Tp>(p, mep_ll_sig_disp_cnt(&p.dims, p.rank), [&](int) { return code; });
      mep_stamp(p, MEP_LL_STAMP_SIGNALLED);
    }
  } else {
    const uint64_t stage_rows = p.set_off + p.lay.stage;
    const uint64_t stage_list = p.set_off + p.lay.stage_list;
    const uint32_t row_sig = mep_ll_sig_disp_row(&p.dims, p.rank);
    auto staged_words = [&](int d) {
      return reinterpret_cast<uint64_t *>(p.local + stage_list + d * list_bytes +
                                          MEP_LL_LIST_HEAD_BYTES);
    };
    if (blockIdx.x == 0)
      for (int d = threadIdx.x; d < R; d += blockDim.x)
        *reinterpret_cast<uint64_t *>(p.local + stage_list + d * list_bytes) = head;
    for (int t = gwarp; t < T; t += nwarps) {
      const uint64_t srow = stage_rows + (uint64_t)t * a.row_bytes;
      mep_write_row<kFp8>(a, a.x + (size_t)t * a.hidden, p.local + srow);
      const float w = mep_slot_weight(a, t, lane);
      int le;
      const int dst = mep_slot_dst<IdxT>(p, a, t, lane, &le);
      if (lane < K)
        for (int d = 0; d < R; ++d) staged_words(d)[t * K + lane] = mep_list_word(w, dst, le, d, tag);
      __syncwarp(); /* staging row complete before any lane's put reads it */
      for (int kk = 0; kk < K; ++kk) {
        const int d = __shfl_sync(0xffffffffu, dst, kk);
        /* once per destination: only at its first slot */
        if (d < 0 || __ballot_sync(0xffffffffu, lane < kk && dst == d) != 0) continue;
        Tp::put_warp(p, d, p.set_off + p.lay.disp_recv + (my_row + t) * a.row_bytes,
                     p.local + srow, srow, a.row_bytes, row_sig);
        if (lane == 0) atomicAdd(&p.puts[d], 1u);
      }
    }
    mep_stamp(p, MEP_LL_STAMP_SENT);
    /* The last block puts each destination's list (head and this call's
     * words: the receiver reads it only after the count) and its count. */
    if (mep_last_block(&p.tickets[MEP_LL_TICKET_DISPATCH_SEND])) {
      for (int d = threadIdx.x / 32; d < R; d += MEP_LL_THREADS / 32) {
        const uint32_t rows = mep_ld_volatile_u32(&p.puts[d]);
        const uint64_t src = stage_list + d * list_bytes;
        Tp::put_warp(p, d, my_list, p.local + src, src,
                     (uint32_t)mep_ll_align16(MEP_LL_LIST_HEAD_BYTES + (uint64_t)T * K * 8u),
                     row_sig);
        if (lane == 0) {
          p.puts[d] = 0;
          Tp::signal(p, d, mep_ll_sig_disp_cnt(&p.dims, p.rank),
                     mep_ll_disp_code(T, (int)rows + 1, a.weighted, M));
        }
      }
      mep_stamp(p, MEP_LL_STAMP_SIGNALLED);
    }
  }
  __syncthreads(); /* every thread has read the block's tag copy */
  mep_slots_store(p.tags, (uint32_t)(R + 1), 1, [&](int) { return R; }, [&](int) { return tag; });
  Tp::flush_warp(p);
}

constexpr int kMepWarps = MEP_LL_THREADS / 32;
/* Slot-list words per scanning thread in one scan step: consecutive
 * words, so one block barrier orders kMepScanPer times as many words (the
 * scan's steps are on the receive's critical path). */
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
  if (a.scale_mode == MOE_EP_FP8_SCALE_UE8M0_PACKED) {
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

/* Waits for source r's count signal (first: its value as read with the
 * head, or NULL): *total = the signal after this receive, *code = the
 * sender's code. An expired wait is recorded. */
template <class Tp>
__device__ __forceinline__ bool mep_dispatch_count_wait(const MepLLParams &p, int r,
                                                        const uint64_t *first, uint64_t *total,
                                                        uint64_t *code) {
  uint64_t base = 0, increase = 0;
  if (!mep_wait_count<Tp>(p, mep_ll_sig_disp_cnt(&p.dims, r), MEP_LL_OP_DISPATCH_RECV, r, &base,
                          &increase, code, first))
    return false;
  *total = base + increase;
  return true;
}

/* Waits for every source's count signal (and, staged, its row puts) and
 * checks the count's code against the tokens and mode the list head gave
 * (got_head; staged transports read the heads afterwards). Fills next[]
 * (the signal shadows after this receive) and puts[]; sets *failed. Threads
 * r < R. kWaited (LSA): the counts were waited for already, next[r] holds
 * each signal and next[R + r] its code; only the checks are left. */
template <class Tp, bool kWaited = false>
__device__ __forceinline__ void mep_dispatch_wait_counts(const MepLLParams &p, bool got_head,
                                                         uint64_t *next, int *tokens, int *puts,
                                                         int *weighted, int *failed) {
  static_assert(!kWaited || !Tp::kRowSignals, "next[R + r] holds codes only without row signals");
  const int R = p.dims.world, M = p.dims.max_tokens;
  for (int r = threadIdx.x; r < R; r += blockDim.x) {
    uint64_t code = 0;
    int n = 0, q = 0, w = 0;
    /* got_head: next[r] holds the signal as read with the head */
    if (kWaited) {
      code = next[R + r];
    } else if (!mep_dispatch_count_wait<Tp>(p, r, got_head ? &next[r] : nullptr, &next[r],
                                            &code)) {
      *failed = 1;
      continue;
    }
    /* A code no sender makes, or one that disagrees with the list head (a
     * corrupt or piled-up signal), fails the group like an expired wait. */
    if (!mep_ll_disp_decode(code - 1, M, &n, &q, &w) ||
        (got_head && (n != tokens[r] || w != weighted[r]))) {
      mep_record_timeout(p, MEP_LL_OP_BAD_SIGNAL, r, -1,
                         mep_shadow(p, mep_ll_sig_disp_cnt(&p.dims, r)), next[r]);
      *failed = 1;
      continue;
    }
    if (!got_head) {
      tokens[r] = n;
      weighted[r] = w;
    }
    puts[r] = q;
    if (Tp::kRowSignals) {
      const uint32_t rs = mep_ll_sig_disp_row(&p.dims, r);
      next[R + r] = mep_shadow(p, rs) + (uint64_t)q;
      uint64_t rseen;
      if (q > 0 && !mep_wait_ge(p, [&] { return Tp::read_signal(p, rs); }, next[R + r],
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
  if (p.stamps != nullptr)
    atomicAdd(reinterpret_cast<unsigned long long *>(
                  &p.stamps[blockIdx.x * MEP_LL_STAMP_POINTS + MEP_LL_STAMP_WORD_WAITS]),
              1ull);
  /* Waits on the tag alone, so an expired wait records tags, not words;
   * once the tag is this call's the word is final, and is read again. */
  if (mep_wait(p, [&] { return (uint64_t)mep_ll_list_tag(mep_ld_relaxed_sys(w)); },
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

/* smem: 2 R u64 (each source's count and row signal shadows after this
 * receive), then 4 R ints (tokens, puts, weighted flag and expected list
 * tag per source).
 *
 * Order: LSA reads each source's list head and scans the lists (their
 * words carry the call's tag, so the scan need not wait for the rows), then
 * waits for the counts, which cover the rows; staged transports wait for
 * counts and puts first (a list arrives in one put). kArriveAside (the
 * fused LSA kernel, whose send half leaves its arrival to this half): the
 * block's last warp sends the arrival, whose system fence stalls that warp
 * for microseconds, and then waits for the counts, while the other warps
 * scan (their barriers leave it out). */
template <class Tp, bool kFp8, bool kArriveAside = false>
__device__ __forceinline__ void mep_dispatch_recv_body(const MepLLParams &p,
                                                       const MepDispatchArgs &a, int *smem) {
  static_assert(!kArriveAside || !Tp::kStaged, "only LSA leaves its arrival to the receive half");
  constexpr int kScanWarps = kArriveAside ? kMepWarps - 1 : kMepWarps;
  constexpr int kScanThreads = kScanWarps * 32;
  __shared__ int warp_hits[kMepWarps];
  /* failed: set before the scan's barrier (all scanning warps see it);
   * scan_failed: a word wait that expired during the scan (or the last
   * warp's count wait), read only after the join, so no warp skips a
   * barrier the others take. */
  __shared__ int failed, scan_failed;
  __shared__ int32_t slot_cache[kMepSlotCache]; /* this block's first expert */
  __shared__ int first_filled;
  const int R = p.dims.world, M = p.dims.max_tokens, K = a.top_k;
  uint64_t *next = reinterpret_cast<uint64_t *>(smem);
  int *tokens = smem + 4 * R;
  int *puts = tokens + R;
  int *weighted = puts + R;
  int *tag = weighted + R; /* expected list tag per source */
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const int cap = R * M; /* slots per local expert */
  const uint64_t list_bytes = mep_ll_list_bytes(&p.dims);
  auto head_of = [&](int r) {
    return reinterpret_cast<const uint64_t *>(p.local + p.set_off + p.lay.disp_list +
                                              (uint64_t)r * list_bytes);
  };
  auto words_of = [&](int r) { return head_of(r) + MEP_LL_LIST_HEAD_BYTES / 8; };
  /* The scanning warps' barrier (named barrier 1 when the last warp is
   * away sending the arrival). */
  auto scan_sync = [] {
    if (kArriveAside)
      asm volatile("bar.sync 1, %0;" ::"n"(kScanThreads) : "memory");
    else
      __syncthreads();
  };

  if (threadIdx.x == 0) failed = scan_failed = 0;
  __syncthreads();
  if (Tp::kRowSignals) {
    mep_dispatch_wait_counts<Tp>(p, false, next, tokens, puts, weighted, &failed);
    __syncthreads(); /* failed */
    mep_stamp(p, MEP_LL_STAMP_SEEN);
  }
  if (kArriveAside && warp == kMepWarps - 1) {
    /* The send half ended with a block barrier after its stores, so this
     * warp's release adds carry every thread's rows. */
    const uint64_t code = mep_ll_disp_code(a.tokens, 0, a.weighted, M);
    mep_arrival_send<Tp>(p, mep_ll_sig_disp_cnt(&p.dims, p.rank), [&](int) { return code; },
                         lane, 32);
    /* Then it waits for the counts while the scan goes on, so the scan's
     * end finds them seen (their codes are checked after the join). */
    for (int r = lane; r < R; r += 32)
      if (!mep_dispatch_count_wait<Tp>(p, r, nullptr, &next[r], &next[R + r])) scan_failed = 1;
  } else {
    for (int r = threadIdx.x; r < R && !failed; r += kScanThreads) {
      /* The head and tag loads go out first, then the count signal's first
       * read: it is an acquire, which would hold back the loads issued
       * after it. When the receive runs late (a hook), the wait after the
       * scan then ends at once, and neither load waited on the other. */
      const uint64_t h0 = mep_ld_relaxed_sys(head_of(r));
      const uint32_t t = mep_ll_next_tag(mep_tag(p, r));
      if (!Tp::kRowSignals && !kArriveAside)
        next[r] = Tp::read_signal(p, mep_ll_sig_disp_cnt(&p.dims, r));
      tag[r] = (int)t;
      const uint64_t h = mep_list_fresh(p, head_of(r), h0, t, r, &failed);
      const int n = mep_ll_head_tokens(h), w = mep_ll_head_weighted(h);
      if (n > M || (Tp::kRowSignals && (n != tokens[r] || w != weighted[r]))) {
        mep_record_timeout(p, MEP_LL_OP_BAD_SIGNAL, r, -1, t, h);
        failed = 1;
      }
      tokens[r] = n > M ? 0 : n;
      weighted[r] = w;
    }
    scan_sync();
    if (!failed) { /* uniform: set only before the barrier above */
      mep_stamp(p, MEP_LL_STAMP_HEADS);
      if (blockIdx.x == 0)
        for (int r = threadIdx.x; r < R; r += kScanThreads)
          a.src_tokens[r] = tokens[r] | (weighted[r] ? MEP_LL_SRC_WEIGHTED : 0);

      /* Scan steps: kScanThreads * kMepScanPer words of one source, thread
       * j holding words j * kMepScanPer ..; the next step's words (this
       * source's next, or the next source's first) load during the
       * current one. */
      constexpr int kStep = kScanThreads * kMepScanPer;
      auto load_step = [&](int r, int i0, uint64_t *ent) {
#pragma unroll
        for (int e = 0; e < kMepScanPer; ++e) {
          const int i = i0 + threadIdx.x * kMepScanPer + e;
          ent[e] = r < R && i < tokens[r] * K ? mep_ld_relaxed_sys(words_of(r) + i) : 0u;
        }
      };
      auto next_source = [&](int r) {
        do ++r; while (r < R && tokens[r] == 0);
        return r;
      };
      for (int le = blockIdx.x; le < a.local_experts; le += gridDim.x) {
        int32_t *slots = a.slot_src + (size_t)le * cap;
        int filled = 0; /* uniform over the scanning warps */
        uint64_t ent[kMepScanPer];
        load_step(next_source(-1), 0, ent);
        for (int r = 0; r < R; ++r) {
          const int n = tokens[r] * K;
          int hits = 0; /* uniform: this expert's entries of source r so far */
          for (int i0 = 0; i0 < n; i0 += kStep) {
            const bool more = i0 + kStep < n;
            uint64_t nxt[kMepScanPer];
            load_step(more ? r : next_source(r), more ? i0 + kStep : 0, nxt);
            const int ib = i0 + threadIdx.x * kMepScanPer;
            bool hit[kMepScanPer];
            int mine = 0;
            unsigned below = 0; /* this warp's hits before this thread's words */
            const unsigned lower = (1u << lane) - 1u;
#pragma unroll
            for (int e = 0; e < kMepScanPer; ++e) {
              const int i = ib + e;
              if (i < n) ent[e] = mep_list_fresh(p, words_of(r) + i, ent[e], (uint32_t)tag[r], r,
                                                 &scan_failed);
              const int ex = i < n ? mep_ll_list_expert(ent[e]) : -1;
              hit[e] = i < n && ex == le;
              /* Block 0's first expert visits every word: it also marks
               * the routes of slots whose expert is on another rank. */
              if (le == 0 && i < n && (ex < 0 || ex >= a.local_experts))
                a.route[(size_t)r * M * K + i] = {MEP_LL_ROUTE_ELSEWHERE, 0};
              const unsigned ball = __ballot_sync(0xffffffffu, hit[e]);
              below += __popc(ball & lower);
              mine += __popc(ball);
            }
            const bool first_step = p.stamps != nullptr && le == (int)blockIdx.x && i0 == 0 &&
                                    r == next_source(-1);
            if (first_step) mep_stamp(p, MEP_LL_STAMP_FIRST_WORDS);
            if (lane == 0) warp_hits[warp] = mine;
            scan_sync();
            int before = 0, all = 0;
#pragma unroll
            for (int w = 0; w < kScanWarps; ++w) {
              const int v = warp_hits[w];
              before += w < warp ? v : 0;
              all += v;
            }
            int pos = hits + before + (int)below;
#pragma unroll
            for (int e = 0; e < kMepScanPer; ++e) {
              if (!hit[e]) continue;
              const int i = ib + e;
              /* more than max_tokens hits from one source only happens
               * with an expert repeated within a token: the excess is
               * dropped */
              if (pos < M) {
                const int32_t v = MEP_LL_SLOT_PACK(r, i / K, i % K);
                slots[filled + pos] = v;
                if (le == (int)blockIdx.x && filled + pos < kMepSlotCache)
                  slot_cache[filled + pos] = v;
              }
              a.route[(size_t)r * M * K + i] = {pos < M ? le * cap + filled + pos
                                                        : MEP_LL_ROUTE_DROPPED,
                                                (int32_t)mep_ll_list_weight_bits(ent[e])};
              ++pos;
            }
            hits += all;
            scan_sync(); /* warp_hits is reused */
            if (first_step) mep_stamp(p, MEP_LL_STAMP_FIRST_STEP);
#pragma unroll
            for (int e = 0; e < kMepScanPer; ++e) ent[e] = nxt[e];
          }
          if (hits > M) hits = M;
          if (threadIdx.x == 0) a.src_count[le * R + r] = hits;
          filled += hits;
        }
        if (threadIdx.x == 0) {
          a.recv_count[le] = filled;
          if (le == (int)blockIdx.x) first_filled = filled;
        }
      }
      mep_stamp(p, MEP_LL_STAMP_SCANNED);
    }
  }
  __syncthreads(); /* failed; this block's slot sources and counts are written */
  /* The record says why; the handle may be partly written (LSA scans
   * before the counts), the rows are not copied. */
  if (failed || scan_failed) return;
  if (!Tp::kRowSignals) {
    mep_dispatch_wait_counts<Tp, kArriveAside>(p, true, next, tokens, puts, weighted, &failed);
    __syncthreads();
    if (failed) return;
    mep_stamp(p, MEP_LL_STAMP_SEEN);
  }

  for (int le = blockIdx.x; le < a.local_experts; le += gridDim.x) {
    const bool first = le == (int)blockIdx.x;
    const int filled =
        first ? first_filled : *reinterpret_cast<volatile const int32_t *>(a.recv_count + le);
    const int32_t *slots = a.slot_src + (size_t)le * cap;
    for (int j = warp; j < filled; j += kMepWarps) {
      const int v = first && j < kMepSlotCache ? slot_cache[j] : slots[j];
      const uint64_t src_row = (uint64_t)MEP_LL_SLOT_RANK(v) * M + MEP_LL_SLOT_TOKEN(v);
      mep_copy_recv_row<kFp8>(a, p.local + p.set_off + p.lay.disp_recv + src_row * a.row_bytes,
                              (uint64_t)le * cap + j);
    }
  }
  mep_stamp(p, MEP_LL_STAMP_COPIED);

  /* Only this block reads its shadow and tag copies: no grid-wide ticket. */
  mep_store_shadows<Tp>(p, next, [&](int r) { return mep_ll_sig_disp_cnt(&p.dims, r); },
                        [&](int r) { return mep_ll_sig_disp_row(&p.dims, r); });
  mep_slots_store(p.tags, (uint32_t)(R + 1), R, [&](int j) { return j; },
                  [&](int j) { return (uint32_t)tag[j]; });
  mep_stamp(p, MEP_LL_STAMP_DONE);
}

/* Warp-sized work units of the send half: LSA units are (token,
 * destination, chunk), plus 32-word pieces of each destination's list past
 * the call's words (rewritten with the call's tag); staged ones tokens. */
static inline int64_t mep_dispatch_send_units(const mep_ll_ctx_t *ctx,
                                              const mep_ll_dispatch_args_t *a) {
  if (ctx->transport != MEP_LL_TRANSPORT_LSA) return (int64_t)a->num_tokens;
  const int64_t R = ctx->dims.world;
  const int64_t fill = (int64_t)ctx->dims.max_tokens * ctx->dims.top_k -
                       (int64_t)a->num_tokens * a->top_k;
  return (int64_t)a->num_tokens * R * ((a->hidden + kMepDispatchChunk - 1) / kMepDispatchChunk) +
         R * ((fill + 31) / 32);
}

/* The pointer rules of each half (after mep_ll_dispatch_check). */
static inline moe_ep_status_t mep_dispatch_check_send_ptrs(const char *op,
                                                           const mep_ll_dispatch_args_t *a) {
  if ((a->num_tokens > 0 && a->x == nullptr) || a->topk_idx == nullptr)
    return mep_kernels_error(MOE_EP_ERR_INVALID_ARGUMENT, "%s: x or topk_idx is NULL", op);
  if (a->weighted != 0 && a->weighted != 1)
    return mep_kernels_error(MOE_EP_ERR_INVALID_ARGUMENT, "%s: weighted is %d; it must be 0 or 1",
                             op, a->weighted);
  if (a->weighted && a->num_tokens > 0 && a->topk_weights == nullptr)
    return mep_kernels_error(MOE_EP_ERR_INVALID_ARGUMENT,
                             "%s: weighted is 1 but topk_weights is NULL with %d tokens", op,
                             a->num_tokens);
  return MOE_EP_OK;
}
static inline moe_ep_status_t mep_dispatch_check_recv_ptrs(const char *op,
                                                           const mep_ll_dispatch_args_t *a) {
  if (a->recv_x == nullptr || a->recv_count == nullptr || a->slot_src == nullptr ||
      a->src_count == nullptr || a->route == nullptr || a->src_tokens == nullptr ||
      (a->fp8 && a->recv_scales == nullptr))
    return mep_kernels_error(MOE_EP_ERR_INVALID_ARGUMENT,
                             "%s: recv_x, recv_count, slot_src, src_count, route, src_tokens "
                             "(and recv_scales for fp8) must not be NULL", op);
  return MOE_EP_OK;
}

/* Dynamic shared memory of the receive half. */
static inline size_t mep_dispatch_recv_smem(const mep_ll_ctx_t *ctx) {
  return (size_t)ctx->dims.world * (2 * sizeof(uint64_t) + 4 * sizeof(int));
}

#endif /* MEP_LL_DISPATCH_BODY_CUH_ */
