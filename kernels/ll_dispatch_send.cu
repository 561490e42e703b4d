/* ll_dispatch_send.cu: LL dispatch, send half. Each token goes once to each
 * rank that holds at least one of its experts, into the (source rank,
 * token) row of that rank's receive area, together with the token's slot
 * list as the destination sees it (local expert per k, -1 elsewhere); the
 * receiver builds the per-expert slots (deterministic order) itself. Then
 * the last block to finish sends one count signal per destination.
 * LSA: work unit = (token, destination, 2048-channel chunk); the warp
 * quantises its chunk straight into the peer's row (16-byte stores).
 * Staged transports (GIN, GIN-emulated): one warp per token quantises once
 * into the local staging row (a put's source must be in the window), puts
 * it once per destination, and the last block puts each destination's
 * slot list. */
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

/* Channels per LSA work unit: four 512-channel quantiser steps with their
 * loads in flight together; small enough that one token spreads over
 * several warps (latency at small batches), large enough to amortise the
 * unit's routing load. */
constexpr int kChunk = 2048;

/* Lane k < K: the destination rank of token t's slot k (-1: no expert or an
 * invalid id, which is dropped) and, through *le, its local expert there. */
template <typename IdxT>
__device__ __forceinline__ int slot_dst(const SendArgs &a, int t, int lane, int *le) {
  *le = -1;
  if (lane >= a.top_k) return -1;
  const int e = (int)reinterpret_cast<const IdxT *>(a.topk)[t * a.top_k + lane];
  if (e < 0 || e >= a.num_experts) return -1;
  *le = e % a.local_experts;
  return e / a.local_experts;
}

/* Channels [c0, c0 + n) of token row xr into dispatch row drow: fp8 bytes
 * plus their f32 scales (one per 128 channels) or bf16. Whole warp. */
template <bool kFp8>
__device__ __forceinline__ void write_row_part(const SendArgs &a, const __nv_bfloat16 *xr,
                                               char *drow, int c0, int n) {
  if (kFp8) {
    float *sc = reinterpret_cast<float *>(drow + a.hidden) + c0 / 128;
    mep_fp8_quantize_row_warp(xr + c0, n, reinterpret_cast<uint8_t *>(drow) + c0, a.pow2,
                              [&](int g, float s) { sc[g] = s; });
  } else {
    mep_copy_warp(drow + 2 * (size_t)c0, xr + c0, (uint32_t)n * 2u);
  }
}

template <class Tp, bool kFp8, typename IdxT>
__global__ void __launch_bounds__(MEP_LL_THREADS, 1)
    ll_dispatch_send_kernel(const __grid_constant__ MepLLParams p, const SendArgs a) {
  const int lane = threadIdx.x & 31;
  const int nwarps = gridDim.x * (MEP_LL_THREADS / 32);
  const int gwarp = blockIdx.x * (MEP_LL_THREADS / 32) + threadIdx.x / 32;
  const int K = a.top_k, R = p.dims.world, T = a.tokens, M = p.dims.max_tokens;
  const uint64_t list_bytes = mep_ll_align16((uint64_t)M * p.dims.top_k * 4u);
  const uint64_t my_row = (uint64_t)p.rank * M; /* this rank's rows at every destination */
  const uint64_t my_list = p.set_off + p.lay.disp_list + (uint64_t)p.rank * list_bytes;

  if constexpr (!Tp::kStaged) {
    const int nch = (a.hidden + kChunk - 1) / kChunk;
    for (int u = gwarp; u < T * R * nch; u += nwarps) {
      const int ch = u % nch, td = u / nch, d = td % R, t = td / R;
      int le;
      const int dst = slot_dst<IdxT>(a, t, lane, &le);
      if (ch == 0 && lane < K) {
        int32_t *list = static_cast<int32_t *>(Tp::peer_ptr(p, d, my_list));
        list[t * K + lane] = dst == d ? le : -1;
      }
      if (__ballot_sync(0xffffffffu, dst == d) == 0) continue;
      char *drow = static_cast<char *>(
          Tp::peer_ptr(p, d, p.set_off + p.lay.disp_recv + (my_row + t) * a.row_bytes));
      const int c0 = ch * kChunk;
      write_row_part<kFp8>(a, a.x + (size_t)t * a.hidden, drow, c0,
                           a.hidden - c0 < kChunk ? a.hidden - c0 : kChunk);
    }
    if (mep_last_block(&p.tickets[MEP_LL_TICKET_DISPATCH_SEND])) {
      for (int d = threadIdx.x; d < R; d += blockDim.x)
        Tp::signal(p, d, mep_ll_sig_disp_cnt(&p.dims, p.rank), mep_ll_disp_code(T, 0, M));
    }
  } else {
    const uint64_t stage_rows = p.set_off + p.lay.stage;
    const uint64_t stage_list = p.set_off + p.lay.stage_list;
    const uint32_t row_sig = mep_ll_sig_disp_row(&p.dims, p.rank);
    for (int t = gwarp; t < T; t += nwarps) {
      const uint64_t srow = stage_rows + (uint64_t)t * a.row_bytes;
      write_row_part<kFp8>(a, a.x + (size_t)t * a.hidden, p.local + srow, 0, a.hidden);
      int le;
      const int dst = slot_dst<IdxT>(a, t, lane, &le);
      if (lane < K) {
        for (int d = 0; d < R; ++d)
          reinterpret_cast<int32_t *>(p.local + stage_list + d * list_bytes)[t * K + lane] =
              dst == d ? le : -1;
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
    if (mep_last_block(&p.tickets[MEP_LL_TICKET_DISPATCH_SEND])) {
      for (int d = threadIdx.x / 32; d < R; d += MEP_LL_THREADS / 32) {
        const uint32_t rows = mep_ld_volatile_u32(&p.puts[d]);
        const uint64_t src = stage_list + d * list_bytes;
        if (T > 0)
          Tp::put_warp(p, d, my_list, p.local + src, src,
                       (uint32_t)mep_ll_align16((uint64_t)T * K * 4u), row_sig);
        if (lane == 0) {
          p.puts[d] = 0;
          Tp::signal(p, d, mep_ll_sig_disp_cnt(&p.dims, p.rank),
                     mep_ll_disp_code(T, (int)rows + (T > 0), M));
        }
      }
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
  /* No more blocks than work units (a small batch launches a small grid):
   * LSA units are (token, destination, chunk), staged ones tokens. */
  const int64_t units = ctx->transport == MEP_LL_TRANSPORT_LSA
                            ? (int64_t)a->num_tokens * ctx->dims.world *
                                  ((a->hidden + kChunk - 1) / kChunk)
                            : (int64_t)a->num_tokens;
  const int grid = mep_ll_grid_for(ctx, units);
  cudaStream_t s = (cudaStream_t)stream;
  cudaError_t e;
  switch (ctx->transport) {
    case MEP_LL_TRANSPORT_LSA: e = launch_tp<MepLsa>(p, k, a->fp8, a->topk_idx_bytes, grid, s); break;
    case MEP_LL_TRANSPORT_GIN: e = launch_tp<MepGin>(p, k, a->fp8, a->topk_idx_bytes, grid, s); break;
    default: e = launch_tp<MepGinEmu>(p, k, a->fp8, a->topk_idx_bytes, grid, s); break;
  }
  return mep_kernels_cuda_check("dispatch_send: launch", e);
}
