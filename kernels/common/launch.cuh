/* launch.cuh: host-side launch helpers for any kernel mode: the device
 * communicator's size check, a type tag for picking a transport at run
 * time, the device's SM count and the cooperative launch. */
#ifndef MEP_COMMON_LAUNCH_CUH_
#define MEP_COMMON_LAUNCH_CUH_

#include <cuda_runtime.h>
#include <nccl.h>
#include <nccl_device.h>
#include <stddef.h>

#include "kernels/common/limits.h"

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

#endif /* MEP_COMMON_LAUNCH_CUH_ */
