/* ll_dispatch.cu: LL dispatch in one launch (send half, then receive half,
 * in the same kernel) for calls that do not defer the receive: one launch
 * and one grid spin-up fewer than the two-kernel path. The receive half
 * waits for this rank's own lists and count signal, which other blocks
 * send, so the grid is launched cooperatively (all blocks resident; at most
 * one block per SM). */
#include "kernels/ll/ll_dispatch_body.cuh"

namespace {

template <class Tp, bool kFp8, typename IdxT, bool kBatched, bool kShare>
__global__ void __launch_bounds__(MEP_LL_THREADS, 1)
    ll_dispatch_kernel(const MepDispatchArgs a, const __grid_constant__ MepLLParams p) {
  extern __shared__ int smem[];
  /* LSA: the receive half's last warp sends the send half's arrival while
   * the other warps scan the lists. */
  mep_dispatch_send_body<Tp, kFp8, IdxT, Tp::kStaged>(p, a);
  mep_dispatch_recv_body<Tp, kFp8, !Tp::kStaged, kBatched, kShare>(p, a, smem);
}

template <class Tp, bool kFp8, typename IdxT>
cudaError_t launch(const MepLLParams &p, const MepDispatchArgs &a, bool batched, bool share,
                   int grid, size_t smem, cudaStream_t s) {
  if constexpr (!Tp::kStaged) {
    if (batched)
      return mep_ll_launch_fused(ll_dispatch_kernel<Tp, kFp8, IdxT, true, false>, grid, smem, s,
                                 a, p);
    if (share)
      return mep_ll_launch_fused(ll_dispatch_kernel<Tp, kFp8, IdxT, false, true>, grid, smem, s,
                                 a, p);
  }
  return mep_ll_launch_fused(ll_dispatch_kernel<Tp, kFp8, IdxT, false, false>, grid, smem, s, a,
                             p);
}

template <class Tp>
cudaError_t launch_tp(const MepLLParams &p, const MepDispatchArgs &a, bool fp8, int idx_bytes,
                      bool batched, bool share, int grid, size_t smem, cudaStream_t s) {
  if (fp8)
    return idx_bytes == 8 ? launch<Tp, true, int64_t>(p, a, batched, share, grid, smem, s)
                          : launch<Tp, true, int32_t>(p, a, batched, share, grid, smem, s);
  return idx_bytes == 8 ? launch<Tp, false, int64_t>(p, a, batched, share, grid, smem, s)
                        : launch<Tp, false, int32_t>(p, a, batched, share, grid, smem, s);
}

template <class Tp, bool kFp8, typename IdxT>
cudaError_t load_idx() {
  if constexpr (Tp::kStaged)
    return mep_load_kernels(ll_dispatch_kernel<Tp, kFp8, IdxT, false, false>);
  else
    return mep_load_kernels(ll_dispatch_kernel<Tp, kFp8, IdxT, false, false>,
                            ll_dispatch_kernel<Tp, kFp8, IdxT, true, false>,
                            ll_dispatch_kernel<Tp, kFp8, IdxT, false, true>);
}

template <class Tp>
cudaError_t load_tp() {
  cudaError_t e = load_idx<Tp, true, int32_t>();
  if (e == cudaSuccess) e = load_idx<Tp, true, int64_t>();
  if (e == cudaSuccess) e = load_idx<Tp, false, int32_t>();
  if (e == cudaSuccess) e = load_idx<Tp, false, int64_t>();
  return e;
}

}  // namespace

extern "C" cudaError_t mep_ll_dispatch_send_load(void);
extern "C" cudaError_t mep_ll_dispatch_recv_load(void);

extern "C" mep_kstatus_t mep_ll_dispatch_load(void) {
  cudaError_t e =
      mep_ll_each_transport([](auto tp) { return load_tp<typename decltype(tp)::type>(); });
  if (e == cudaSuccess) e = mep_ll_dispatch_send_load();
  if (e == cudaSuccess) e = mep_ll_dispatch_recv_load();
  return mep_kernels_cuda_check("dispatch: loading its kernels", e);
}

extern "C" mep_kstatus_t mep_ll_dispatch(const mep_ll_ctx_t *ctx,
                                           const mep_ll_dispatch_args_t *a, void *stream) {
  const mep_kstatus_t st = mep_ll_dispatch_validate("dispatch", ctx, a);
  if (st != MEP_KSTATUS_OK) return st;
  MepLLParams p;
  mep_ll_make_params(ctx, a->buffer_set, &p);
  const MepDispatchArgs k = mep_dispatch_send_args(ctx, a);
  /* Enough blocks for the send units and one per local expert, at most one
   * per SM. */
  const int64_t experts_as_units = (int64_t)k.local_experts * (MEP_LL_THREADS / 32);
  const int64_t send_units = mep_dispatch_units_at(ctx, a, k.chunk);
  const int grid =
      mep_ll_grid_for(ctx, send_units > experts_as_units ? send_units : experts_as_units);
  const bool batched = mep_dispatch_recv_batched(ctx, grid, k.local_experts);
  const bool share = mep_dispatch_recv_shares(ctx, a, batched);
  const size_t smem = mep_dispatch_recv_smem(ctx, batched);
  cudaStream_t s = (cudaStream_t)stream;
  const cudaError_t e = mep_ll_with_transport(ctx->transport, [&](auto tp) {
    return launch_tp<typename decltype(tp)::type>(p, k, a->fp8, a->topk_idx_bytes, batched, share,
                                                  grid, smem, s);
  });
  return mep_kernels_cuda_check("dispatch: launch", e);
}
