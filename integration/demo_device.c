/* demo_device.c: the demo's host/device buffer twins (see demo_device.h). */
#include "integration/demo_device.h"

#include <cuda_runtime_api.h>
#include <stdlib.h>

static cudaError_t last = cudaSuccess;

int demo_buf_alloc(demo_buf_t *b, size_t bytes, int gpu) {
  b->bytes = bytes;
  b->host = aligned_alloc(64, (bytes + 63) / 64 * 64);
  b->dev = b->host;
  if (b->host == NULL) return 0;
  if (!gpu) return 1;
  return (last = cudaMalloc(&b->dev, bytes)) == cudaSuccess;
}

void demo_buf_free(demo_buf_t *b) {
  if (b->dev != b->host) cudaFree(b->dev);
  free(b->host);
}

int demo_upload(demo_buf_t *b) {
  if (b->dev == b->host) return 1;
  if ((last = cudaDeviceSynchronize()) != cudaSuccess) return 0;
  if ((last = cudaMemcpy(b->dev, b->host, b->bytes, cudaMemcpyHostToDevice)) != cudaSuccess) {
    return 0;
  }
  /* A pageable source may still be in flight when cudaMemcpy returns. */
  return (last = cudaDeviceSynchronize()) == cudaSuccess;
}

int demo_download(demo_buf_t *b) {
  if (b->dev == b->host) return 1;
  if ((last = cudaDeviceSynchronize()) != cudaSuccess) return 0;
  return (last = cudaMemcpy(b->host, b->dev, b->bytes, cudaMemcpyDeviceToHost)) == cudaSuccess;
}

int demo_set_device(int device) { return (last = cudaSetDevice(device)) == cudaSuccess; }

const char *demo_device_error(void) { return cudaGetErrorString(last); }
