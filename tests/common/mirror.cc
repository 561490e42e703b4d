// mirror.cc: host/device buffer twins for the conformance workers.
#include "tests/common/mirror.h"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

namespace moe_ep_test {

void cuda_check(int err, const char* what) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "FAIL CUDA %s: %s\n", what,
                 cudaGetErrorString(static_cast<cudaError_t>(err)));
    std::exit(6);
  }
}

void Mirror::init(bool gpu, void* host, size_t bytes) {
  gpu_ = gpu;
  host_ = host;
  bytes_ = bytes;
  if (!gpu_) return;
  cuda_check(cudaMalloc(&dev_, bytes_ ? bytes_ : 16), "cudaMalloc");
  upload();
}

Mirror::~Mirror() {
  if (dev_ != nullptr) cudaFree(dev_);
}

void Mirror::upload() {
  if (!gpu_ || bytes_ == 0) return;
  cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize before upload");
  cuda_check(cudaMemcpy(dev_, host_, bytes_, cudaMemcpyHostToDevice), "upload");
  // From pageable memory cudaMemcpy may return before the DMA lands; work on
  // a non-blocking stream (graph replays) is not ordered after it.
  cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize after upload");
}

void Mirror::download() {
  if (!gpu_ || bytes_ == 0) return;
  cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize before download");
  cuda_check(cudaMemcpy(host_, dev_, bytes_, cudaMemcpyDeviceToHost), "download");
}

}  // namespace moe_ep_test
