/* ll_combine_send.cu: LL combine, send half as its own kernel (the receive
 * is deferred to a hook). The body is in ll_combine_body.cuh. Also the
 * argument check shared by every combine launcher. */
#include "kernels/ll/ll_combine_body.cuh"

namespace {

template <class Tp>
__global__ void __launch_bounds__(MEP_LL_THREADS, 1)
    ll_combine_send_kernel(const MepCombineArgs a, const __grid_constant__ MepLLParams p) {
  extern __shared__ int smem[];
  mep_combine_send_body<Tp>(p, a, smem);
  /* the dispatch answered, for the receive kernel (mep_comb_dident) */
  mep_slots_store(p.tags, mep_ll_tag_words(p.dims.world), 1,
                  [&](int) { return p.dims.world + 3; }, [&](int) { return mep_comb_dident; });
}

}  // namespace

/* Every send kernel mep_ll_combine_send may pick (mep_ll_combine_load). */
extern "C" cudaError_t mep_ll_combine_send_load(void) {
  return mep_ll_each_transport([](auto tp) {
    return mep_load_kernels(ll_combine_send_kernel<typename decltype(tp)::type>);
  });
}

extern "C" mep_kstatus_t mep_ll_combine_check(const char *op, const mep_ll_ctx_t *ctx,
                                                const mep_ll_combine_args_t *a) {
  mep_kstatus_t st = mep_ll_check_call(op, ctx, a);
  if (st != MEP_KSTATUS_OK) return st;
  if (a->recv_count == nullptr || a->slot_src == nullptr || a->src_count == nullptr)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "%s: the handle arrays (recv_count, slot_src, src_count) must not "
                             "be NULL", op);
  return MEP_KSTATUS_OK;
}

extern "C" mep_kstatus_t mep_ll_combine_validate(const char *op, const mep_ll_ctx_t *ctx,
                                                 const mep_ll_combine_args_t *a) {
  mep_kstatus_t st = mep_ll_combine_check(op, ctx, a);
  if (st == MEP_KSTATUS_OK) st = mep_combine_check_send_ptrs(op, ctx, a);
  if (st == MEP_KSTATUS_OK) st = mep_combine_check_recv_ptrs(op, a);
  return st;
}

extern "C" mep_kstatus_t mep_ll_combine_send(const mep_ll_ctx_t *ctx,
                                               const mep_ll_combine_args_t *a, void *stream) {
  mep_kstatus_t st = mep_ll_combine_check("combine_send", ctx, a);
  if (st != MEP_KSTATUS_OK) return st;
  if ((st = mep_combine_check_send_ptrs("combine_send", ctx, a)) != MEP_KSTATUS_OK) return st;
  MepLLParams p;
  mep_ll_make_params(ctx, a->buffer_set, &p);
  const int grid = mep_ll_grid(ctx);
  const MepCombineArgs k = mep_combine_args(ctx, a, grid);
  const size_t smem = mep_combine_send_smem(ctx, &k);
  cudaStream_t s = (cudaStream_t)stream;
  const cudaError_t e = mep_ll_with_transport(ctx->transport, [&](auto tp) {
    return mep_launch(ll_combine_send_kernel<typename decltype(tp)::type>, grid, MEP_LL_THREADS,
                      smem, s, k, p);
  });
  return mep_kernels_cuda_check("combine_send: launch", e);
}
