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
 * combine (epoch E, the one this rank's send of it stored) against block
 * 0's shadow, or for block 0's received-epoch word to carry E: this
 * rank's own receive of that combine, which waited for every source's
 * signal, ran meanwhile on another stream and moved the shadows past the
 * values read here. */
template <class Tp>
__global__ void __launch_bounds__(MEP_LL_AWAIT_THREADS)
    ll_await_combine_kernel(const __grid_constant__ MepLLParams p) {
  const int R = p.dims.world;
  const uint32_t epoch = mep_tag(p, R + 1);
  const int half = mep_ll_comb_half(epoch);
  const volatile uint32_t *received =
      p.tags + (uint64_t)blockIdx.x * mep_ll_tag_words(R) + (uint32_t)(R + 2);
  /* A value no signal reaches: the receive's word ended the wait. */
  constexpr uint64_t kReceived = ~0ull;
  for (int r = threadIdx.x; r < R; r += blockDim.x) {
    const uint32_t sig = mep_ll_sig_comb_cnt(&p.dims, half, r);
    const uint64_t base = mep_shadow(p, sig);
    auto read = [&] { return *received == epoch ? kReceived : Tp::read_signal(p.xp, sig); };
    /* staged: the last block's add after its puts; LSA: every block's
     * arrival (mep_wait_count's rules, the shadow left as it is) */
    auto came = [&](uint64_t v) {
      uint64_t code = 0;
      if (v == kReceived) return true;
      if constexpr (Tp::kRowSignals) return (int64_t)(v - (base + 1)) >= 0;
      return mep_ll_arrival_state(v - base, &code) != 0;
    };
    uint64_t seen = 0;
    (void)mep_wait(p.wc, read, came, Tp::kRowSignals ? base + 1 : base + MEP_LL_ARRIVAL_ONE,
                   MEP_LL_OP_DISPATCH_REUSE, r, -1, &seen);
  }
}

}  // namespace

extern "C" cudaError_t mep_ll_await_load(void) {
  return mep_ll_each_transport([](auto tp) {
    return mep_load_kernels(ll_await_combine_kernel<typename decltype(tp)::type>);
  });
}

extern "C" mep_kstatus_t mep_ll_await_combine(const mep_ll_ctx_t *ctx, int set, void *stream) {
  mep_kstatus_t st = mep_ll_check_ctx("await_combine", ctx, set);
  if (st != MEP_KSTATUS_OK) return st;
  MepLLParams p;
  mep_ll_make_params(ctx, set, &p);
  cudaStream_t s = (cudaStream_t)stream;
  const cudaError_t e = mep_ll_with_transport(ctx->transport, [&](auto tp) {
    return mep_launch(ll_await_combine_kernel<typename decltype(tp)::type>, 1, MEP_LL_AWAIT_THREADS,
                      0, s, p);
  });
  return mep_kernels_cuda_check("await_combine: launch", e);
}
