/* ll_await.cu: a dispatch's wait, before its send, for every peer to have
 * received the set's previous dispatch (mep_ll_await_combine). Every
 * peer starts its combine of that dispatch only after receiving it (its
 * experts read what it received), and the combine's count signal tells
 * this rank when it started (LSA: the send blocks' arrivals at their
 * start; staged: the last block's add after its puts). The rank's own
 * receive of that combine waits for the same signal; when it has not run
 * yet (its hook still pending: two-batch overlap's order), this kernel
 * waits for the signal without consuming it (the shadows stay for that
 * receive), so the dispatch's stores cannot land on rows or lists a peer
 * has still to read. */
#include "kernels/common/load.cuh"
#include "kernels/ll/ll_launch.cuh"
#include "kernels/ll/ll_signals.cuh"

namespace {

/* One block: thread r waits for source r's count signal of the set's last
 * combine (the epoch this rank's send of it stored), against block 0's
 * shadow, which that combine's receive reads too. */
template <class Tp>
__global__ void __launch_bounds__(MEP_LL_AWAIT_THREADS)
    ll_await_combine_kernel(const __grid_constant__ MepLLParams p) {
  const int R = p.dims.world;
  const int half = mep_ll_comb_half(mep_tag(p, R + 1));
  for (int r = threadIdx.x; r < R; r += blockDim.x) {
    uint64_t base = 0, increase = 0, code = 0;
    (void)mep_wait_count<Tp>(p, mep_ll_sig_comb_cnt(&p.dims, half, r),
                             MEP_LL_OP_DISPATCH_REUSE, r, &base, &increase, &code);
  }
}

}  // namespace

extern "C" cudaError_t mep_ll_await_load(void) {
  return mep_load_kernels(ll_await_combine_kernel<MepLsa>, ll_await_combine_kernel<MepGin>,
                          ll_await_combine_kernel<MepGinEmu>);
}

extern "C" mep_kstatus_t mep_ll_await_combine(const mep_ll_ctx_t *ctx, int set, void *stream) {
  mep_kstatus_t st = mep_ll_check_ctx("await_combine", ctx, set);
  if (st != MEP_KSTATUS_OK) return st;
  MepLLParams p;
  mep_ll_make_params(ctx, set, &p);
  cudaStream_t s = (cudaStream_t)stream;
  const cudaError_t e = mep_ll_with_transport(ctx->transport, [&](auto tp) {
    ll_await_combine_kernel<typename decltype(tp)::type><<<1, MEP_LL_AWAIT_THREADS, 0, s>>>(p);
    return cudaGetLastError();
  });
  return mep_kernels_cuda_check("await_combine: launch", e);
}
