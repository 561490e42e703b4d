// check.h: the probes' CUDA call check (a probe is a standalone measuring
// tool: a failed call ends it with the call and CUDA's reason).
#ifndef MEP_PROBE_CHECK_H_
#define MEP_PROBE_CHECK_H_

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(x)                                                                     \
  do {                                                                            \
    cudaError_t e_ = (x);                                                         \
    if (e_ != cudaSuccess) {                                                      \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(1);                                                                    \
    }                                                                             \
  } while (0)

#endif /* MEP_PROBE_CHECK_H_ */
