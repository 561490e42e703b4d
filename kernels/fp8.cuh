/* fp8.cuh: per-128-channel e4m3 quantisation, one warp per row, shared by the
 * LL dispatch send and the standalone mep_fp8_quantize kernel.
 * scale = max(amax, 1e-4) / 448, optionally rounded up to a power of two. */
#ifndef MEP_FP8_CUH_
#define MEP_FP8_CUH_

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#define MEP_FP8_MAX 448.0f
#define MEP_FP8_AMAX_FLOOR 1e-4f

/* Scale for a group with absolute maximum `amax`. Rounding up keeps
 * |x / scale| <= 448 so UE8M0 never saturates. */
__device__ __forceinline__ float mep_fp8_scale(float amax, bool pow2) {
  float s = fmaxf(amax, MEP_FP8_AMAX_FLOOR) / MEP_FP8_MAX;
  if (pow2) {
    /* Exact round-up to a power of two on the bits (no log2f rounding):
     * s is a positive normal float here. */
    uint32_t b = __float_as_uint(s);
    if (b & 0x7fffffu) b = (b & 0x7f800000u) + 0x00800000u;
    s = __uint_as_float(b);
  }
  return s;
}

/* UE8M0 byte of a power-of-two scale: its biased exponent. */
__device__ __forceinline__ uint8_t mep_ue8m0_byte(float s) {
  return (uint8_t)((__float_as_uint(s) >> 23) & 0xffu);
}

__device__ __forceinline__ void mep_bf16x8_to_f32(const uint4 v, float f[8]) {
  const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 p = __bfloat1622float2(h[i]);
    f[2 * i] = p.x;
    f[2 * i + 1] = p.y;
  }
}

/* Quantise one row of `hidden` (multiple of 128) bf16 values with a warp.
 * Each iteration covers 256 channels: lane l owns 8 channels, a half-warp
 * owns one 128-channel group, so the amax reduction stays in the half-warp.
 * Writes q[hidden] and calls put_scale(group, scale) on one lane per group. */
template <typename PutScale>
__device__ __forceinline__ void mep_fp8_quantize_row_warp(const __nv_bfloat16 *x, int hidden,
                                                          uint8_t *q, bool pow2,
                                                          PutScale put_scale) {
  const int lane = threadIdx.x & 31;
  for (int base = 0; base < hidden; base += 256) {
    const int c = base + lane * 8;
    const bool valid = c < hidden; /* whole half-warp valid or not */
    float f[8];
    float amax = 0.f;
    if (valid) {
      uint4 v = __ldg(reinterpret_cast<const uint4 *>(x + c));
      mep_bf16x8_to_f32(v, f);
#pragma unroll
      for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(f[i]));
    }
#pragma unroll
    for (int m = 8; m >= 1; m >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
    if (valid) {
      const float s = mep_fp8_scale(amax, pow2);
      const float inv = 1.0f / s;
      uint32_t w[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        __nv_fp8x2_storage_t lo = __nv_cvt_float2_to_fp8x2(
            make_float2(f[4 * i] * inv, f[4 * i + 1] * inv), __NV_SATFINITE, __NV_E4M3);
        __nv_fp8x2_storage_t hi = __nv_cvt_float2_to_fp8x2(
            make_float2(f[4 * i + 2] * inv, f[4 * i + 3] * inv), __NV_SATFINITE, __NV_E4M3);
        w[i] = (uint32_t)lo | ((uint32_t)hi << 16);
      }
      *reinterpret_cast<uint2 *>(q + c) = make_uint2(w[0], w[1]);
      if ((lane & 15) == 0) put_scale(c / 128, s);
    }
  }
}

#endif /* MEP_FP8_CUH_ */
