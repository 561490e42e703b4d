/* ll_host.cu: host-side helpers of the LL path: buffer/state sizing, timeout
 * conversion, the launchers' error text. No kernels here except the abort
 * reset. */
#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdio.h>

#include "kernels/kernels_error.h"
#include "kernels/ll.h"
#include "kernels/limits.h"

static thread_local char g_kernels_error[512] = "";

extern "C" moe_ep_status_t mep_kernels_error(moe_ep_status_t st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_kernels_error, sizeof g_kernels_error, fmt, ap);
  va_end(ap);
  return st;
}

extern "C" moe_ep_status_t mep_kernels_cuda_check(const char *what, int err) {
  if (err == cudaSuccess) return MOE_EP_OK;
  return mep_kernels_error(MOE_EP_ERR_CUDA, "%s: CUDA error %d (%s)", what, err,
                           cudaGetErrorString((cudaError_t)err));
}

extern "C" const char *mep_kernels_last_error(void) { return g_kernels_error; }

extern "C" uint64_t mep_ll_buffer_bytes(int32_t num_local_experts, int32_t world,
                                        int32_t max_tokens, int32_t hidden, int32_t top_k,
                                        int32_t fp8) {
  mep_ll_dims_t d = {num_local_experts, world, max_tokens, hidden, top_k, fp8 ? 1 : 0};
  return (uint64_t)MEP_NUM_BUFFER_SETS * mep_ll_set_layout(&d).set_bytes;
}

extern "C" uint64_t mep_ll_state_bytes(const mep_ll_dims_t *dims) {
  return mep_ll_state_layout(dims).bytes;
}

extern "C" moe_ep_status_t mep_ll_timeout_cycles(int dev, int32_t kernel_ms, uint64_t *cycles) {
  if (kernel_ms <= 0 || kernel_ms > MEP_MAX_TIMEOUT_MS)
    return mep_kernels_error(MOE_EP_ERR_INVALID_ARGUMENT,
                             "timeout: kernel_ms is %d; it must be in 1..%d", kernel_ms,
                             MEP_MAX_TIMEOUT_MS);
  int khz = 0;
  moe_ep_status_t st = mep_kernels_cuda_check(
      "timeout: cudaDeviceGetAttribute(ClockRate)",
      cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, dev));
  if (st != MOE_EP_OK) return st;
  /* Peak clock: the real clock is lower or equal, so a wait never ends
   * early; it can last longer than kernel_ms by the clock ratio. */
  *cycles = (uint64_t)khz * (uint64_t)kernel_ms;
  return MOE_EP_OK;
}

extern "C" moe_ep_status_t mep_ll_clear_abort(const mep_ll_ctx_t *ctx, void *stream) {
  if (ctx == nullptr || ctx->state == nullptr)
    return mep_kernels_error(MOE_EP_ERR_INVALID_ARGUMENT, "clear_abort: ctx/state is NULL");
  mep_ll_state_layout_t s = mep_ll_state_layout(&ctx->dims);
  return mep_kernels_cuda_check(
      "clear_abort: cudaMemsetAsync",
      cudaMemsetAsync((char *)ctx->state + s.abort_flag, 0, 4, (cudaStream_t)stream));
}
