/* launch.cuh: host-side launch helpers for any kernel mode: the device
 * communicator's size check, a type tag for picking a transport at run
 * time, the device's SM count and the cooperative launch. */
#ifndef MEP_COMMON_LAUNCH_CUH_
#define MEP_COMMON_LAUNCH_CUH_

#include <cuda_runtime.h>
#include <nccl.h>
#include <nccl_device.h>
#include <stddef.h>

#include "kernels/common/kernels_error.h"
#include "kernels/common/limits.h"
#include "kernels/common/load.cuh"

static_assert(sizeof(ncclDevComm) <= MEP_DEVCOMM_BYTES,
              "ncclDevComm outgrew MEP_DEVCOMM_BYTES in kernels/common/limits.h");

/* A type as a value: a launcher that picks its transport at run time hands
 * a generic lambda MepType<Tp>{} and instantiates its kernel in one place. */
template <typename T>
struct MepType {
  using type = T;
};

/* SMs of the current device. */
static inline int mep_device_sms(void) {
  int dev = 0, sms = 1;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  return sms;
}

/* Launches a kernel whose blocks wait for each other as a cooperative grid:
 * every block resident at once, or the launch fails, instead of leaving
 * residency to whatever else holds SMs. */
template <typename... Params, typename... Args>
static cudaError_t mep_launch_cooperative(void (*kernel)(Params...), int grid, int threads,
                                          size_t smem, cudaStream_t s, Args &&...args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)grid);
  cfg.blockDim = dim3((unsigned)threads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, static_cast<Args &&>(args)...);
}

/* A call's shape against the capacities its buffers were sized for (every
 * mode's launchers start with it): tokens in 0..max_tokens, hidden a
 * multiple of 8 in 1..cap_hidden, top_k in 1..cap_top_k, num_experts a
 * multiple of world with at most local_experts per rank, 4- or 8-byte ids. */
static inline mep_kstatus_t mep_check_shape(const char *op, int tokens, int max_tokens,
                                            int hidden, int cap_hidden, int top_k,
                                            int cap_top_k, int num_experts, int world,
                                            int local_experts, int idx_bytes) {
  if (cap_hidden > MEP_MAX_HIDDEN) cap_hidden = MEP_MAX_HIDDEN;
  if (cap_top_k > MEP_MAX_TOP_K) cap_top_k = MEP_MAX_TOP_K;
  if (tokens < 0 || tokens > max_tokens)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "%s: num_tokens is %d; it must be in 0..%d (max_tokens)", op,
                             tokens, max_tokens);
  if (hidden <= 0 || hidden > cap_hidden || hidden % MEP_BF16_HIDDEN_ALIGN != 0)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "%s: hidden is %d; it must be a multiple of %d in 1..%d", op, hidden,
                             MEP_BF16_HIDDEN_ALIGN, cap_hidden);
  if (top_k < 1 || top_k > cap_top_k)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "%s: top_k is %d; it must be in 1..%d", op, top_k, cap_top_k);
  if (num_experts <= 0 || num_experts % world != 0 || num_experts / world > local_experts)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "%s: num_experts is %d; it must be a multiple of world %d with at "
                             "most %d per rank", op, num_experts, world, local_experts);
  if (idx_bytes != 4 && idx_bytes != 8)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "%s: topk_idx_bytes is %d; it must be 4 (int32) or 8 (int64)", op,
                             idx_bytes);
  return MEP_KSTATUS_OK;
}

#endif /* MEP_COMMON_LAUNCH_CUH_ */
