/* ll_dispatch_send.cu: LL dispatch, send half as its own kernel (the
 * receive is deferred to a hook). The body, and what it sends, is in
 * ll_dispatch_body.cuh. Also the argument check shared by every dispatch
 * launcher. */
#include "kernels/ll/ll_dispatch_body.cuh"

namespace {

template <class Tp, bool kFp8, typename IdxT>
__global__ void __launch_bounds__(MEP_LL_THREADS, 1)
    ll_dispatch_send_kernel(const MepDispatchArgs a, const __grid_constant__ MepLLParams p) {
  mep_dispatch_send_body<Tp, kFp8, IdxT>(p, a);
}

template <class Tp, bool kFp8, typename IdxT>
cudaError_t launch(const MepLLParams &p, const MepDispatchArgs &a, int grid, cudaStream_t s) {
  return mep_launch(ll_dispatch_send_kernel<Tp, kFp8, IdxT>, grid, MEP_LL_THREADS, 0, s, a, p);
}

template <class Tp>
cudaError_t launch_tp(const MepLLParams &p, const MepDispatchArgs &a, bool fp8, int idx_bytes,
                      int grid, cudaStream_t s) {
  if (fp8) return idx_bytes == 8 ? launch<Tp, true, int64_t>(p, a, grid, s)
                                 : launch<Tp, true, int32_t>(p, a, grid, s);
  return idx_bytes == 8 ? launch<Tp, false, int64_t>(p, a, grid, s)
                        : launch<Tp, false, int32_t>(p, a, grid, s);
}

template <class Tp>
cudaError_t load_tp() {
  return mep_load_kernels(
      ll_dispatch_send_kernel<Tp, true, int32_t>, ll_dispatch_send_kernel<Tp, true, int64_t>,
      ll_dispatch_send_kernel<Tp, false, int32_t>, ll_dispatch_send_kernel<Tp, false, int64_t>);
}

}  // namespace

/* Every send kernel mep_ll_dispatch_send may pick (mep_ll_dispatch_load). */
extern "C" cudaError_t mep_ll_dispatch_send_load(void) {
  return mep_ll_each_transport([](auto tp) { return load_tp<typename decltype(tp)::type>(); });
}

extern "C" mep_kstatus_t mep_ll_dispatch_check(const char *op, const mep_ll_ctx_t *ctx,
                                                 const mep_ll_dispatch_args_t *a) {
  mep_kstatus_t st = mep_ll_check_call(op, ctx, a);
  if (st != MEP_KSTATUS_OK) return st;
  if (!MEP_LL_STAMPS && ctx->stamps != nullptr)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "%s: the context's stamps buffer is set, but these kernels were "
                             "built without phase stamps (link //kernels/ll:ll_stamped)", op);
  if (a->fp8 && a->hidden % MEP_HIDDEN_ALIGN != 0)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "%s: hidden is %d; fp8 dispatch needs a multiple of %d", op,
                             a->hidden, MEP_HIDDEN_ALIGN);
  if (a->fp8 && (a->scale_mode < MEP_FP8_SCALE_F32 ||
                 a->scale_mode > MEP_FP8_SCALE_UE8M0_PACKED))
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "%s: scale_mode is %d; it must be 0, 1 or 2", op, a->scale_mode);
  if (mep_ll_dispatch_row_bytes(a->hidden, a->fp8) >
      mep_ll_dispatch_row_bytes(ctx->dims.hidden, ctx->dims.fp8))
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "%s: a %s row of hidden %d does not fit the buffer sized for %s "
                             "hidden %d", op, a->fp8 ? "fp8" : "bf16", a->hidden,
                             ctx->dims.fp8 ? "fp8" : "bf16", ctx->dims.hidden);
  return MEP_KSTATUS_OK;
}

extern "C" mep_kstatus_t mep_ll_dispatch_validate(const char *op, const mep_ll_ctx_t *ctx,
                                                  const mep_ll_dispatch_args_t *a) {
  mep_kstatus_t st = mep_ll_dispatch_check(op, ctx, a);
  if (st == MEP_KSTATUS_OK) st = mep_dispatch_check_send_ptrs(op, a);
  if (st == MEP_KSTATUS_OK) st = mep_dispatch_check_recv_ptrs(op, a);
  return st;
}

extern "C" mep_kstatus_t mep_ll_dispatch_send(const mep_ll_ctx_t *ctx,
                                                const mep_ll_dispatch_args_t *a, void *stream) {
  mep_kstatus_t st = mep_ll_dispatch_check("dispatch_send", ctx, a);
  if (st != MEP_KSTATUS_OK) return st;
  if ((st = mep_dispatch_check_send_ptrs("dispatch_send", a)) != MEP_KSTATUS_OK) return st;
  MepLLParams p;
  mep_ll_make_params(ctx, a->buffer_set, &p);
  const MepDispatchArgs k = mep_dispatch_send_args(ctx, a);
  /* No more blocks than work units: a small batch launches a small grid. */
  const int grid = mep_ll_grid_for(ctx, mep_dispatch_units_at(ctx, a, k.chunk));
  cudaStream_t s = (cudaStream_t)stream;
  const cudaError_t e = mep_ll_with_transport(ctx->transport, [&](auto tp) {
    return launch_tp<typename decltype(tp)::type>(p, k, a->fp8, a->topk_idx_bytes, grid, s);
  });
  return mep_kernels_cuda_check("dispatch_send: launch", e);
}
