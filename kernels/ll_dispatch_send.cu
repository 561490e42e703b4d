/* ll_dispatch_send.cu: LL dispatch, send half. Each (token, slot) pair is
 * put into the (source rank, expert) region of the expert's rank at an index
 * given by an ordered count (deterministic slots, no atomics); then one
 * count signal per destination expert.
 * LSA: one warp per (token, slot) pair quantises the token straight into the
 * peer's receive row (no staging, 16-byte stores). Staged transports (GIN,
 * GIN-emulated): one warp per token quantises once into the local staging
 * row (the put's source must be in the window), then puts it per slot. */
#include "kernels/fp8.cuh"
#include "kernels/ll_launch.cuh"

namespace {

struct SendArgs {
  const __nv_bfloat16 *x;
  const void *topk;
  int tokens, hidden, top_k, num_experts, local_experts;
  bool pow2;
  uint32_t row_bytes;
};

template <typename IdxT>
__device__ __forceinline__ int load_expert(const void *topk, int j) {
  return (int)reinterpret_cast<const IdxT *>(topk)[j];
}

/* How many of the entries topk[0, n) equal e. Whole warp (every lane must
 * call; every lane gets the count); four loads in flight per lane. */
template <typename IdxT>
__device__ __forceinline__ int warp_count_eq(const void *topk, int n, int e) {
  const int lane = threadIdx.x & 31;
  const IdxT *t = reinterpret_cast<const IdxT *>(topk);
  int cnt = 0, base = 0;
  for (; base + 128 <= n; base += 128) {
    const int v0 = (int)t[base + lane], v1 = (int)t[base + 32 + lane],
              v2 = (int)t[base + 64 + lane], v3 = (int)t[base + 96 + lane];
    cnt += __popc(__ballot_sync(0xffffffffu, v0 == e)) + __popc(__ballot_sync(0xffffffffu, v1 == e)) +
           __popc(__ballot_sync(0xffffffffu, v2 == e)) + __popc(__ballot_sync(0xffffffffu, v3 == e));
  }
  for (; base < n; base += 32) {
    const int j = base + lane;
    cnt += __popc(__ballot_sync(0xffffffffu, j < n && (int)t[j] == e));
  }
  return cnt;
}

template <class Tp, bool kFp8, typename IdxT>
__global__ void __launch_bounds__(MEP_LL_THREADS, 1)
    ll_dispatch_send_kernel(const __grid_constant__ MepLLParams p, const SendArgs a) {
  static_assert(Tp::kStaged || !Tp::kRowSignals, "direct puts count rows on the sender");
  const int lane = threadIdx.x & 31;
  const int nwarps = gridDim.x * (MEP_LL_THREADS / 32);
  const int gwarp = blockIdx.x * (MEP_LL_THREADS / 32) + threadIdx.x / 32;
  const int K = a.top_k, R = p.dims.world, T = a.tokens, M = p.dims.max_tokens;
  const uint64_t stage_base = p.set_off + p.lay.stage;

  if constexpr (!Tp::kStaged) {
    /* Phase A (direct): warp per (token, slot). The token is read (and
     * quantised) once per slot: it is in L2 after the first, and the
     * division is cheap next to the NVLink stores this spreads over K
     * times more warps. */
    for (int q = gwarp; q < T * K; q += nwarps) {
      const int e = load_expert<IdxT>(a.topk, q); /* same for every lane */
      if (e < 0 || e >= a.num_experts) continue;
      const int pos = warp_count_eq<IdxT>(a.topk, q, e);
      /* More than max_tokens rows for one expert only happens with an
       * expert repeated within a token; drop the excess (Phase B clamps the
       * count the same way) rather than write past the region. */
      if (pos >= M) continue;
      const int t = q / K, k = q - t * K;
      const int dst = e / a.local_experts, le = e % a.local_experts;
      const uint64_t slot = ((uint64_t)le * R + p.rank) * M + pos;
      char *drow = static_cast<char *>(
          Tp::peer_ptr(p, dst, p.set_off + p.lay.disp_recv + slot * a.row_bytes));
      const __nv_bfloat16 *xr = a.x + (size_t)t * a.hidden;
      if (kFp8) {
        float *sc = reinterpret_cast<float *>(drow + a.hidden);
        mep_fp8_quantize_row_warp(xr, a.hidden, reinterpret_cast<uint8_t *>(drow), a.pow2,
                                  [&](int g, float s) { sc[g] = s; });
      } else {
        mep_copy_warp(drow, xr, (uint32_t)a.hidden * 2u);
      }
      if (lane == 0)
        Tp::put_meta(p, dst, p.set_off + p.lay.disp_meta + slot * MEP_LL_META_BYTES,
                     make_int4(t, k, 0, 0), 0, 0);
      __threadfence_system(); /* this lane's stores before the done count */
      __syncwarp();
      if (lane == 0) atomicAdd(&p.done_disp[e], 1u);
    }
  } else {
    /* Phase A (staged): warp per token. */
    for (int t = gwarp; t < T; t += nwarps) {
      char *srow = p.local + stage_base + (uint64_t)t * a.row_bytes;
      const __nv_bfloat16 *xr = a.x + (size_t)t * a.hidden;
      if (kFp8) {
        float *sc = reinterpret_cast<float *>(srow + a.hidden);
        mep_fp8_quantize_row_warp(xr, a.hidden, reinterpret_cast<uint8_t *>(srow), a.pow2,
                                  [&](int g, float s) { sc[g] = s; });
      } else {
        mep_copy_warp(srow, xr, (uint32_t)a.hidden * 2u);
      }
      /* Lane k owns slot k: its expert and its index among all earlier
       * (token, slot) pairs routed to the same expert. */
      const int my_e = lane < K ? load_expert<IdxT>(a.topk, t * K + lane) : -1;
      int my_pos = 0;
      const int end = t * K + K;
      for (int base = 0; base < end; base += 32) {
        const int j = base + lane;
        const int ej = j < end ? load_expert<IdxT>(a.topk, j) : -2;
        for (int kk = 0; kk < K; ++kk) {
          const int ek = __shfl_sync(0xffffffffu, my_e, kk);
          const unsigned m = __ballot_sync(0xffffffffu, ek >= 0 && ej == ek && j < t * K + kk);
          if (lane == kk) my_pos += __popc(m);
        }
      }
      __syncwarp(); /* staging row complete before any lane reads it */
      for (int kk = 0; kk < K; ++kk) {
        const int e = __shfl_sync(0xffffffffu, my_e, kk);
        const int pos = __shfl_sync(0xffffffffu, my_pos, kk);
        if (e < 0 || e >= a.num_experts || pos >= M) continue;
        const int dst = e / a.local_experts, le = e % a.local_experts;
        const uint64_t slot = ((uint64_t)le * R + p.rank) * M + pos;
        const uint32_t row_sig = mep_ll_sig_disp_row(&p.dims, le, p.rank);
        Tp::put_warp(p, dst, p.set_off + p.lay.disp_recv + slot * a.row_bytes, srow,
                     stage_base + (uint64_t)t * a.row_bytes, a.row_bytes, row_sig);
        if (lane == 0)
          Tp::put_meta(p, dst, p.set_off + p.lay.disp_meta + slot * MEP_LL_META_BYTES,
                       make_int4(t, kk, 0, 0),
                       p.set_off + p.lay.stage_meta + (uint64_t)(t * K + kk) * MEP_LL_META_BYTES,
                       row_sig);
        if (!Tp::kRowSignals) {
          __threadfence_system();
          __syncwarp();
          if (lane == 0) atomicAdd(&p.done_disp[e], 1u);
        }
      }
    }
  }

  /* Phase B: one count signal per destination expert (every expert, also
   * with count 0: the receiver waits for all sources). Experts go to the
   * highest warps first, which Phase A leaves idle when T*K < warps. */
  for (int e = nwarps - 1 - gwarp; e < a.num_experts; e += nwarps) {
    int count = warp_count_eq<IdxT>(a.topk, T * K, e);
    if (count > M) count = M; /* as Phase A drops rows past max_tokens */
    if (lane == 0) {
      const int dst = e / a.local_experts, le = e % a.local_experts;
      bool ok = true;
      if (!Tp::kRowSignals) {
        uint64_t seen;
        ok = mep_wait_ge(
            p, [&] { return (uint64_t)mep_ld_volatile_u32(&p.done_disp[e]); }, (uint64_t)count,
            MEP_LL_OP_DISPATCH_SEND, -1, e, &seen);
        p.done_disp[e] = 0; /* the only writer left in this call */
      }
      if (ok) Tp::signal(p, dst, mep_ll_sig_disp_cnt(&p.dims, le, p.rank), (uint64_t)count + 1);
    }
  }
  Tp::flush_warp(p);
}

template <class Tp, bool kFp8, typename IdxT>
cudaError_t launch(const MepLLParams &p, const SendArgs &a, int grid, cudaStream_t s) {
  ll_dispatch_send_kernel<Tp, kFp8, IdxT><<<grid, MEP_LL_THREADS, 0, s>>>(p, a);
  return cudaGetLastError();
}

template <class Tp>
cudaError_t launch_tp(const MepLLParams &p, const SendArgs &a, bool fp8, int idx_bytes, int grid,
                      cudaStream_t s) {
  if (fp8) return idx_bytes == 8 ? launch<Tp, true, int64_t>(p, a, grid, s)
                                 : launch<Tp, true, int32_t>(p, a, grid, s);
  return idx_bytes == 8 ? launch<Tp, false, int64_t>(p, a, grid, s)
                        : launch<Tp, false, int32_t>(p, a, grid, s);
}

}  // namespace

extern "C" moe_ep_status_t mep_ll_dispatch_check(const char *op, const mep_ll_ctx_t *ctx,
                                                 const mep_ll_dispatch_args_t *a) {
  if (a == nullptr)
    return mep_kernels_error(MOE_EP_ERR_INVALID_ARGUMENT, "%s: args is NULL", op);
  moe_ep_status_t st = mep_ll_check_ctx(op, ctx, a->buffer_set);
  if (st != MOE_EP_OK) return st;
  st = mep_ll_check_shape(op, ctx, a->num_tokens, a->hidden, a->top_k, a->num_experts,
                          a->topk_idx_bytes);
  if (st != MOE_EP_OK) return st;
  if (a->fp8 && a->hidden % MEP_HIDDEN_ALIGN != 0)
    return mep_kernels_error(MOE_EP_ERR_INVALID_ARGUMENT,
                             "%s: hidden is %d; fp8 dispatch needs a multiple of %d", op,
                             a->hidden, MEP_HIDDEN_ALIGN);
  if (a->fp8 && (a->scale_mode < MOE_EP_FP8_SCALE_F32 ||
                 a->scale_mode > MOE_EP_FP8_SCALE_UE8M0_PACKED))
    return mep_kernels_error(MOE_EP_ERR_INVALID_ARGUMENT,
                             "%s: scale_mode is %d; it must be 0, 1 or 2", op, a->scale_mode);
  if (mep_ll_dispatch_row_bytes(a->hidden, a->fp8) >
      mep_ll_dispatch_row_bytes(ctx->dims.hidden, ctx->dims.fp8))
    return mep_kernels_error(MOE_EP_ERR_INVALID_ARGUMENT,
                             "%s: a %s row of hidden %d does not fit the buffer sized for %s "
                             "hidden %d", op, a->fp8 ? "fp8" : "bf16", a->hidden,
                             ctx->dims.fp8 ? "fp8" : "bf16", ctx->dims.hidden);
  return MOE_EP_OK;
}

extern "C" moe_ep_status_t mep_ll_dispatch_send(const mep_ll_ctx_t *ctx,
                                                const mep_ll_dispatch_args_t *a, void *stream) {
  moe_ep_status_t st = mep_ll_dispatch_check("dispatch_send", ctx, a);
  if (st != MOE_EP_OK) return st;
  if ((a->num_tokens > 0 && a->x == nullptr) || a->topk_idx == nullptr)
    return mep_kernels_error(MOE_EP_ERR_INVALID_ARGUMENT, "dispatch_send: x or topk_idx is NULL");
  MepLLParams p;
  mep_ll_make_params(ctx, a->buffer_set, &p);
  SendArgs k;
  k.x = (const __nv_bfloat16 *)a->x;
  k.topk = a->topk_idx;
  k.tokens = a->num_tokens;
  k.hidden = a->hidden;
  k.top_k = a->top_k;
  k.num_experts = a->num_experts;
  k.local_experts = a->num_experts / ctx->dims.world;
  k.pow2 = a->fp8 && a->scale_mode != MOE_EP_FP8_SCALE_F32;
  k.row_bytes = (uint32_t)mep_ll_dispatch_row_bytes(a->hidden, a->fp8);
  const int grid = mep_ll_grid(ctx);
  cudaStream_t s = (cudaStream_t)stream;
  cudaError_t e;
  switch (ctx->transport) {
    case MEP_LL_TRANSPORT_LSA: e = launch_tp<MepLsa>(p, k, a->fp8, a->topk_idx_bytes, grid, s); break;
    case MEP_LL_TRANSPORT_GIN: e = launch_tp<MepGin>(p, k, a->fp8, a->topk_idx_bytes, grid, s); break;
    default: e = launch_tp<MepGinEmu>(p, k, a->fp8, a->topk_idx_bytes, grid, s); break;
  }
  return mep_kernels_cuda_check("dispatch_send: launch", e);
}
