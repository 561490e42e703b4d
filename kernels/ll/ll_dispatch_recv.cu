/* ll_dispatch_recv.cu: LL dispatch, receive half as its own kernel (run
 * from a hook, or right after the send half). The body is in
 * ll_dispatch_body.cuh. */
#include "kernels/ll/ll_dispatch_body.cuh"

extern "C" mep_kstatus_t mep_ll_dispatch_check(const char *op, const mep_ll_ctx_t *ctx,
                                                 const mep_ll_dispatch_args_t *a);

namespace {

template <class Tp, bool kFp8, bool kBatched, bool kShare>
__global__ void __launch_bounds__(MEP_LL_THREADS, 1)
    ll_dispatch_recv_kernel(const MepDispatchArgs a, const __grid_constant__ MepLLParams p) {
  extern __shared__ int smem[];
  mep_dispatch_recv_body<Tp, kFp8, false, kBatched, kShare>(p, a, smem);
}

template <class Tp, bool kBatched, bool kShare>
cudaError_t launch(const MepLLParams &p, const MepDispatchArgs &a, bool fp8, int grid,
                   size_t smem, cudaStream_t s) {
  return fp8 ? mep_launch(ll_dispatch_recv_kernel<Tp, true, kBatched, kShare>, grid, MEP_LL_THREADS,
                          smem, s, a, p)
             : mep_launch(ll_dispatch_recv_kernel<Tp, false, kBatched, kShare>, grid,
                          MEP_LL_THREADS, smem, s, a, p);
}

template <class Tp>
cudaError_t launch_tp(const MepLLParams &p, const MepDispatchArgs &a, bool fp8, bool batched,
                      bool share, int grid, size_t smem, cudaStream_t s) {
  if constexpr (!Tp::kStaged) {
    if (batched) return launch<Tp, true, false>(p, a, fp8, grid, smem, s);
    if (share) return launch<Tp, false, true>(p, a, fp8, grid, smem, s);
  }
  return launch<Tp, false, false>(p, a, fp8, grid, smem, s);
}

template <class Tp, bool kBatched, bool kShare>
cudaError_t load() {
  return mep_load_kernels(ll_dispatch_recv_kernel<Tp, true, kBatched, kShare>,
                          ll_dispatch_recv_kernel<Tp, false, kBatched, kShare>);
}

template <class Tp>
cudaError_t load_tp() {
  cudaError_t e = load<Tp, false, false>();
  if constexpr (!Tp::kStaged) {
    if (e == cudaSuccess) e = load<Tp, true, false>();
    if (e == cudaSuccess) e = load<Tp, false, true>();
  }
  return e;
}

}  // namespace

/* Every receive kernel mep_ll_dispatch_recv may pick (mep_ll_dispatch_load). */
extern "C" cudaError_t mep_ll_dispatch_recv_load(void) {
  return mep_ll_each_transport([](auto tp) { return load_tp<typename decltype(tp)::type>(); });
}

extern "C" mep_kstatus_t mep_ll_dispatch_recv(const mep_ll_ctx_t *ctx,
                                                const mep_ll_dispatch_args_t *a, void *stream) {
  mep_kstatus_t st = mep_ll_dispatch_check("dispatch_recv", ctx, a);
  if (st != MEP_KSTATUS_OK) return st;
  if ((st = mep_dispatch_check_recv_ptrs("dispatch_recv", a)) != MEP_KSTATUS_OK) return st;
  MepLLParams p;
  mep_ll_make_params(ctx, a->buffer_set, &p);
  const MepDispatchArgs k = mep_dispatch_args(ctx, a);
  int grid = mep_ll_grid(ctx);
  if (grid > k.local_experts) grid = k.local_experts;
  const bool batched = mep_dispatch_recv_batched(ctx, grid, k.local_experts);
  const bool share = mep_dispatch_recv_shares(ctx, a, batched);
  const size_t smem = mep_dispatch_recv_smem(ctx, batched);
  cudaStream_t s = (cudaStream_t)stream;
  const cudaError_t e = mep_ll_with_transport(ctx->transport, [&](auto tp) {
    return launch_tp<typename decltype(tp)::type>(p, k, a->fp8, batched, share, grid, smem, s);
  });
  return mep_kernels_cuda_check("dispatch_recv: launch", e);
}
