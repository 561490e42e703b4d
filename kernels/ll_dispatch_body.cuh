/* ll_dispatch_body.cuh: the LL dispatch's two halves as device functions,
 * shared by the separate send/receive kernels (hooks) and the fused kernel
 * (one launch when the receive is not deferred).
 *
 * Send: each token goes once to each rank that holds at least one of its
 * experts, into the (source rank, token) row of that rank's receive area,
 * together with the token's slot list as the destination sees it (local
 * expert per k, -1 elsewhere); the receiver builds the per-expert slots
 * (deterministic order) itself. LSA: work unit = (token, destination,
 * 1024-channel chunk); the warp loads its chunk, then the routing, and
 * quantises straight into the peer's row (16-byte stores); every block
 * then adds its arrival to each destination's count signal. Staged
 * transports (GIN, GIN-emulated): one warp per token quantises once into
 * the local staging row (a put's source must be in the window), puts it
 * once per destination, and the last block puts each destination's slot
 * list and sends the count signals.
 *
 * Receive: every block waits for every source rank's count signal (and, for
 * staged transports, its puts), then handles local experts: for each source
 * rank in order, a block-wide stable compaction of that source's slot list
 * gives the expert's slots (source rank, then token, then k), and warps copy
 * the source's token rows into them. Writes the handle (slot sources,
 * counts, and each received slot's route for combine). Each block then
 * advances its own copies of the signal shadows. */
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

/* Lane k's slot-list entry for destination d: its local expert there (or
 * -1) and its weight w, as one 8-byte store. */
__device__ __forceinline__ int2 mep_list_entry(float w, int dst, int le, int d) {
  const bool here = dst == d;
  return make_int2(here ? le : -1, here ? __float_as_int(w) : 0);
}

/* Lane k < K: token t's weight k (0 without weights), loaded beside the
 * routing load rather than after it. */
__device__ __forceinline__ float mep_slot_weight(const MepDispatchArgs &a, int t, int lane) {
  return lane < a.top_k && a.weights != nullptr ? __ldg(a.weights + t * a.top_k + lane) : 0.f;
}

/* Channels [c0, c0 + n) of token row xr into dispatch row drow: fp8 bytes
 * plus their f32 scales (one per 128 channels) or bf16. Whole warp. */
template <bool kFp8>
__device__ __forceinline__ void mep_write_row_part(const MepDispatchArgs &a, const __nv_bfloat16 *xr,
                                               char *drow, int c0, int n) {
  if (kFp8) {
    float *sc = reinterpret_cast<float *>(drow + a.hidden) + c0 / 128;
    mep_fp8_quantize_row_warp(xr + c0, n, reinterpret_cast<uint8_t *>(drow) + c0, a.pow2,
                              [&](int g, float s) { sc[g] = s; });
  } else {
    mep_copy_warp(drow + 2 * (size_t)c0, xr + c0, (uint32_t)n * 2u);
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

template <class Tp, bool kFp8, typename IdxT>
__device__ __forceinline__ void mep_dispatch_send_body(const MepLLParams &p,
                                                       const MepDispatchArgs &a) {
  const int lane = threadIdx.x & 31;
  const int nwarps = gridDim.x * (MEP_LL_THREADS / 32);
  const int gwarp = blockIdx.x * (MEP_LL_THREADS / 32) + threadIdx.x / 32;
  const int K = a.top_k, R = p.dims.world, T = a.tokens, M = p.dims.max_tokens;
  const uint64_t list_bytes = mep_ll_list_bytes(&p.dims);
  const uint64_t my_row = (uint64_t)p.rank * M; /* this rank's rows at every destination */
  const uint64_t my_list = p.set_off + p.lay.disp_list + (uint64_t)p.rank * list_bytes;
  mep_stamp(p, MEP_LL_STAMP_ENTRY);

  if constexpr (!Tp::kStaged) {
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
      if (ch == 0 && lane < K) {
        int2 *list = static_cast<int2 *>(Tp::peer_ptr(p, d, my_list));
        list[t * K + lane] = mep_list_entry(w, dst, le, d);
      }
      if (__ballot_sync(0xffffffffu, dst == d) == 0) continue;
      char *drow = static_cast<char *>(
          Tp::peer_ptr(p, d, p.set_off + p.lay.disp_recv + (my_row + t) * a.row_bytes));
      mep_chunk_store<kFp8>(a, v, drow, c0, n);
    }
    mep_stamp(p, MEP_LL_STAMP_SENT);
    const uint64_t code = mep_ll_disp_code(T, 0, a.weighted, M);
    mep_arrive<Tp>(p, mep_ll_sig_disp_cnt(&p.dims, p.rank), [&](int) { return code; });
    mep_stamp(p, MEP_LL_STAMP_SIGNALLED);
  } else {
    const uint64_t stage_rows = p.set_off + p.lay.stage;
    const uint64_t stage_list = p.set_off + p.lay.stage_list;
    const uint32_t row_sig = mep_ll_sig_disp_row(&p.dims, p.rank);
    for (int t = gwarp; t < T; t += nwarps) {
      const uint64_t srow = stage_rows + (uint64_t)t * a.row_bytes;
      mep_write_row_part<kFp8>(a, a.x + (size_t)t * a.hidden, p.local + srow, 0, a.hidden);
      const float w = mep_slot_weight(a, t, lane);
      int le;
      const int dst = mep_slot_dst<IdxT>(p, a, t, lane, &le);
      if (lane < K) {
        for (int d = 0; d < R; ++d)
          reinterpret_cast<int2 *>(p.local + stage_list + d * list_bytes)[t * K + lane] =
              mep_list_entry(w, dst, le, d);
      }
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
    if (mep_last_block(&p.tickets[MEP_LL_TICKET_DISPATCH_SEND])) {
      for (int d = threadIdx.x / 32; d < R; d += MEP_LL_THREADS / 32) {
        const uint32_t rows = mep_ld_volatile_u32(&p.puts[d]);
        const uint64_t src = stage_list + d * list_bytes;
        if (T > 0)
          Tp::put_warp(p, d, my_list, p.local + src, src,
                       (uint32_t)mep_ll_align16((uint64_t)T * K * sizeof(int2)), row_sig);
        if (lane == 0) {
          p.puts[d] = 0;
          Tp::signal(p, d, mep_ll_sig_disp_cnt(&p.dims, p.rank),
                     mep_ll_disp_code(T, (int)rows + (T > 0), a.weighted, M));
        }
      }
      mep_stamp(p, MEP_LL_STAMP_SIGNALLED);
    }
  }
  Tp::flush_warp(p);
}

constexpr int kMepWarps = MEP_LL_THREADS / 32;
/* Slot-list scan steps (MEP_LL_THREADS entries each) whose loads are in
 * flight together in the receive half. */
constexpr int kMepListBatch = 4;

/* Scale groups (and packed UE8M0 words) per lane for the largest hidden:
 * the receive loads a row's scales into registers before its payload copy,
 * so the two loads overlap instead of following each other. */
constexpr int kMepScalesPerLane = MEP_MAX_HIDDEN / MEP_HIDDEN_ALIGN / 32;
constexpr int kMepScaleWordsPerLane = (kMepScalesPerLane + 3) / 4;

/* Row `src_row` of the receive area into recv_x slot dst_slot (and its
 * scales, converted to the caller's format). Whole warp. */
template <bool kFp8>
__device__ __forceinline__ void mep_copy_recv_row(const MepDispatchArgs &a, const char *row, uint64_t dst_slot) {
  const int lane = threadIdx.x & 31;
  if (!kFp8) {
    mep_copy_warp((char *)a.recv_x + dst_slot * a.hidden * 2, row, (uint32_t)a.hidden * 2);
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
    mep_copy_warp((char *)a.recv_x + dst_slot * a.hidden, row, (uint32_t)a.hidden);
    int32_t *dst = (int32_t *)a.recv_scales + dst_slot * words;
#pragma unroll
    for (int i = 0; i < kMepScaleWordsPerLane; ++i)
      if (lane + 32 * i < words) dst[lane + 32 * i] = (int32_t)v[i];
  } else {
    float f[kMepScalesPerLane];
#pragma unroll
    for (int i = 0; i < kMepScalesPerLane; ++i)
      f[i] = lane + 32 * i < groups ? __ldcg(sc + lane + 32 * i) : 0.f;
    mep_copy_warp((char *)a.recv_x + dst_slot * a.hidden, row, (uint32_t)a.hidden);
    float *dst = (float *)a.recv_scales + dst_slot * groups;
#pragma unroll
    for (int i = 0; i < kMepScalesPerLane; ++i)
      if (lane + 32 * i < groups) dst[lane + 32 * i] = f[i];
  }
}

/* smem: 2 R u64 (each source's count and row signal shadows after this
 * receive), then 3 R ints (tokens, puts and the weighted flag per source). */
template <class Tp, bool kFp8>
__device__ __forceinline__ void mep_dispatch_recv_body(const MepLLParams &p,
                                                       const MepDispatchArgs &a, int *smem) {
  __shared__ int warp_hits[kMepWarps];
  __shared__ int failed;
  const int R = p.dims.world, M = p.dims.max_tokens, K = a.top_k;
  uint64_t *next = reinterpret_cast<uint64_t *>(smem);
  int *tokens = smem + 4 * R;
  int *puts = tokens + R;
  int *weighted = puts + R;
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const int cap = R * M; /* slots per local expert */
  const uint64_t list_bytes = mep_ll_list_bytes(&p.dims);

  if (threadIdx.x == 0) failed = 0;
  __syncthreads();
  for (int r = threadIdx.x; r < R; r += blockDim.x) {
    const uint32_t cs = mep_ll_sig_disp_cnt(&p.dims, r);
    uint64_t base = 0, increase = 0, code = 0;
    int n = 0, q = 0, w = 0;
    if (mep_wait_count<Tp>(p, cs, MEP_LL_OP_DISPATCH_RECV, r, &base, &increase, &code)) {
      next[r] = base + increase;
      /* A code no sender makes (a corrupt or piled-up signal) reads
       * nothing and fails the group (recorded like an expired wait). */
      if (!mep_ll_disp_decode(code - 1, M, &n, &q, &w)) {
        mep_record_timeout(p, MEP_LL_OP_BAD_SIGNAL, r, -1, base, base + increase);
        failed = 1;
      } else if (Tp::kRowSignals) {
        const uint32_t rs = mep_ll_sig_disp_row(&p.dims, r);
        next[R + r] = mep_shadow(p, rs) + (uint64_t)q;
        uint64_t rseen;
        if (q > 0 && !mep_wait_ge(p, [&] { return Tp::read_signal(p, rs); }, next[R + r],
                                  MEP_LL_OP_DISPATCH_RECV, r, -1, &rseen))
          failed = 1;
      }
    } else {
      failed = 1;
    }
    tokens[r] = n;
    puts[r] = q;
    weighted[r] = w;
  }
  __syncthreads();
  if (failed) return; /* the record says why; outputs stay as they were */
  mep_stamp(p, MEP_LL_STAMP_SEEN);

  if (blockIdx.x == 0)
    for (int r = threadIdx.x; r < R; r += blockDim.x)
      a.src_tokens[r] = tokens[r] | (weighted[r] ? MEP_LL_SRC_WEIGHTED : 0);

  /* Slot-list batches: kMepListBatch scan steps of one source, loaded
   * together; the next batch (this source's next, or the next source's
   * first) is loaded while the current one is scanned. */
  auto list_of = [&](int r) {
    return reinterpret_cast<const int2 *>(p.local + p.set_off + p.lay.disp_list +
                                          (uint64_t)r * list_bytes);
  };
  auto load_batch = [&](int r, int i0, int2 *ent) {
#pragma unroll
    for (int q = 0; q < kMepListBatch; ++q) {
      const int i = i0 + q * MEP_LL_THREADS + threadIdx.x;
      ent[q] = r < R && i < tokens[r] * K ? __ldcg(list_of(r) + i) : make_int2(-1, 0);
    }
  };
  auto next_source = [&](int r) {
    do ++r; while (r < R && tokens[r] == 0);
    return r;
  };

  for (int le = blockIdx.x; le < a.local_experts; le += gridDim.x) {
    int32_t *slots = a.slot_src + (size_t)le * cap;
    int filled = 0; /* block-uniform */
    int2 ent[kMepListBatch];
    load_batch(next_source(-1), 0, ent);
    for (int r = 0; r < R; ++r) {
      const int n = tokens[r] * K;
      int hits = 0; /* block-uniform: this expert's entries of source r so far */
      for (int i0 = 0; i0 < n; i0 += kMepListBatch * MEP_LL_THREADS) {
        const bool more = i0 + kMepListBatch * MEP_LL_THREADS < n;
        int2 nxt[kMepListBatch];
        load_batch(more ? r : next_source(r), more ? i0 + kMepListBatch * MEP_LL_THREADS : 0, nxt);
#pragma unroll
        for (int q = 0; q < kMepListBatch; ++q) {
          if (i0 + q * MEP_LL_THREADS >= n) break; /* block-uniform */
          const int i = i0 + q * MEP_LL_THREADS + threadIdx.x;
          const bool hit = ent[q].x == le;
          /* Block 0's first expert visits every entry: it also marks the
           * routes of slots whose expert is on another rank. */
          if (le == 0 && i < n && (ent[q].x < 0 || ent[q].x >= a.local_experts))
            a.route[(size_t)r * M * K + i] = {MEP_LL_ROUTE_ELSEWHERE, 0};
          const unsigned ball = __ballot_sync(0xffffffffu, hit);
          if (lane == 0) warp_hits[warp] = __popc(ball);
          __syncthreads();
          int before = 0, all = 0;
#pragma unroll
          for (int w = 0; w < kMepWarps; ++w) {
            const int v = warp_hits[w];
            before += w < warp ? v : 0;
            all += v;
          }
          const int pos = hits + before + __popc(ball & ((1u << lane) - 1u));
          /* more than max_tokens hits from one source only happens with an
           * expert repeated within a token: the excess is dropped */
          if (hit && pos < M) slots[filled + pos] = MEP_LL_SLOT_PACK(r, i / K, i % K);
          if (hit)
            a.route[(size_t)r * M * K + i] = {
                pos < M ? le * cap + filled + pos : MEP_LL_ROUTE_DROPPED, ent[q].y};
          hits += all;
          __syncthreads(); /* warp_hits is reused */
          if (le == (int)blockIdx.x && r == 0 && i0 == 0 && q == 0)
            mep_stamp(p, MEP_LL_STAMP_LISTED);
        }
#pragma unroll
        for (int q = 0; q < kMepListBatch; ++q) ent[q] = nxt[q];
      }
      if (hits > M) hits = M;
      if (threadIdx.x == 0) a.src_count[le * R + r] = hits;
      filled += hits;
    }
    if (threadIdx.x == 0) a.recv_count[le] = filled;
    __syncthreads(); /* this expert's slot sources are written */
    if (le == (int)blockIdx.x) mep_stamp(p, MEP_LL_STAMP_SCANNED);
    for (int j = warp; j < filled; j += kMepWarps) {
      const int v = slots[j];
      const uint64_t src_row = (uint64_t)MEP_LL_SLOT_RANK(v) * M + MEP_LL_SLOT_TOKEN(v);
      mep_copy_recv_row<kFp8>(a, p.local + p.set_off + p.lay.disp_recv + src_row * a.row_bytes,
                     (uint64_t)le * cap + j);
    }
  }

  mep_stamp(p, MEP_LL_STAMP_COPIED);
  /* Only this block reads its shadow copies: no grid-wide ticket. */
  mep_shadows_store(
      p, Tp::kRowSignals ? 2 * R : R,
      [&](int j) { return j < R ? mep_ll_sig_disp_cnt(&p.dims, j) : mep_ll_sig_disp_row(&p.dims, j - R); },
      next);
  mep_stamp(p, MEP_LL_STAMP_DONE);
}

/* Warp-sized work units of the send half: LSA units are (token,
 * destination, chunk), staged ones tokens. */
static inline int64_t mep_dispatch_send_units(const mep_ll_ctx_t *ctx,
                                              const mep_ll_dispatch_args_t *a) {
  return ctx->transport == MEP_LL_TRANSPORT_LSA
             ? (int64_t)a->num_tokens * ctx->dims.world *
                   ((a->hidden + kMepDispatchChunk - 1) / kMepDispatchChunk)
             : (int64_t)a->num_tokens;
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
  return (size_t)ctx->dims.world * (2 * sizeof(uint64_t) + 3 * sizeof(int));
}

#endif /* MEP_LL_DISPATCH_BODY_CUH_ */
