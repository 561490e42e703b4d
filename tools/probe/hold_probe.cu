// hold_probe.cu: which host calls of a group's setup wait for the engine's
// GPU work. A host function holds a stream (the legacy default stream, or
// a nonblocking one) for up to --hold_ms; each call below is timed while
// the hold is on, then the hold is released. A call that waits for the
// held stream takes about the hold; one that does not, a few ms at most.
// ncclMemAlloc is reached through dlopen (libnccl.so.2 on the library
// path). Build:
//   nvcc -O3 -arch=sm_90 -o hold_probe tools/probe/hold_probe.cu -ldl
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "check.h"

static std::atomic<int> g_state{0}, g_release{0};
static int g_hold_ms = 3000;

static void CUDART_CB hold(void *) {
  g_state = 1;
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(g_hold_ms);
  while (!g_release && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  g_state = 2;
}

__global__ void k_touch(int *p) { if (threadIdx.x == 0) *p = 1; }
/* launched for the first time in one pass each: a first launch loads the
 * kernel (lazy loading), which a launch of a loaded one does not */
__global__ void k_first_legacy(int *p) { if (threadIdx.x == 0) *p = 2; }
__global__ void k_first_nonblock(int *p) { if (threadIdx.x == 0) *p = 3; }

static double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}

template <class F>
static void timed(cudaStream_t held, const char *held_name, const char *what, F f) {
  g_state = 0;
  g_release = 0;
  CK(cudaLaunchHostFunc(held, hold, nullptr));
  while (g_state == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const double t0 = now_ms();
  f();
  const double ms = now_ms() - t0;
  const int expired = g_state == 2;
  g_release = 1;
  CK(cudaStreamSynchronize(held));
  printf("%-10s held: %-44s %9.2f ms%s\n", held_name, what, ms,
         expired ? "  (waited for the hold)" : "");
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; ++i)
    if (!strncmp(argv[i], "--hold_ms=", 10)) g_hold_ms = atoi(argv[i] + 10);
  CK(cudaSetDevice(0));
  CK(cudaFree(nullptr));
  typedef int (*mem_alloc_fn)(void **, size_t);
  typedef int (*mem_free_fn)(void *);
  void *nccl = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  mem_alloc_fn nccl_alloc = nccl ? (mem_alloc_fn)dlsym(nccl, "ncclMemAlloc") : nullptr;
  mem_free_fn nccl_free = nccl ? (mem_free_fn)dlsym(nccl, "ncclMemFree") : nullptr;
  cudaStream_t own, side;
  CK(cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  int *dev = nullptr, *pinned = nullptr;
  CK(cudaMalloc(&dev, 1 << 20));
  CK(cudaHostAlloc(&pinned, 4096, cudaHostAllocDefault));
  k_touch<<<1, 32, 0, own>>>(dev); /* loaded before any hold */
  CK(cudaStreamSynchronize(own));
  struct { cudaStream_t s; const char *name; void (*first)(int *); } helds[] = {
      {cudaStreamLegacy, "legacy", k_first_legacy}, {side, "nonblock", k_first_nonblock}};
  for (auto &h : helds) {
    void *p = nullptr;
    timed(h.s, h.name, "cudaStreamCreateWithFlags(NonBlocking)", [&] {
      cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      CK(cudaStreamDestroy(s)); });
    timed(h.s, h.name, "cudaEventCreate", [&] {
      cudaEvent_t e; CK(cudaEventCreate(&e)); CK(cudaEventDestroy(e)); });
    timed(h.s, h.name, "cudaMalloc 1 MiB", [&] { CK(cudaMalloc(&p, 1 << 20)); });
    CK(cudaFree(p));
    timed(h.s, h.name, "cudaMalloc 256 MiB", [&] { void *q; CK(cudaMalloc(&q, 256u << 20));
      p = q; });
    timed(h.s, h.name, "cudaFree (the 256 MiB)", [&] { CK(cudaFree(p)); });
    timed(h.s, h.name, "cudaFree(NULL)", [&] { CK(cudaFree(nullptr)); });
    timed(h.s, h.name, "cudaHostAlloc 4 KiB", [&] { CK(cudaHostAlloc(&p, 4096, 0)); });
    timed(h.s, h.name, "cudaFreeHost", [&] { CK(cudaFreeHost(p)); });
    timed(h.s, h.name, "cudaHostAlloc mapped 4 KiB", [&] {
      CK(cudaHostAlloc(&p, 4096, cudaHostAllocMapped)); });
    CK(cudaFreeHost(p));
    timed(h.s, h.name, "cudaMemsetAsync(own nonblocking) + sync", [&] {
      CK(cudaMemsetAsync(dev, 0, 1 << 20, own)); CK(cudaStreamSynchronize(own)); });
    timed(h.s, h.name, "cudaMemcpyAsync D2H pinned (own) + sync", [&] {
      CK(cudaMemcpyAsync(pinned, dev, 64, cudaMemcpyDeviceToHost, own));
      CK(cudaStreamSynchronize(own)); });
    timed(h.s, h.name, "loaded kernel on own stream + sync", [&] {
      k_touch<<<1, 32, 0, own>>>(dev); CK(cudaGetLastError());
      CK(cudaStreamSynchronize(own)); });
    timed(h.s, h.name, "a kernel's first launch on own stream + sync", [&] {
      h.first<<<1, 32, 0, own>>>(dev); CK(cudaGetLastError());
      CK(cudaStreamSynchronize(own)); });
    timed(h.s, h.name, "cudaMemset (synchronous API)", [&] { CK(cudaMemset(dev, 0, 64)); });
    timed(h.s, h.name, "cudaMemcpy D2H", [&] { int x; CK(cudaMemcpy(&x, dev, 4,
                                                                        cudaMemcpyDeviceToHost)); });
    /* Calls a teardown that must not wait for the engine could free with. */
    timed(h.s, h.name, "cudaEventQuery (own stream's event)", [&] {
      cudaEvent_t e; CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      CK(cudaEventRecord(e, own)); (void)cudaEventQuery(e); CK(cudaEventDestroy(e)); });
    timed(h.s, h.name, "cudaMallocAsync 1 MiB (own) + sync", [&] {
      CK(cudaMallocAsync(&p, 1 << 20, own)); CK(cudaStreamSynchronize(own)); });
    timed(h.s, h.name, "cudaFreeAsync of it (own), no sync", [&] { CK(cudaFreeAsync(p, own)); });
    CK(cudaStreamSynchronize(own));
    timed(h.s, h.name, "cudaFreeAsync of cudaMalloc memory (own)", [&] {
      void *q; CK(cudaMalloc(&q, 1 << 20));
      const cudaError_t e = cudaFreeAsync(q, own);
      if (e != cudaSuccess) { printf("  (refused: %s; left allocated)\n", cudaGetErrorString(e)); } });
    CK(cudaStreamSynchronize(own));
    void *hostmem = aligned_alloc(4096, 8192);
    timed(h.s, h.name, "cudaHostRegister mapped 8 KiB", [&] {
      CK(cudaHostRegister(hostmem, 8192, cudaHostRegisterMapped)); });
    timed(h.s, h.name, "cudaHostUnregister", [&] { CK(cudaHostUnregister(hostmem)); });
    free(hostmem);
    timed(h.s, h.name, "cudaStreamDestroy (own-made, idle)", [&] {
      cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      CK(cudaStreamDestroy(s)); });
    if (nccl_alloc != nullptr) {
      timed(h.s, h.name, "ncclMemAlloc 64 MiB", [&] {
        if (nccl_alloc(&p, 64u << 20) != 0) p = nullptr; });
      if (p != nullptr) timed(h.s, h.name, "ncclMemFree", [&] { nccl_free(p); });
    }
  }
  printf("probe done%s\n", nccl_alloc ? "" : " (no libnccl.so.2: ncclMemAlloc not timed)");
  return 0;
}
