/* bf16_vec.cuh: the 8-channel bf16 vector (one uint4, a lane's share of a
 * 256-channel warp step) that the combine reductions accumulate in f32,
 * and the S-step units they walk a row in. */
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

/* The combine reductions' units: S vectors per lane, 256 channels apart
 * (a lane's channels c + 256 j for j < S), accumulated in acc[S][8]. */
template <int S>
__device__ __forceinline__ void mep_steps_zero(float acc[S][8]) {
#pragma unroll
  for (int j = 0; j < S; ++j)
#pragma unroll
    for (int q = 0; q < 8; ++q) acc[j][q] = 0.f;
}

/* v[j] = row's vector at c + 256 j when use and that channel is below
 * limit, else zero; an L2-only load (rows peers wrote into this GPU's
 * window: the receives' sums). */
template <int S>
__device__ __forceinline__ void mep_steps_load(uint4 v[S], const __nv_bfloat16 *row, int c,
                                               int limit, bool use) {
#pragma unroll
  for (int j = 0; j < S; ++j) {
    const int cj = c + j * 256;
    const uint4 *src = reinterpret_cast<const uint4 *>(row + cj);
    v[j] = use && cj < limit ? __ldcg(src) : make_uint4(0u, 0u, 0u, 0u);
  }
}

/* v[j] = row's vector at c + kStride j (256, or 240 for line partials), or
 * at limit - 8 for a step at or past
 * the limit (channels nobody stores), for the expert outputs the combine
 * send reduces. Every load is issued, none predicated, so each lands in
 * its own registers: a load that must give zeros when skipped goes through
 * a scratch register quad and a predicated move, and under the 128-register
 * cap ptxas kept only 4 of the send's 16-load batch in flight that way,
 * 12-16 unpredicated (tools/bench/load_depth.py; EP1, H200: the fused
 * combine 0.3-1.2 us faster at 128-256 tokens). The caller passes a valid
 * row for every vector and adds only the used ones. Plain loads: through
 * the read-only path (ld.global.nc) the send half ran 3.5-4.1 us slower at
 * 128 tokens on 24 SMs and 0.8-1.1 us at 256 on the whole grid (EP2,
 * H200). */
template <int S, int kStride = 256>
__device__ __forceinline__ void mep_steps_load_all(uint4 v[S], const __nv_bfloat16 *row, int c,
                                                   int limit) {
#pragma unroll
  for (int j = 0; j < S; ++j) {
    const int cj = c + j * kStride;
    v[j] = *reinterpret_cast<const uint4 *>(row + (cj < limit ? cj : limit - 8));
  }
}

template <int S>
__device__ __forceinline__ void mep_steps_fma(float acc[S][8], const uint4 v[S], float w) {
#pragma unroll
  for (int j = 0; j < S; ++j) mep_bf16x8_fma(acc[j], v[j], w);
}

/* acc += part rounded to bf16, channel by channel: one rank's partial
 * added to a token's sum (the add is exact in the fmaf with w = 1). */
template <int S>
__device__ __forceinline__ void mep_steps_add_rounded(float acc[S][8], const float part[S][8]) {
#pragma unroll
  for (int j = 0; j < S; ++j) mep_bf16x8_fma(acc[j], mep_bf16x8_pack(part[j]), 1.0f);
}

/* dst_row's vectors at c + 256 j below limit = acc rounded to bf16. */
template <int S>
__device__ __forceinline__ void mep_steps_store(__nv_bfloat16 *dst_row, const float acc[S][8],
                                                int c, int limit) {
#pragma unroll
  for (int j = 0; j < S; ++j) {
    const int cj = c + j * 256;
    if (cj < limit) *reinterpret_cast<uint4 *>(dst_row + cj) = mep_bf16x8_pack(acc[j]);
  }
}

#endif /* MEP_BF16_VEC_CUH_ */
