// nvlink_probe.cu: micro-measurements behind the LL kernels' fixed costs, on
// two GPUs of one host with peer access (no NCCL): launch of an empty grid,
// system fences, a row store + signal to the peer, the block-ticket pattern,
// and warp-per-row copy throughput to the peer against cudaMemcpyPeerAsync.
// Median of CUDA-event times over --iters launches. Build:
//   nvcc -O3 -arch=sm_90 -o nvlink_probe tools/probe/nvlink_probe.cu
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "check.h"

struct Big { char pad[1200]; };
struct Mid { char pad[560]; }; /* the LL kernels' parameter block */

__global__ void k_empty() {}
__global__ void k_empty_big(const __grid_constant__ Big b) { if (b.pad[0] == 7 && threadIdx.x == 9999) asm volatile("trap;"); }
__global__ void k_empty_mid(const __grid_constant__ Mid b) { if (b.pad[0] == 7 && threadIdx.x == 9999) asm volatile("trap;"); }
__global__ void k_fence_sys() { if (threadIdx.x == 0) __threadfence_system(); }
__global__ void k_fence_gpu() { if (threadIdx.x == 0) __threadfence(); }

__device__ __forceinline__ void copy_warp(void *dst, const void *src, uint32_t bytes) {
  const uint32_t lane = threadIdx.x & 31;
  uint4 *d = reinterpret_cast<uint4 *>(dst);
  const uint4 *s = reinterpret_cast<const uint4 *>(src);
  const uint32_t n = bytes / 16;
  for (uint32_t base = 0; base < n; base += 256) {
    uint4 v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) { uint32_t i = base + u * 32 + lane; v[u] = i < n ? __ldcg(s + i) : make_uint4(0,0,0,0); }
#pragma unroll
    for (int u = 0; u < 8; ++u) { uint32_t i = base + u * 32 + lane; if (i < n) d[i] = v[u]; }
  }
}

// One warp: a row to the peer, then signal (mode 0: fence.sc.sys + atomicAdd_system; 1: red.release.sys; 2: none)
__global__ void k_row_signal(char *peer, const char *src, uint32_t bytes, unsigned long long *peer_sig, int mode) {
  if (threadIdx.x >= 32) return;
  copy_warp(peer, src, bytes);
  __syncwarp();
  if (threadIdx.x == 0) {
    if (mode == 0) { __threadfence_system(); atomicAdd_system(peer_sig, 1ull); }
    else if (mode == 1) asm volatile("red.release.sys.global.add.u64 [%0], 1;" :: "l"(peer_sig) : "memory");
  }
}

// The smallest exchange a 1-token dispatch needs, run on both GPUs at once:
// warp 0 stores a row into the peer, then a release add on the peer's flag;
// lane 0 then waits (bounded, ~20 ms) until its own flag reaches the count
// it keeps in *seen (one more each launch, so a graph replays it as is).
__global__ void k_exchange(char *peer_row, const char *src, uint32_t bytes,
                           unsigned long long *peer_flag, unsigned long long *my_flag,
                           unsigned long long *seen) {
  if (threadIdx.x >= 32) return;
  copy_warp(peer_row, src, bytes);
  __syncwarp();
  if (threadIdx.x == 0) {
    asm volatile("red.release.sys.global.add.u64 [%0], 1;" :: "l"(peer_flag) : "memory");
    const unsigned long long want = *seen + 1;
    const long long t0 = clock64();
    unsigned long long v = 0;
    do {
      asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(my_flag) : "memory");
    } while (v < want && clock64() - t0 < 40000000ll);
    *seen = want;
  }
}

// Every block: bar + fence.sc.sys + ticket; the last block signals the peer.
__global__ void k_ticket(unsigned *ticket, unsigned long long *peer_sig, int fence_sys) {
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    if (fence_sys) __threadfence_system(); else __threadfence();
    last = atomicAdd(ticket, 1u) == gridDim.x - 1;
    if (last) { *ticket = 0; __threadfence(); }
  }
  __syncthreads();
  if (last && threadIdx.x == 0) asm volatile("red.release.sys.global.add.u64 [%0], 1;" :: "l"(peer_sig) : "memory");
}

// rows of row_bytes, one warp per row, round robin over the grid.
__global__ void k_rows(char *dst, const char *src, int rows, uint32_t row_bytes) {
  const int nw = gridDim.x * (blockDim.x / 32), w = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  for (int r = w; r < rows; r += nw) copy_warp(dst + (size_t)r * row_bytes, src + (size_t)r * row_bytes, row_bytes);
}

// rows split in chunks: unit = (row, chunk of chunk_bytes)
__global__ void k_rows_chunked(char *dst, const char *src, int rows, uint32_t row_bytes, uint32_t chunk) {
  const int nw = gridDim.x * (blockDim.x / 32), w = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int nch = (row_bytes + chunk - 1) / chunk;
  for (int u = w; u < rows * nch; u += nw) {
    int r = u / nch, c = u % nch;
    uint32_t off = c * chunk, n = chunk < row_bytes - off ? chunk : row_bytes - off;
    copy_warp(dst + (size_t)r * row_bytes + off, src + (size_t)r * row_bytes + off, n);
  }
}

static int g_iters = 500;
// Median time (us) between consecutive events of ev (g_iters + 1 of them,
// recorded on the current device); destroys them.
static float median_between(std::vector<cudaEvent_t> &ev) {
  std::vector<float> t(g_iters);
  for (int i = 0; i < g_iters; ++i) { CK(cudaEventElapsedTime(&t[i], ev[i], ev[i + 1])); t[i] *= 1000.f; }
  for (auto &e : ev) cudaEventDestroy(e);
  std::sort(t.begin(), t.end());
  return t[g_iters / 2];
}
static float median_us(cudaStream_t s, const std::function<void()> &f) {
  std::vector<cudaEvent_t> ev(g_iters + 1);
  for (auto &e : ev) CK(cudaEventCreate(&e));
  for (int i = 0; i < 20; ++i) f();
  CK(cudaStreamSynchronize(s));
  CK(cudaEventRecord(ev[0], s));
  for (int i = 0; i < g_iters; ++i) { f(); CK(cudaEventRecord(ev[i + 1], s)); }
  CK(cudaStreamSynchronize(s));
  return median_between(ev);
}

// As median_us, but every timed launch (and its event) goes into one CUDA
// graph per stream, as the bench's --graph does; `each(i)` enqueues
// iteration i on every stream in `ss` (ss[0] is timed), and the graphs of
// all streams are launched together.
static float median_graph_us(const std::vector<cudaStream_t> &ss, const std::vector<int> &devs,
                             const std::function<void(cudaStream_t, int)> &each) {
  std::vector<cudaEvent_t> ev(g_iters + 1);
  CK(cudaSetDevice(devs[0]));
  for (auto &e : ev) CK(cudaEventCreate(&e));
  std::vector<cudaGraphExec_t> ge(ss.size());
  for (size_t k = 0; k < ss.size(); ++k) {
    CK(cudaSetDevice(devs[k]));
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(ss[k], cudaStreamCaptureModeThreadLocal));
    if (k == 0) CK(cudaEventRecordWithFlags(ev[0], ss[0], cudaEventRecordExternal));
    for (int i = 0; i < g_iters; ++i) {
      each(ss[k], (int)k);
      if (k == 0) CK(cudaEventRecordWithFlags(ev[i + 1], ss[0], cudaEventRecordExternal));
    }
    CK(cudaStreamEndCapture(ss[k], &g));
    CK(cudaGraphInstantiate(&ge[k], g, 0));
    CK(cudaGraphDestroy(g));
  }
  for (int rep = 0; rep < 2; ++rep) {  // a warm replay, then the timed one
    for (size_t k = 0; k < ss.size(); ++k) {
      CK(cudaSetDevice(devs[k]));
      CK(cudaGraphLaunch(ge[k], ss[k]));
    }
    for (size_t k = 0; k < ss.size(); ++k) {
      CK(cudaSetDevice(devs[k]));
      CK(cudaStreamSynchronize(ss[k]));
    }
  }
  for (size_t k = 0; k < ss.size(); ++k) { CK(cudaSetDevice(devs[k])); cudaGraphExecDestroy(ge[k]); }
  CK(cudaSetDevice(devs[0]));
  return median_between(ev);
}

int main(int argc, char **argv) {
  if (argc > 1) g_iters = atoi(argv[1]);
  int n = 0;
  CK(cudaGetDeviceCount(&n));
  if (n < 2) { fprintf(stderr, "needs 2 GPUs\n"); return 1; }
  CK(cudaSetDevice(1)); CK(cudaDeviceEnablePeerAccess(0, 0));
  char *peer_buf; CK(cudaMalloc(&peer_buf, 64 << 20));
  unsigned long long *peer_sig; CK(cudaMalloc(&peer_sig, 4096)); CK(cudaMemset(peer_sig, 0, 4096));
  CK(cudaSetDevice(0)); CK(cudaDeviceEnablePeerAccess(1, 0));
  char *src, *local; CK(cudaMalloc(&src, 64 << 20)); CK(cudaMalloc(&local, 64 << 20));
  CK(cudaMemset(src, 1, 64 << 20));
  unsigned *ticket; CK(cudaMalloc(&ticket, 64)); CK(cudaMemset(ticket, 0, 64));
  cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int sms = 0; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  Big big = {};
  printf("probe: GPU0 -> GPU1, %d SMs, median of %d launches (us)\n", sms, g_iters);
  printf("empty 1x32                 %6.2f\n", median_us(s, [&] { k_empty<<<1, 32, 0, s>>>(); }));
  printf("empty %dx512              %6.2f\n", sms, median_us(s, [&] { k_empty<<<sms, 512, 0, s>>>(); }));
  printf("empty 1x32 1200B param     %6.2f\n", median_us(s, [&] { k_empty_big<<<1, 32, 0, s>>>(big); }));
  printf("empty %dx512 1200B param  %6.2f\n", sms, median_us(s, [&] { k_empty_big<<<sms, 512, 0, s>>>(big); }));
  // The fused LL kernels are cooperative launches with a 560-byte block.
  Mid mid = {};
  auto coop = [&](bool on, auto *kernel, auto arg) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeCooperative;
    attr[0].val.cooperative = on ? 1 : 0;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)sms);
    cfg.blockDim = dim3(512);
    cfg.stream = s;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    CK(cudaLaunchKernelEx(&cfg, kernel, arg));
  };
  printf("empty %dx512 560B param   %6.2f\n", sms, median_us(s, [&] { k_empty_mid<<<sms, 512, 0, s>>>(mid); }));
  printf("empty %dx512 560B LaunchEx %6.2f\n", sms, median_us(s, [&] { coop(false, k_empty_mid, mid); }));
  printf("empty %dx512 560B coop    %6.2f\n", sms, median_us(s, [&] { coop(true, k_empty_mid, mid); }));
  printf("fence.sc.sys 1x32          %6.2f\n", median_us(s, [&] { k_fence_sys<<<1, 32, 0, s>>>(); }));
  printf("fence.sc.gpu 1x32          %6.2f\n", median_us(s, [&] { k_fence_gpu<<<1, 32, 0, s>>>(); }));
  for (uint32_t bytes : {7392u, 14336u}) {
    for (int mode = 0; mode < 3; ++mode)
      printf("row %5u B + %-18s %6.2f\n", bytes, mode == 0 ? "fence.sys+atomic" : mode == 1 ? "red.release.sys" : "no signal",
             median_us(s, [&] { k_row_signal<<<1, 32, 0, s>>>(peer_buf, src, bytes, peer_sig, mode); }));
  }
  for (int g : {1, 16, 64, sms})
    for (int fs = 0; fs < 2; ++fs)
      printf("ticket %3d blocks fence.%s %6.2f\n", g, fs ? "sys" : "gpu",
             median_us(s, [&] { k_ticket<<<g, 512, 0, s>>>(ticket, peer_sig, fs); }));
  for (int rows : {8, 128, 512, 1024}) {
    const uint32_t rb = 14336;
    const size_t bytes = (size_t)rows * rb;
    float cp = median_us(s, [&] { CK(cudaMemcpyPeerAsync(peer_buf, 1, src, 0, bytes, s)); });
    float kr = median_us(s, [&] { k_rows<<<sms, 512, 0, s>>>(peer_buf, src, rows, rb); });
    float kc = median_us(s, [&] { k_rows_chunked<<<sms, 512, 0, s>>>(peer_buf, src, rows, rb, 4096); });
    float kl = median_us(s, [&] { k_rows<<<sms, 512, 0, s>>>(local, src, rows, rb); });
    printf("%4d rows x %u B (%.2f MB): memcpyPeer %6.2f (%5.0f GB/s) | warp/row %6.2f (%5.0f GB/s) | warp/4KB %6.2f (%5.0f GB/s) | local warp/row %6.2f\n",
           rows, rb, bytes / 1e6, cp, bytes / cp / 1e3, kr, bytes / kr / 1e3, kc, bytes / kc / 1e3, kl);
  }
  // Threads per block sweep for 512 rows
  for (int tpb : {128, 256, 512, 1024}) {
    const int rows = 512; const uint32_t rb = 14336;
    for (int g : {sms, 2 * sms}) {
      float kr = median_us(s, [&] { k_rows<<<g, tpb, 0, s>>>(peer_buf, src, rows, rb); });
      printf("512 rows warp/row grid %3d x %4d: %6.2f us (%5.0f GB/s)\n", g, tpb, kr, rows * (double)rb / kr / 1e3);
    }
  }
  // The floor under a 1-token dispatch: launch plus one row and flag each
  // way, both GPUs at once (eager: one host thread alternating the two
  // launches; graph: one graph per GPU, launched together).
  {
    CK(cudaSetDevice(1));
    char *row1, *src1; unsigned long long *flag1, *seen1;
    CK(cudaMalloc(&row1, 1 << 20)); CK(cudaMalloc(&src1, 1 << 20));
    CK(cudaMalloc(&flag1, 64)); CK(cudaMalloc(&seen1, 64));
    CK(cudaMemset(flag1, 0, 64)); CK(cudaMemset(seen1, 0, 64)); CK(cudaMemset(src1, 1, 1 << 20));
    cudaStream_t s1; CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CK(cudaSetDevice(0));
    char *row0; unsigned long long *flag0, *seen0;
    CK(cudaMalloc(&row0, 1 << 20)); CK(cudaMalloc(&flag0, 64)); CK(cudaMalloc(&seen0, 64));
    CK(cudaMemset(flag0, 0, 64)); CK(cudaMemset(seen0, 0, 64));
    CK(cudaDeviceSynchronize());
    const uint32_t rb = 7392;  // one fp8 row of hidden 7168 with its scales
    auto on = [&](cudaStream_t st, int k) {
      if (k == 0) k_exchange<<<1, 32, 0, st>>>(row1, src, rb, flag1, flag0, seen0);
      else k_exchange<<<1, 32, 0, st>>>(row0, src1, rb, flag0, flag1, seen1);
    };
    const float eager = median_us(s, [&] {
      on(s, 0);
      CK(cudaSetDevice(1)); on(s1, 1); CK(cudaSetDevice(0));
    });
    CK(cudaSetDevice(1)); CK(cudaStreamSynchronize(s1)); CK(cudaSetDevice(0));
    const float empty_graph = median_graph_us({s}, {0}, [&](cudaStream_t st, int) {
      k_empty_mid<<<sms, 512, 0, st>>>(mid);
    });
    const float graph = median_graph_us({s, s1}, {0, 1}, on);
    printf("exchange %u B row + flag each way, both GPUs: eager %6.2f | one graph per GPU %6.2f\n",
           rb, eager, graph);
    printf("empty %dx512 560B param in a graph %6.2f\n", sms, empty_graph);
    CK(cudaSetDevice(1)); cudaFree(row1); cudaFree(src1); cudaFree(flag1); cudaFree(seen1);
    CK(cudaSetDevice(0)); cudaFree(row0); cudaFree(flag0); cudaFree(seen0);
  }
  CK(cudaDeviceSynchronize());
  printf("probe done\n");
  return 0;
}
