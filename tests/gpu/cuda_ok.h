// cuda_ok.h: the GPU tests' check of a CUDA runtime call: a failed call
// fails the test (ASSERT: the function returns) naming the call and CUDA's
// sentence.
#ifndef MEP_TESTS_GPU_CUDA_OK_H_
#define MEP_TESTS_GPU_CUDA_OK_H_

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#define CUDA_OK(x)                                                      \
  do {                                                                  \
    cudaError_t e_ = (x);                                               \
    ASSERT_EQ(e_, cudaSuccess) << #x << ": " << cudaGetErrorString(e_); \
  } while (0)

#endif  // MEP_TESTS_GPU_CUDA_OK_H_
