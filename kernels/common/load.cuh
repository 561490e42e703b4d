/* load.cuh: loading kernels before their first launch. */
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

#endif /* MEP_COMMON_LOAD_CUH_ */
