/* ll_combine.cu: LL combine in one launch (send half, then receive half, in
 * the same kernel) for calls that do not defer the receive. As with the
 * fused dispatch, the receive waits for this rank's own count signal, made
 * of the send half's blocks' arrivals (LSA) or sent by its last block
 * (staged): a cooperative launch. */
#include "kernels/ll/ll_combine_body.cuh"

namespace {

template <class Tp, typename IdxT, int kKind>
__global__ void __launch_bounds__(MEP_LL_THREADS, 1)
    ll_combine_kernel(const MepCombineArgs a, const __grid_constant__ MepLLParams p) {
  extern __shared__ int smem[]; /* the send's, then the receive's */
  if constexpr (kKind == MEP_COMB_RECV_LINES) {
    /* apart from the send's: a warp's receive starts while others send */
    int *recv_smem = smem + mep_combine_recv_smem_off(a.local_experts, p.dims.world);
    mep_combine_recv_flag_zero(recv_smem, p.dims.world); /* the send's first barrier orders it */
    const uint32_t epoch = mep_combine_send_body<Tp>(p, a, smem);
    mep_combine_recv_body<Tp, IdxT, kKind>(p, a, recv_smem, epoch);
  } else { /* the receive's first barrier comes after every warp's send */
    const uint32_t epoch = mep_combine_send_body<Tp>(p, a, smem);
    mep_combine_recv_body<Tp, IdxT, kKind>(p, a, smem, epoch);
  }
}

/* Over LSA calls above the flagged limit take the kernel whose receive
 * sums line partials early (mep_combine_flagged decides the same on the
 * device). */
template <class Tp, typename IdxT>
cudaError_t launch_idx(const MepLLParams &p, const MepCombineArgs &a, int grid, size_t smem,
                       cudaStream_t s) {
  if constexpr (!Tp::kStaged)
    if (a.tokens > (int)p.lay.flag_tokens)
      return mep_ll_launch_fused(ll_combine_kernel<Tp, IdxT, MEP_COMB_RECV_LINES>, grid, smem, s,
                                 a, p);
  return mep_ll_launch_fused(ll_combine_kernel<Tp, IdxT, MEP_COMB_RECV_ANY>, grid, smem, s, a, p);
}

template <class Tp>
cudaError_t load_tp() {
  if constexpr (Tp::kStaged)
    return mep_load_kernels(ll_combine_kernel<Tp, int32_t, MEP_COMB_RECV_ANY>,
                            ll_combine_kernel<Tp, int64_t, MEP_COMB_RECV_ANY>);
  else
    return mep_load_kernels(ll_combine_kernel<Tp, int32_t, MEP_COMB_RECV_ANY>,
                            ll_combine_kernel<Tp, int64_t, MEP_COMB_RECV_ANY>,
                            ll_combine_kernel<Tp, int32_t, MEP_COMB_RECV_LINES>,
                            ll_combine_kernel<Tp, int64_t, MEP_COMB_RECV_LINES>);
}

template <class Tp>
cudaError_t launch_tp(const MepLLParams &p, const MepCombineArgs &a, int idx_bytes, int grid,
                      size_t smem, cudaStream_t s) {
  return idx_bytes == 8 ? launch_idx<Tp, int64_t>(p, a, grid, smem, s)
                        : launch_idx<Tp, int32_t>(p, a, grid, smem, s);
}

}  // namespace

extern "C" cudaError_t mep_ll_combine_send_load(void);
extern "C" cudaError_t mep_ll_combine_recv_load(void);

extern "C" mep_kstatus_t mep_ll_combine_load(void) {
  cudaError_t e =
      mep_ll_each_transport([](auto tp) { return load_tp<typename decltype(tp)::type>(); });
  if (e == cudaSuccess) e = mep_ll_combine_send_load();
  if (e == cudaSuccess) e = mep_ll_combine_recv_load();
  return mep_kernels_cuda_check("combine: loading its kernels", e);
}

extern "C" mep_kstatus_t mep_ll_combine(const mep_ll_ctx_t *ctx, const mep_ll_combine_args_t *a,
                                          void *stream) {
  const mep_kstatus_t st = mep_ll_combine_validate("combine", ctx, a);
  if (st != MEP_KSTATUS_OK) return st;
  MepLLParams p;
  mep_ll_make_params(ctx, a->buffer_set, &p);
  /* The send half walks every expert's slots: the whole grid. */
  const int grid = mep_ll_grid(ctx);
  const MepCombineArgs k = mep_combine_args(ctx, a, grid);
  const size_t smem =
      (size_t)mep_combine_recv_smem_off(k.local_experts, ctx->dims.world) * sizeof(int) +
      mep_combine_recv_smem(ctx);
  cudaStream_t s = (cudaStream_t)stream;
  const cudaError_t e = mep_ll_with_transport(ctx->transport, [&](auto tp) {
    return launch_tp<typename decltype(tp)::type>(p, k, a->topk_idx_bytes, grid, smem, s);
  });
  return mep_kernels_cuda_check("combine: launch", e);
}
