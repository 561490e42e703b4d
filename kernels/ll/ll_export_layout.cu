/* ll_export_layout.cu: the LL handle's layout in DeepEP's form
 * (mep_ll_export_layout): per local expert, each received slot's source
 * token (src_info) and each source rank's range of slots (layout_range),
 * for engines that read DeepEP's low-latency handle. */
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/common/kernels_error.h"
#include "kernels/common/load.cuh"
#include "kernels/common/limits.h"
#include "kernels/ll/ll.h"

namespace {

/* One block per local expert, one thread per source rank for the prefix:
 * every world fits one block, so no pass across blocks. */
constexpr int kThreads = 1024;
static_assert(MEP_MAX_RANKS <= kThreads, "the prefix takes one thread per source rank");

/* Exclusive prefix sum of v over the block; *total gets the block's sum.
 * Block-wide, blockDim.x == kThreads. */
__device__ int block_exclusive_sum(int v, int *total) {
  __shared__ int warp_sum[kThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int incl = v;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int o = __shfl_up_sync(0xffffffffu, incl, d);
    if (lane >= d) incl += o;
  }
  if (lane == 31) warp_sum[warp] = incl;
  __syncthreads();
  if (warp == 0) { /* each lane reads and then rewrites only its own entry */
    int w = warp_sum[lane];
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int o = __shfl_up_sync(0xffffffffu, w, d);
      if (lane >= d) w += o;
    }
    warp_sum[lane] = w;
  }
  __syncthreads();
  *total = warp_sum[kThreads / 32 - 1];
  return (warp > 0 ? warp_sum[warp - 1] : 0) + incl - v;
}

/* The receive fills each expert's slots in (source rank, token) order, so
 * source r's slots start at the sum of the counts of the sources before
 * it, and slots past the expert's total hold nothing (-1). */
__global__ void __launch_bounds__(kThreads)
    export_layout_kernel(const int32_t *slot_src, const int32_t *src_count, int R, int M,
                         int32_t *src_info, int64_t *layout_range) {
  const size_t le = blockIdx.x;
  const int r = threadIdx.x;
  const int n = r < R ? src_count[le * R + r] : 0;
  int recv = 0;
  const int begin = block_exclusive_sum(n, &recv);
  if (layout_range != nullptr && r < R)
    layout_range[le * R + r] = (int64_t)(((uint64_t)(uint32_t)begin << 32) | (uint32_t)n);
  if (src_info == nullptr) return;
  const size_t row = le * R * M;
  for (int s = threadIdx.x; s < R * M; s += kThreads)
    src_info[row + s] = s < recv ? MEP_LL_SLOT_TOKEN(slot_src[row + s]) : -1;
}

}  // namespace

extern "C" cudaError_t mep_ll_export_layout_load(void) {
  return mep_load_kernels(export_layout_kernel);
}

extern "C" mep_kstatus_t mep_ll_export_layout(const int32_t *slot_src, const int32_t *src_count,
                                                int32_t e_local, int32_t world,
                                                int32_t max_tokens, int32_t *src_info,
                                                int64_t *layout_range, void *stream) {
  if (e_local < 1 || e_local > MEP_MAX_LOCAL_EXPERTS)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "export_layout: e_local is %d; it must be in 1..%d", e_local,
                             MEP_MAX_LOCAL_EXPERTS);
  if (world < 1 || world > MEP_MAX_RANKS)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "export_layout: world is %d; it must be in 1..%d", world,
                             MEP_MAX_RANKS);
  if (max_tokens < 1 || max_tokens > MEP_MAX_TOKENS_LL)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "export_layout: max_tokens is %d; it must be in 1..%d", max_tokens,
                             MEP_MAX_TOKENS_LL);
  if (src_info == nullptr && layout_range == nullptr) return MEP_KSTATUS_OK; /* nothing asked for */
  if (src_count == nullptr)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT, "export_layout: src_count is NULL");
  if (src_info != nullptr && slot_src == nullptr)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "export_layout: slot_src is NULL with src_info asked for");
  const cudaError_t e = mep_launch(export_layout_kernel, e_local, kThreads, 0, (cudaStream_t)stream,
                                   slot_src, src_count, world, max_tokens, src_info, layout_range);
  return mep_kernels_cuda_check("export_layout: launch", e);
}
