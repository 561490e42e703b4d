/* ht_host.cu: host-side helpers of the HT path: window and state sizing,
 * the channel count a launch uses, loading the kernels. No kernels. */
#include <cuda_runtime.h>

#include "kernels/ht/ht_launch.cuh"
#include "kernels/transport/wait.cuh"

extern "C" cudaError_t mep_ht_dispatch_load(void);
extern "C" cudaError_t mep_ht_combine_load(void);

extern "C" mep_kstatus_t mep_ht_load(void) {
  cudaError_t e = mep_ht_dispatch_load();
  if (e == cudaSuccess) e = mep_ht_combine_load();
  return mep_kernels_cuda_check("ht: loading its kernels", e);
}

extern "C" uint64_t mep_ht_buffer_bytes(const mep_ht_dims_t *dims) {
  return mep_ht_window_layout(dims).bytes;
}

extern "C" int32_t mep_ht_gin_signals(const mep_ht_dims_t *dims) {
  return dims->node_ranks > 0 ? MEP_HT_SIG_KINDS * dims->world * MEP_HT_MAX_CHANNELS : 0;
}

extern "C" uint64_t mep_ht_state_bytes(const mep_ht_dims_t *dims) {
  return mep_ht_state_layout(dims).bytes;
}

extern "C" mep_kstatus_t mep_ht_raise_abort(const mep_ht_ctx_t *ctx, void *stream) {
  if (ctx == nullptr || ctx->state == nullptr)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT, "raise_abort: ctx/state is NULL");
  const mep_ht_state_t s = mep_ht_state_layout(&ctx->dims);
  return mep_kernels_cuda_check(
      "raise_abort: cudaMemcpyAsync",
      mep_raise_abort_flag((uint32_t *)((char *)ctx->state + s.abort_flag), (cudaStream_t)stream));
}

extern "C" int32_t mep_ht_channels(const mep_ht_ctx_t *ctx) {
  return mep_ht_channels_for(ctx->num_sms);
}
