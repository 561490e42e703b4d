/* load.cuh: loading kernels before their first launch, and launching them
 * with the launch's own status. */
#ifndef MEP_COMMON_LOAD_CUH_
#define MEP_COMMON_LOAD_CUH_

#include <cuda_runtime.h>

/* Loads kernels now. CUDA loads a kernel lazily at its first launch by
 * default, and that load waits for every kernel running on the device: a
 * launch in the middle of a run could wait behind the engine's work or
 * behind a receive of this group that spins until a peer sends. Asking
 * for a kernel's attributes loads it. The first error, or cudaSuccess. */
template <typename... Kernels>
static cudaError_t mep_load_kernels(Kernels... kernels) {
  cudaError_t e = cudaSuccess;
  cudaFuncAttributes f;
  ((e = e == cudaSuccess ? cudaFuncGetAttributes(&f, kernels) : e), ...);
  return e;
}

/* Launches a kernel and returns that launch's status. `<<<>>>` followed by
 * cudaGetLastError() would also return (and clear) an error the engine's
 * own code left pending on this thread, and a queued kernel, a send that
 * has gone out to the peers, would be reported as failed. */
template <typename... Params, typename... Args>
static cudaError_t mep_launch(void (*kernel)(Params...), int grid, int threads, size_t smem,
                              cudaStream_t s, Args &&...args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)grid);
  cfg.blockDim = dim3((unsigned)threads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  return cudaLaunchKernelEx(&cfg, kernel, static_cast<Args &&>(args)...);
}

#endif /* MEP_COMMON_LOAD_CUH_ */
