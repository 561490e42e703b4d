/* ll_combine_recv.cu: LL combine, receive half as its own kernel (run from
 * a hook, or right after the send half). The body is in
 * ll_combine_body.cuh. */
#include "kernels/ll/ll_combine_body.cuh"

extern "C" mep_kstatus_t mep_ll_combine_check(const char *op, const mep_ll_ctx_t *ctx,
                                                const mep_ll_combine_args_t *a);

namespace {

template <class Tp, typename IdxT>
__global__ void __launch_bounds__(MEP_LL_THREADS, 1)
    ll_combine_recv_kernel(const MepCombineArgs a, const __grid_constant__ MepLLParams p) {
  extern __shared__ int smem[];
  /* the epoch and the dispatch answered that the send half of this
   * combine stored in this block's copy (the body's first barrier comes
   * before mep_comb_dident is read) */
  if (threadIdx.x == 0) mep_comb_dident = mep_tag(p, p.dims.world + 3);
  mep_combine_recv_body<Tp, IdxT, MEP_COMB_RECV_ANY>(p, a, smem, mep_tag(p, p.dims.world + 1));
}

template <class Tp>
cudaError_t launch_tp(const MepLLParams &p, const MepCombineArgs &a, int idx_bytes, int grid,
                      size_t smem, cudaStream_t s) {
  return idx_bytes == 8
             ? mep_launch(ll_combine_recv_kernel<Tp, int64_t>, grid, MEP_LL_THREADS, smem, s, a, p)
             : mep_launch(ll_combine_recv_kernel<Tp, int32_t>, grid, MEP_LL_THREADS, smem, s, a, p);
}

}  // namespace

/* Every receive kernel mep_ll_combine_recv may pick (mep_ll_combine_load). */
extern "C" cudaError_t mep_ll_combine_recv_load(void) {
  return mep_ll_each_transport([](auto tp) {
    using Tp = typename decltype(tp)::type;
    return mep_load_kernels(ll_combine_recv_kernel<Tp, int32_t>,
                            ll_combine_recv_kernel<Tp, int64_t>);
  });
}

extern "C" mep_kstatus_t mep_ll_combine_recv(const mep_ll_ctx_t *ctx,
                                               const mep_ll_combine_args_t *a, void *stream) {
  mep_kstatus_t st = mep_ll_combine_check("combine_recv", ctx, a);
  if (st != MEP_KSTATUS_OK) return st;
  if ((st = mep_combine_check_recv_ptrs("combine_recv", a)) != MEP_KSTATUS_OK) return st;
  MepLLParams p;
  mep_ll_make_params(ctx, a->buffer_set, &p);
  const int most = mep_ll_grid(ctx);
  const MepCombineArgs k = mep_combine_args(ctx, a, most);
  const int grid = mep_ll_grid_spread(most, mep_combine_recv_units(&k));
  const size_t smem = mep_combine_recv_smem(ctx);
  cudaStream_t s = (cudaStream_t)stream;
  const cudaError_t e = mep_ll_with_transport(ctx->transport, [&](auto tp) {
    return launch_tp<typename decltype(tp)::type>(p, k, a->topk_idx_bytes, grid, smem, s);
  });
  return mep_kernels_cuda_check("combine_recv: launch", e);
}
