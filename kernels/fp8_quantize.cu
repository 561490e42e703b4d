/* fp8_quantize.cu: the standalone fp8 quantisation kernel and its launcher
 * (mep_fp8_quantize); the LL dispatch uses the same row routine (fp8.cuh). */
#include <cuda_runtime.h>

#include "kernels/fp8.cuh"
#include "kernels/kernels_error.h"
#include "kernels/ll.h"
#include "kernels/limits.h"

namespace {

constexpr int kWarps = 8;

__global__ void __launch_bounds__(kWarps * 32)
    fp8_quantize_kernel(const __nv_bfloat16 *x, int tokens, int hidden, int mode,
                        uint8_t *q, void *scales) {
  const int warp = blockIdx.x * kWarps + threadIdx.x / 32;
  if (warp >= tokens) return;
  const int lane = threadIdx.x & 31;
  const int groups = hidden / 128;
  const __nv_bfloat16 *xr = x + (size_t)warp * hidden;
  uint8_t *qr = q + (size_t)warp * hidden;
  if (mode == MOE_EP_FP8_SCALE_UE8M0_PACKED) {
    const int words = (groups + 3) / 4;
    uint8_t *sr = reinterpret_cast<uint8_t *>(scales) + (size_t)warp * words * 4;
    /* Zero the row's last word first: its unused tail bytes stay zero. */
    if (lane == 0) reinterpret_cast<uint32_t *>(sr)[words - 1] = 0;
    __syncwarp();
    mep_fp8_quantize_row_warp(xr, hidden, qr, true,
                              [&](int g, float s) { sr[g] = mep_ue8m0_byte(s); });
  } else {
    float *sr = reinterpret_cast<float *>(scales) + (size_t)warp * groups;
    mep_fp8_quantize_row_warp(xr, hidden, qr, mode == MOE_EP_FP8_SCALE_UE8M0,
                              [&](int g, float s) { sr[g] = s; });
  }
}

}  // namespace

extern "C" moe_ep_status_t mep_fp8_quantize(const void *x, int32_t num_tokens, int32_t hidden,
                                            int32_t scale_mode, void *q, void *scales,
                                            void *stream) {
  if (num_tokens < 0)
    return mep_kernels_error(MOE_EP_ERR_INVALID_ARGUMENT,
                             "fp8_quantize: num_tokens is %d; it must be >= 0", num_tokens);
  if (hidden <= 0 || hidden % MEP_HIDDEN_ALIGN != 0 || hidden > MEP_MAX_HIDDEN)
    return mep_kernels_error(MOE_EP_ERR_INVALID_ARGUMENT,
                             "fp8_quantize: hidden is %d; it must be a positive multiple of %d "
                             "up to %d", hidden, MEP_HIDDEN_ALIGN, MEP_MAX_HIDDEN);
  if (scale_mode < MOE_EP_FP8_SCALE_F32 || scale_mode > MOE_EP_FP8_SCALE_UE8M0_PACKED)
    return mep_kernels_error(MOE_EP_ERR_INVALID_ARGUMENT,
                             "fp8_quantize: scale_mode is %d; it must be 0, 1 or 2", scale_mode);
  if (num_tokens > 0 && (x == nullptr || q == nullptr || scales == nullptr))
    return mep_kernels_error(MOE_EP_ERR_INVALID_ARGUMENT,
                             "fp8_quantize: x, q and scales must not be NULL");
  if (num_tokens > 0 && (((uintptr_t)x | (uintptr_t)q) & 15u) != 0)
    return mep_kernels_error(MOE_EP_ERR_INVALID_ARGUMENT,
                             "fp8_quantize: x (%p) and q (%p) must be 16-byte aligned (rows "
                             "move as 16-byte vectors)", x, q);
  if (num_tokens == 0) return MOE_EP_OK;
  const int blocks = (num_tokens + kWarps - 1) / kWarps;
  fp8_quantize_kernel<<<blocks, kWarps * 32, 0, (cudaStream_t)stream>>>(
      (const __nv_bfloat16 *)x, num_tokens, hidden, scale_mode, (uint8_t *)q, scales);
  return mep_kernels_cuda_check("fp8_quantize", cudaGetLastError());
}
