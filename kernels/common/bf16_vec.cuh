/* bf16_vec.cuh: the 8-channel bf16 vector (one uint4, a lane's share of a
 * 256-channel warp step) that the combine reductions accumulate in f32. */
#ifndef MEP_BF16_VEC_CUH_
#define MEP_BF16_VEC_CUH_

#include <cuda_bf16.h>

/* acc[i] = fmaf(w, v[i], acc[i]) for the 8 channels of v, in channel order.
 * With w = 1 this is exactly acc[i] + v[i] (the product is exact). */
__device__ __forceinline__ void mep_bf16x8_fma(float acc[8], uint4 v, float w) {
  const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&v);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 f = __bfloat1622float2(h[j]);
    acc[2 * j] = fmaf(w, f.x, acc[2 * j]);
    acc[2 * j + 1] = fmaf(w, f.y, acc[2 * j + 1]);
  }
}

/* The 8 accumulators rounded (to nearest even) into one bf16 vector. */
__device__ __forceinline__ uint4 mep_bf16x8_pack(const float acc[8]) {
  uint4 o;
  __nv_bfloat162 *ob = reinterpret_cast<__nv_bfloat162 *>(&o);
#pragma unroll
  for (int j = 0; j < 4; ++j) ob[j] = __floats2bfloat162_rn(acc[2 * j], acc[2 * j + 1]);
  return o;
}

#endif /* MEP_BF16_VEC_CUH_ */
