/* copy_warp.cuh: the warp copy the store transports and the receives move
 * rows with. */
#ifndef MEP_TRANSPORT_COPY_WARP_CUH_
#define MEP_TRANSPORT_COPY_WARP_CUH_

#include <cuda_runtime.h>
#include <stdint.h>

/* Warp copy of `bytes` (multiple of 16, 16-byte aligned) from src to dst.
 * Each step issues all of a lane's (up to kU) 16-byte loads before its
 * stores, so one step costs one load latency; the tail is a guarded step,
 * not a serial loop. Trip count: ceil(bytes / (512 kU)), bounded. kU = 16
 * (64 registers of payload) moves a 7 KB fp8 row in one step. */
template <uint32_t kU = 8>
__device__ __forceinline__ void mep_copy_warp(void *dst, const void *src, uint32_t bytes) {
  const uint32_t lane = threadIdx.x & 31;
  uint4 *d = reinterpret_cast<uint4 *>(dst);
  const uint4 *s = reinterpret_cast<const uint4 *>(src);
  const uint32_t n = bytes / 16;
  for (uint32_t base = 0; base < n; base += 32 * kU) {
    uint4 v[kU];
#pragma unroll
    for (uint32_t u = 0; u < kU; ++u) {
      const uint32_t i = base + u * 32 + lane;
      v[u] = i < n ? __ldcg(s + i) : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (uint32_t u = 0; u < kU; ++u) {
      const uint32_t i = base + u * 32 + lane;
      if (i < n) d[i] = v[u];
    }
  }
}

#endif /* MEP_TRANSPORT_COPY_WARP_CUH_ */
