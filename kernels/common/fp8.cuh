/* fp8.cuh: per-128-channel e4m3 quantisation by warps, for the LL dispatch
 * send (its LSA row units and its staged rows).
 * scale = max(amax, 1e-4) / 448 (IEEE division), optionally rounded up to a
 * power of two; q = e4m3_satfinite(x / scale) (the quotient as IEEE
 * division rounds it, through fp8_div.h's exact sequence): the same
 * operations, in the same order, as tests/oracle/quant.cc, so the bytes
 * match the oracle exactly. Non-finite input (moe_ep.h, "fp8 and
 * non-finite input"): amax is over the group's finite values only, +-inf
 * saturates to +-448 (0x7E / 0xFE) and NaN of either sign becomes 0x7F. */
#ifndef MEP_FP8_CUH_
#define MEP_FP8_CUH_

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "kernels/common/fp8_div.h"

#define MEP_FP8_MAX 448.0f
#define MEP_FP8_AMAX_FLOOR 1e-4f

/* 2^ceil(log2(s)) for a positive normal s, exactly as the oracle's
 * round_scale_pow2 (frexp, no log): s = m * 2^e, m in [0.5, 1). s is
 * always finite: amax skips non-finite values. */
__device__ __forceinline__ float mep_fp8_round_pow2(float s) {
  int e;
  const float m = frexpf(s, &e);
  return m == 0.5f ? ldexpf(1.0f, e - 1) : ldexpf(1.0f, e);
}

/* Scale for a group with absolute maximum `amax`. Rounding up keeps
 * |x / scale| <= 448 so UE8M0 never saturates. */
__device__ __forceinline__ float mep_fp8_scale(float amax, bool pow2) {
  const float s = __fdiv_rn(fmaxf(amax, MEP_FP8_AMAX_FLOOR), MEP_FP8_MAX);
  return pow2 ? mep_fp8_round_pow2(s) : s;
}

/* UE8M0 byte of a power-of-two scale: its biased exponent (= frexp's e - 1
 * + 127, the oracle's ue8m0_byte). */
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

/* 16 values / s -> 16 e4m3 bytes (RN, satfinite). `f` already holds x / s. */
__device__ __forceinline__ uint4 mep_fp8_pack16(const float f[16]) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_fp8x2_storage_t lo = __nv_cvt_float2_to_fp8x2(
        make_float2(f[4 * i], f[4 * i + 1]), __NV_SATFINITE, __NV_E4M3);
    const __nv_fp8x2_storage_t hi = __nv_cvt_float2_to_fp8x2(
        make_float2(f[4 * i + 2], f[4 * i + 3]), __NV_SATFINITE, __NV_E4M3);
    w[i] = (uint32_t)lo | ((uint32_t)hi << 16);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

/* Lane l's two 16-byte loads of a 512-channel step starting at channel
 * c0: channels c0 + 16 l .. c0 + 16 l + 15 (zero past `hidden`). */
__device__ __forceinline__ void mep_fp8_load_step(const __nv_bfloat16 *x, int c0, int hidden,
                                                  uint4 v[2]) {
  const int c = c0 + (threadIdx.x & 31) * 16;
  if (c < hidden) {
    const uint4 *src = reinterpret_cast<const uint4 *>(x + c);
    v[0] = __ldg(src);
    v[1] = __ldg(src + 1);
  } else {
    v[0] = v[1] = make_uint4(0u, 0u, 0u, 0u);
  }
}

/* Quantises the 512-channel step at c0 from the lane's loaded values (see
 * mep_fp8_load_step): 8 consecutive lanes own one 128-channel group, so
 * the amax reduction stays inside those 8 lanes and a group is either
 * wholly inside the row or wholly past its end. Every lane must call it
 * (shuffles). Writes q[c0 ..] and calls put_scale(group, scale) on one
 * lane per group. */
template <typename PutScale>
__device__ __forceinline__ void mep_fp8_quantize_step(const uint4 v[2], int c0, int hidden,
                                                      uint8_t *q, bool pow2,
                                                      PutScale put_scale) {
  const int lane = threadIdx.x & 31;
  const int c = c0 + lane * 16;
  float f[16];
  mep_bf16x8_to_f32(v[0], f);
  mep_bf16x8_to_f32(v[1], f + 8);
  /* The non-finite rule, a compare and a select or two per value, in the
   * pass that already reads them: an inf or NaN is left out of amax (NaN
   * fails a < inf), and a NaN is made positive so the conversion gives
   * 0x7F whatever the input's sign. */
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const float a = fabsf(f[i]);
    amax = fmaxf(amax, a < INFINITY ? a : 0.f);
    f[i] = f[i] == f[i] ? f[i] : a;
  }
#pragma unroll
  for (int m = 4; m >= 1; m >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
  if (c < hidden) {
    const float s = mep_fp8_scale(amax, pow2);
    /* one rounded reciprocal per group, no division per value */
    const float inv = __frcp_rn(s);
    if (pow2) {
      /* s = 2^e with 2^-e a normal float: inv is 2^-e exactly, and
       * x * 2^-e is exactly x / s. */
#pragma unroll
      for (int i = 0; i < 16; ++i) f[i] = __fmul_rn(f[i], inv);
    } else {
#pragma unroll
      for (int i = 0; i < 16; ++i) f[i] = mep_fp8_div(f[i], s, inv); /* fp8_div.h */
    }
    *reinterpret_cast<uint4 *>(q + c) = mep_fp8_pack16(f);
    if ((lane & 7) == 0) put_scale(c / 128, s);
  }
}

/* Quantise one row of `hidden` (multiple of 128) bf16 values with a warp:
 * kSteps 512-channel steps have their loads in flight together. x and q
 * must be 16-byte aligned. */
template <typename PutScale>
__device__ __forceinline__ void mep_fp8_quantize_row_warp(const __nv_bfloat16 *x, int hidden,
                                                          uint8_t *q, bool pow2,
                                                          PutScale put_scale) {
  constexpr int kSteps = 4;
  for (int base = 0; base < hidden; base += 512 * kSteps) {
    uint4 v[kSteps][2];
#pragma unroll
    for (int u = 0; u < kSteps; ++u) mep_fp8_load_step(x, base + u * 512, hidden, v[u]);
#pragma unroll
    for (int u = 0; u < kSteps; ++u) mep_fp8_quantize_step(v[u], base + u * 512, hidden, q, pow2, put_scale);
  }
}

#endif /* MEP_FP8_CUH_ */
