// ht_probe.cu: the throughput floors under HT dispatch and combine, on two
// GPUs of one host with peer access (no NCCL): how fast G blocks move
// R rows of B bytes into the peer (both GPUs sending at once, as EP2
// dispatch does), by plain warp stores (several unroll depths) and by TMA
// bulk copies (global -> shared -> peer), against cudaMemcpyPeerAsync.
// Also the same copies within one GPU (the receiver's ring drain and a
// rank's own rows). Median of CUDA-event times on GPU 0 over --iters rounds. Build:
//   nvcc -O3 -arch=sm_90 -o ht_probe tools/probe/ht_probe.cu
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "check.h"

// Warp copy with kU 16-byte loads per lane in flight before the stores.
template <int kU>
__device__ __forceinline__ void copy_warp(char *dst, const char *src, uint32_t bytes) {
  const uint32_t lane = threadIdx.x & 31, n = bytes / 16;
  uint4 *d = reinterpret_cast<uint4 *>(dst);
  const uint4 *s = reinterpret_cast<const uint4 *>(src);
  for (uint32_t base = 0; base < n; base += 32 * kU) {
    uint4 v[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const uint32_t i = base + u * 32 + lane;
      v[u] = i < n ? __ldcg(s + i) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const uint32_t i = base + u * 32 + lane;
      if (i < n) d[i] = v[u];
    }
  }
}

// One warp per row, rows round robin over the grid's warps.
template <int kU>
__global__ void k_rows(char *dst, const char *src, int rows, uint32_t rb) {
  const int nw = gridDim.x * (blockDim.x / 32), w = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  for (int r = w; r < rows; r += nw) copy_warp<kU>(dst + (size_t)r * rb, src + (size_t)r * rb, rb);
}

__device__ __forceinline__ uint32_t smem_addr(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

// TMA: each warp's lane 0 moves pieces of `piece` bytes through two shared
// buffers: bulk load (mbarrier completion), then bulk store to dst (bulk
// group); a buffer is reloaded only after its previous store has read it.
__global__ void k_rows_tma(char *dst, const char *src, int rows, uint32_t rb, uint32_t piece) {
  extern __shared__ __align__(128) char sm[];
  __shared__ __align__(8) uint64_t bar[32][2];
  const int wpb = blockDim.x / 32, wib = threadIdx.x / 32;
  const int nw = gridDim.x * wpb, w = blockIdx.x * wpb + wib;
  if ((threadIdx.x & 31) != 0) return;
  char *buf[2] = {sm + (size_t)wib * 2 * piece, sm + (size_t)wib * 2 * piece + piece};
  for (int b = 0; b < 2; ++b)
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&bar[wib][b])));
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  const uint32_t per_row = rb / piece;
  uint32_t phase[2] = {0, 0};
  int it = 0;
  for (int r = w; r < rows; r += nw) {
    for (uint32_t k = 0; k < per_row; ++k, ++it) {
      const int b = it & 1;
      // the store issued two pieces ago read buf[b] before we reload it
      asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
      const uint32_t mb = smem_addr(&bar[wib][b]);
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(mb), "r"(piece) : "memory");
      asm volatile(
          "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
              smem_addr(buf[b])),
          "l"(src + (size_t)r * rb + (size_t)k * piece), "r"(piece), "r"(mb)
          : "memory");
      uint32_t done = 0;
      while (!done) {
        asm volatile(
            "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
            : "=r"(done)
            : "r"(mb), "r"(phase[b])
            : "memory");
      }
      phase[b] ^= 1u;
      asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(
                       dst + (size_t)r * rb + (size_t)k * piece),
                   "r"(smem_addr(buf[b])), "r"(piece)
                   : "memory");
      asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    }
  }
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

static int g_iters = 50;
static float median_between(std::vector<cudaEvent_t> &ev) {
  std::vector<float> t(ev.size() - 1);
  for (size_t i = 0; i + 1 < ev.size(); ++i) { CK(cudaEventElapsedTime(&t[i], ev[i], ev[i + 1])); t[i] *= 1000.f; }
  for (auto &e : ev) cudaEventDestroy(e);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct Side { char *src, *peer_dst, *local_dst; cudaStream_t s; };

// f(side, gpu) enqueued on both GPUs each round when both, else GPU 0 only;
// timed on GPU 0's stream (rounds are separated by a cross-GPU event wait
// so both sides start each round together).
static float median_us(Side *sd, bool both, const std::function<void(Side &)> &f) {
  std::vector<cudaEvent_t> ev(g_iters + 1);
  cudaEvent_t done[2];
  for (int g = 0; g < 2; ++g) { CK(cudaSetDevice(g)); CK(cudaEventCreateWithFlags(&done[g], cudaEventDisableTiming)); }
  CK(cudaSetDevice(0));
  for (auto &e : ev) CK(cudaEventCreate(&e));
  auto round = [&](int i) {
    for (int g = 0; g < (both ? 2 : 1); ++g) {
      CK(cudaSetDevice(g));
      f(sd[g]);
    }
    CK(cudaSetDevice(0));
    if (i >= 0) CK(cudaEventRecord(ev[i + 1], sd[0].s));
    if (both) {  // the next round starts after both sides' sends
      for (int g = 0; g < 2; ++g) { CK(cudaSetDevice(g)); CK(cudaEventRecord(done[g], sd[g].s)); }
      CK(cudaSetDevice(0)); CK(cudaStreamWaitEvent(sd[0].s, done[1], 0));
      CK(cudaSetDevice(1)); CK(cudaStreamWaitEvent(sd[1].s, done[0], 0));
      CK(cudaSetDevice(0));
    }
  };
  for (int i = 0; i < 5; ++i) round(-1);
  CK(cudaSetDevice(0));
  CK(cudaEventRecord(ev[0], sd[0].s));
  for (int i = 0; i < g_iters; ++i) round(i);
  for (int g = 0; g < 2; ++g) { CK(cudaSetDevice(g)); CK(cudaDeviceSynchronize()); cudaEventDestroy(done[g]); }
  CK(cudaSetDevice(0));
  return median_between(ev);
}

int main(int argc, char **argv) {
  if (argc > 1) g_iters = atoi(argv[1]);
  const int rows = 4096;
  const uint32_t rb = 14336;  // one bf16 row of hidden 7168
  const size_t bytes = (size_t)rows * rb;
  Side sd[2];
  for (int g = 0; g < 2; ++g) {
    CK(cudaSetDevice(g));
    CK(cudaDeviceEnablePeerAccess(1 - g, 0));
    CK(cudaMalloc(&sd[g].src, bytes));
    CK(cudaMalloc(&sd[g].local_dst, bytes));
    CK(cudaMemset(sd[g].src, 1 + g, bytes));
    CK(cudaStreamCreateWithFlags(&sd[g].s, cudaStreamNonBlocking));
  }
  char *dst[2];
  for (int g = 0; g < 2; ++g) { CK(cudaSetDevice(g)); CK(cudaMalloc(&dst[g], bytes)); }
  sd[0].peer_dst = dst[1];
  sd[1].peer_dst = dst[0];
  for (int g = 0; g < 2; ++g) {
    CK(cudaSetDevice(g));
    CK(cudaFuncSetAttribute(k_rows_tma, cudaFuncAttributeMaxDynamicSharedMemorySize, 220 * 1024));
  }
  CK(cudaSetDevice(0));
  auto gbs = [&](float us) { return bytes / us / 1e3; };
  printf("ht_probe: %d rows x %u B (%.1f MB) per GPU, median of %d rounds (us, GB/s per direction)\n",
         rows, rb, bytes / 1e6, g_iters);
  for (int both = 0; both < 2; ++both) {
    const char *mode = both ? "both ways" : "one way ";
    float cp = median_us(sd, both, [&](Side &x) {
      CK(cudaMemcpyPeerAsync(x.peer_dst, &x == &sd[0] ? 1 : 0, x.src, &x == &sd[0] ? 0 : 1, bytes, x.s));
    });
    printf("%s memcpyPeer                     %7.1f (%4.0f)\n", mode, cp, gbs(cp));
    for (int grid : {8, 12, 16, 24, 32, 48}) {
      for (int tpb : {256, 512}) {
        float a = median_us(sd, both, [&](Side &x) { k_rows<8><<<grid, tpb, 0, x.s>>>(x.peer_dst, x.src, rows, rb); });
        float b = median_us(sd, both, [&](Side &x) { k_rows<16><<<grid, tpb, 0, x.s>>>(x.peer_dst, x.src, rows, rb); });
        printf("%s st  grid %2d x %3d  U8 %7.1f (%4.0f)  U16 %7.1f (%4.0f)\n", mode, grid, tpb, a, gbs(a), b, gbs(b));
      }
      for (int wpb : {4, 8}) {
        const uint32_t piece = 7168;
        const size_t smem = (size_t)wpb * 2 * piece;
        float t = median_us(sd, both, [&](Side &x) {
          k_rows_tma<<<grid, wpb * 32, smem, x.s>>>(x.peer_dst, x.src, rows, rb, piece);
        });
        printf("%s tma grid %2d x %3d  piece %u %7.1f (%4.0f)\n", mode, grid, wpb * 32, piece, t, gbs(t));
      }
    }
  }
  // The receiver's half: local ring -> output copies, for scale.
  for (int grid : {8, 12, 16, 24}) {
    float a = median_us(sd, false, [&](Side &x) { k_rows<8><<<grid, 512, 0, x.s>>>(x.local_dst, x.src, rows, rb); });
    float l = median_us(sd, false, [&](Side &x) { k_rows<16><<<grid, 512, 0, x.s>>>(x.local_dst, x.src, rows, rb); });
    printf("local st  grid %2d  x512 U8 %7.1f (%4.0f)  x512 U16 %7.1f (%4.0f)\n", grid, a, gbs(a), l, gbs(l));
    for (int wpb : {4, 8, 12}) {
      for (uint32_t piece : {3584u, 7168u}) {
        const size_t smem = (size_t)wpb * 2 * piece;
        float t = median_us(sd, false, [&](Side &x) {
          k_rows_tma<<<grid, wpb * 32, smem, x.s>>>(x.local_dst, x.src, rows, rb, piece);
        });
        printf("local tma grid %2d x %3d piece %5u %7.1f (%4.0f)\n", grid, wpb * 32, piece, t, gbs(t));
      }
    }
  }
  CK(cudaGetLastError());
  printf("probe done\n");
  return 0;
}
