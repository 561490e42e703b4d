// reduce_probe.cu: the LL combine's pre-reduction (ll_combine_partial.cuh)
// alone, no NCCL: each (token, source) whose top-8 (uniform distinct,
// seed 1) reaches this rank's experts sums its local slots' expert rows
// (w * y in f32, bf16 once) into one partial row. The kernel's units, its
// warp order (warp-in-block major, so consecutive units sit on different
// SMs) and the engine's expert-output layout ([E_local][cap][hidden]).
// One GPU, one thing varied at a time:
//   - the load flavour (ld.global.nc as the kernel, .cg, .nc with
//     L1::no_allocate, plain ld.global), or TMA bulk copies into a ring of
//     shared-memory stages;
//   - the steps per unit (1, 2, 4 of 256 channels) and rows per batch;
//   - the grid (blocks x threads);
//   - the layout: sparse [E_local][cap][hidden] against the same rows
//     packed densely;
//   - L2 flushed before each round or not (the bench does not flush);
// with a streaming read of the same bytes as the floor. Two GPUs (when
// present): both at once at EP2, each storing source 1's partials into
// the other, in the kernel's order, remote units first, remote and local
// units on separate blocks, every store local, or no stores; then the
// stores alone (no row loads), at the partial rows' bytes and at the line
// partials' (mep_ll_line_row_bytes), and an empty kernel timed the same way.
// Times are medians of CUDA events around each launch with a sync per
// round ("empty launch" is that floor). Build, from the repository root
// (it reuses the kernels' bf16 helpers and line-row size):
//   nvcc -O3 -arch=sm_90 -I. -o reduce_probe tools/probe/reduce_probe.cu
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <random>
#include <vector>

#include "check.h"
#include "kernels/common/bf16_vec.cuh"
#include "kernels/ll/ll_layout.h"

enum Load { kNc = 0, kCg = 1, kNa = 2, kPlain = 3 };
static const char *kLoadName[] = {"nc", "cg", "nc.na", "plain"};

template <int L>
__device__ __forceinline__ uint4 load16(const uint4 *p) {
  uint4 v;
  if (L == kNc) {
    v = __ldg(p);
  } else if (L == kCg) {
    v = __ldcg(p);
  } else if (L == kNa) {
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
  } else {
    v = *p;
  }
  return v;
}

// One unit: lane k < 8 holds the row (in y, of `hidden` channels) of the
// unit's k-th local slot (-1: none); the lane's channels c + 256 j (j < S)
// of the partial, slots in batches of B with every load issued before the
// batch's first use (as mep_partial_chunks), into acc.
template <int L, int S, int B>
__device__ __forceinline__ void partial_unit(const __nv_bfloat16 *y, int slot, int c, int hidden,
                                             float acc[S][8]) {
  unsigned live = __ballot_sync(0xffffffffu, slot >= 0);
#pragma unroll
  for (int j = 0; j < S; ++j)
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[j][i] = 0.f;
  while (live != 0) {
    uint4 v[B][S];
    bool use[B];
#pragma unroll
    for (int i = 0; i < B; ++i) {
      use[i] = live != 0;
      const int k = use[i] ? __ffs(live) - 1 : 0;
      live &= live - 1u;
      const int row = __shfl_sync(0xffffffffu, slot, k);
#pragma unroll
      for (int j = 0; j < S; ++j) {
        const int cj = c + 256 * j;
        v[i][j] = use[i] && cj < hidden
                      ? load16<L>(reinterpret_cast<const uint4 *>(y + (size_t)row * hidden + cj))
                      : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int i = 0; i < B; ++i)
      if (use[i])
#pragma unroll
        for (int j = 0; j < S; ++j) mep_bf16x8_fma(acc[j], v[i][j], 0.125f);
  }
}

template <int S>
__device__ __forceinline__ void store_unit(__nv_bfloat16 *row, int c, int hidden,
                                           const float acc[S][8]) {
#pragma unroll
  for (int j = 0; j < S; ++j) {
    const int cj = c + 256 * j;
    if (cj < hidden) *reinterpret_cast<uint4 *>(row + cj) = mep_bf16x8_pack(acc[j]);
  }
}

// route[ts * 8 + k]: unit ts's slot rows (partial_unit). Units (ts, piece
// of 256 S channels).
template <int L, int S, int B>
__global__ void __launch_bounds__(512, 1)
    k_partials(const __nv_bfloat16 *y, const int *route, __nv_bfloat16 *out, int ts_n,
               int hidden) {
  const int lane = threadIdx.x & 31;
  const int nwarps = gridDim.x * (blockDim.x / 32);
  const int gwarp = (threadIdx.x / 32) * gridDim.x + blockIdx.x;
  const int piece = 256 * S, npieces = (hidden + piece - 1) / piece;
  for (int u = gwarp; u < ts_n * npieces; u += nwarps) {
    const int pc = u % npieces, ts = u / npieces;
    const int c = pc * piece + lane * 8;
    float acc[S][8];
    partial_unit<L, S, B>(y, lane < 8 ? route[ts * 8 + lane] : -1, c, hidden, acc);
    store_unit<S>(out + (size_t)ts * hidden, c, hidden, acc);
  }
}

// EP2 with the link: units of source 1 store their partial into the peer
// GPU's out (the combine's send), source 0's locally. order: 0 token-major
// (sources interleaved, as the kernel), 1 remote units first, 2 even
// blocks take the remote units and odd blocks the local ones, 3 every
// store local (no link), 4 no stores, 5 the stores alone (no row loads:
// the link's and the local stores' share), 6 nothing (the launch in the
// same timing).
__global__ void __launch_bounds__(512, 1)
    k_partials_peer(const __nv_bfloat16 *y, const int *route, __nv_bfloat16 *out,
                    __nv_bfloat16 *peer_out, int ts_n, int hidden, int order) {
  constexpr int S = 4, B = 4;
  const int lane = threadIdx.x & 31;
  const int piece = 256 * S, npieces = (hidden + piece - 1) / piece;
  const int half_units = ts_n / 2 * npieces; /* units per source */
  int nwarps = gridDim.x * (blockDim.x / 32);
  int gwarp = (threadIdx.x / 32) * gridDim.x + blockIdx.x;
  int first = 0, count = ts_n * npieces;
  if (order == 2) { /* this block's half of the grid, and of the units */
    const int blocks = gridDim.x / 2, b = blockIdx.x / 2;
    nwarps = blocks * (blockDim.x / 32);
    gwarp = (threadIdx.x / 32) * blocks + b;
    first = (blockIdx.x & 1) ? half_units : 0;
    count = half_units;
  }
  if (order == 6 && hidden > 0) return;
  for (int i = gwarp; i < count; i += nwarps) {
    int ts, pc;
    if (order == 1 || order == 2) { /* units [0, half): source 1; then source 0 */
      const int j = first + i, src = j < half_units ? 1 : 0, k = j % half_units;
      pc = k % npieces;
      ts = (k / npieces) * 2 + src;
    } else {
      pc = i % npieces;
      ts = i / npieces;
    }
    const int c = pc * piece + lane * 8;
    float acc[S][8];
    if (order == 5) {
#pragma unroll
      for (int j = 0; j < S; ++j)
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[j][e] = (float)(ts + e);
    } else {
      partial_unit<kNc, S, B>(y, lane < 8 ? route[ts * 8 + lane] : -1, c, hidden, acc);
    }
    if (order == 4 && hidden > 0) continue;
    store_unit<S>(((ts & 1) && order != 3 ? peer_out : out) + (size_t)ts * hidden, c, hidden,
                  acc);
  }
}

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

// The same units (one 256-channel step, every local slot), the rows
// brought in by TMA bulk copies (each slot's 512 bytes, issued by the
// lane that holds the slot) into a ring of ST stages per warp, so a warp
// keeps ST - 1 units' rows in flight while it sums one. peer_out: units of
// source 1 store there (EP2 with the link), else every store is local.
template <int ST>
__global__ void __launch_bounds__(512, 1)
    k_partials_tma(const __nv_bfloat16 *y, const int *route, __nv_bfloat16 *out,
                   __nv_bfloat16 *peer_out, int ts_n, int hidden) {
  extern __shared__ __align__(128) char sm[];
  __shared__ __align__(8) uint64_t bar[16][ST];
  const int lane = threadIdx.x & 31, wib = threadIdx.x / 32;
  const int nwarps = gridDim.x * (blockDim.x / 32);
  const int gwarp = wib * gridDim.x + blockIdx.x;
  const int npieces = (hidden + 255) / 256;
  const int units = ts_n * npieces;
  char *ring = sm + (size_t)wib * ST * 4096; /* 8 slots x 512 B a stage */
  if (lane == 0)
    for (int b = 0; b < ST; ++b)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&bar[wib][b])));
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  __syncwarp();
  uint32_t phase = 0;
  // issue unit u into stage b; returns the unit's slots (lane k < 8 holds slot k)
  auto issue = [&](int u, int b, int *slot_out) {
    const int pc = u % npieces, ts = u / npieces;
    const int slot = lane < 8 ? route[ts * 8 + lane] : -1;
    const unsigned live = __ballot_sync(0xffffffffu, slot >= 0);
    const uint32_t mb = smem_u32(&bar[wib][b]);
    if (lane == 0)
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(mb),
                   "r"(__popc(live) * 512u)
                   : "memory");
    __syncwarp();
    if (slot >= 0) {
      const int k = __popc(live & ((1u << lane) - 1u)); /* packed: k-th live slot */
      asm volatile(
          "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], 512, "
          "[%2];" ::"r"(smem_u32(ring + b * 4096 + k * 512)),
          "l"(y + (size_t)slot * hidden + pc * 256), "r"(mb)
          : "memory");
    }
    *slot_out = __popc(live);
  };
  int nslots[ST];
#pragma unroll
  for (int b = 0; b < ST; ++b) {
    const int u = gwarp + b * nwarps;
    nslots[b] = 0;
    if (u < units) issue(u, b, &nslots[b]);
  }
  int b = 0;
  for (int u = gwarp; u < units; u += nwarps) {
    const uint32_t mb = smem_u32(&bar[wib][b]);
    uint32_t done = 0;
    while (!done)
      asm volatile(
          "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, "
          "0, p; }"
          : "=r"(done)
          : "r"(mb), "r"((phase >> b) & 1u)
          : "memory");
    phase ^= 1u << b;
    int n = 0;
#pragma unroll
    for (int q = 0; q < ST; ++q)
      if (q == b) n = nslots[q];
    float acc[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] = 0.f;
    const uint4 *stage = reinterpret_cast<const uint4 *>(ring + b * 4096) + lane;
    for (int k = 0; k < n; ++k) mep_bf16x8_fma(acc, stage[k * 32], 0.125f);
    __syncwarp(); /* every lane has read the stage before it is refilled */
    const int pc = u % npieces, ts = u / npieces;
    const int next = u + ST * nwarps;
    if (next < units) {
      int ns = 0;
      issue(next, b, &ns);
#pragma unroll
      for (int q = 0; q < ST; ++q)
        if (q == b) nslots[q] = ns;
    }
    __nv_bfloat16 *dst = (ts & 1) && peer_out != nullptr ? peer_out : out;
    const int c = pc * 256 + lane * 8;
    if (c < hidden)
      *reinterpret_cast<uint4 *>(dst + (size_t)ts * hidden + c) = mep_bf16x8_pack(acc);
    b = b + 1 == ST ? 0 : b + 1;
  }
}

// The floor: every warp streams 8 KB pieces of the n16 contiguous 16-byte
// vectors at src (16 loads per lane in flight) and xor-folds them; the
// store that keeps the loads alive never happens.
__global__ void k_stream(const uint4 *src, size_t n16, uint4 *sink) {
  const int lane = threadIdx.x & 31;
  const size_t nwarps = (size_t)gridDim.x * (blockDim.x / 32);
  const size_t gwarp = (threadIdx.x / 32) * gridDim.x + blockIdx.x;
  uint4 x = make_uint4(0, 0, 0, 0);
  for (size_t base = gwarp * 512; base < n16; base += nwarps * 512) {
    uint4 v[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const size_t k = base + i * 32 + lane;
      v[i] = k < n16 ? __ldg(src + k) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      x.x ^= v[i].x; x.y ^= v[i].y; x.z ^= v[i].z; x.w ^= v[i].w;
    }
  }
  if (x.x == 0x12345678u) sink[gwarp] = x; /* keeps the loads */
}

__global__ void k_empty() {}

__global__ void k_flush(uint4 *buf, size_t n16) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n16;
       i += (size_t)gridDim.x * blockDim.x)
    buf[i] = make_uint4((uint32_t)i, 0, 0, 0);
}

// Rank 0's side of a call: its local experts, the rows per expert in the
// engine's layout, and each (token, source) unit's slot rows, sparse (in
// that layout) and dense (packed in slot order).
struct Setup {
  int local_experts, cap;
  std::vector<int> sparse_route, dense_route;  // [ts][8]
  int ts_n = 0, rows = 0;
};

static Setup make_setup(int tokens, int sources, int experts, int world, int max_tokens,
                        uint64_t seed) {
  Setup s{};
  s.local_experts = experts / world;
  s.cap = world * max_tokens;
  std::mt19937_64 rng(seed);
  std::vector<int> fill(s.local_experts, 0);
  std::vector<int> ids(experts);
  for (int t = 0; t < tokens; ++t)
    for (int src = 0; src < sources; ++src) {
      for (int e = 0; e < experts; ++e) ids[e] = e;
      for (int k = 0; k < 8; ++k) std::swap(ids[k], ids[k + rng() % (experts - k)]);
      int n = 0;
      for (int k = 0; k < 8; ++k) {
        const int e = ids[k];
        if (e >= s.local_experts) continue; /* rank 0 holds experts [0, E_local) */
        const int row = e * s.cap + fill[e]++;
        s.sparse_route.push_back(row);
        s.dense_route.push_back(s.rows++);
        ++n;
      }
      for (; n < 8; ++n) {
        s.sparse_route.push_back(-1);
        s.dense_route.push_back(-1);
      }
      ++s.ts_n;
    }
  return s;
}

typedef void (*PartialKernel)(const __nv_bfloat16 *, const int *, __nv_bfloat16 *, int, int);

static PartialKernel pick(int load, int steps, int batch) {
#define P(L, S, B) if (load == L && steps == S && batch == B) return k_partials<L, S, B>;
  P(kNc, 1, 8) P(kNc, 2, 8) P(kNc, 4, 4)
  P(kCg, 1, 8) P(kCg, 2, 8) P(kCg, 4, 4)
  P(kNa, 1, 8) P(kNa, 2, 8) P(kNa, 4, 4)
  P(kPlain, 4, 4)
#undef P
  return nullptr;
}

template <class F>
static float median_us(int iters, bool flush, uint4 *fbuf, size_t fn16, F launch) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int i = 0; i < iters + 3; ++i) {
    if (flush) k_flush<<<264, 512>>>(fbuf, fn16);
    CK(cudaEventRecord(a));
    launch();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    if (i >= 3) t.push_back(ms * 1000.f);
  }
  CK(cudaGetLastError());
  std::sort(t.begin(), t.end());
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return t[t.size() / 2];
}

// launch(y, route) timed four ways: us[dense][flushed] (the engine's sparse
// layout or the dense copy; L2 warm or flushed before each round).
template <class F>
static void four_ways(int iters, uint4 *fbuf, size_t fn16, const __nv_bfloat16 *y_sparse,
                      const __nv_bfloat16 *y_dense, const int *r_sparse, const int *r_dense,
                      F launch, float us[2][2]) {
  for (int dense = 0; dense < 2; ++dense)
    for (int flush = 0; flush < 2; ++flush)
      us[dense][flush] = median_us(iters, flush, fbuf, fn16, [&] {
        launch(dense ? y_dense : y_sparse, dense ? r_dense : r_sparse);
      });
}

// Both GPUs launch(d, stream) at once, --iters rounds after 3 untimed;
// the median CUDA-event time of each GPU's launch.
template <class F>
static void median_pair_us(int iters, cudaStream_t st[2], cudaEvent_t ev[2][2], F launch,
                           float out[2]) {
  std::vector<float> t[2];
  for (int i = 0; i < iters + 3; ++i) {
    for (int d = 0; d < 2; ++d) {
      CK(cudaSetDevice(d));
      CK(cudaEventRecord(ev[d][0], st[d]));
      launch(d, st[d]);
      CK(cudaEventRecord(ev[d][1], st[d]));
    }
    for (int d = 0; d < 2; ++d) {
      CK(cudaSetDevice(d));
      CK(cudaEventSynchronize(ev[d][1]));
      float ms;
      CK(cudaEventElapsedTime(&ms, ev[d][0], ev[d][1]));
      if (i >= 3) t[d].push_back(ms * 1000.f);
    }
  }
  CK(cudaGetLastError());
  for (int d = 0; d < 2; ++d) {
    std::sort(t[d].begin(), t[d].end());
    out[d] = t[d][t[d].size() / 2];
  }
}

// Both GPUs at once, each on its own copy of the EP2 routing of `tokens`
// tokens per source, each sending its source-1 partials into the other's
// out; both GPUs' times.
static void peer_section(int iters, int hidden, int sms, int tokens) {
  Setup s = make_setup(tokens, 2, 256, 2, 256, 1);
  const size_t row_b = (size_t)hidden * 2, sparse_rows = (size_t)s.local_experts * s.cap;
  /* a row of the LL combine's line partials */
  const size_t line_b = mep_ll_line_row_bytes(hidden);
  __nv_bfloat16 *y[2], *out[2];
  int *route[2];
  cudaStream_t st_[2];
  cudaEvent_t ev[2][2];
  for (int d = 0; d < 2; ++d) {
    CK(cudaSetDevice(d));
    const cudaError_t pe = cudaDeviceEnablePeerAccess(1 - d, 0);
    if (pe == cudaErrorPeerAccessAlreadyEnabled)
      (void)cudaGetLastError();
    else
      CK(pe);
    CK(cudaMalloc(&y[d], sparse_rows * row_b));
    CK(cudaMemset(y[d], 0x3c, sparse_rows * row_b));
    CK(cudaMalloc(&out[d], (size_t)s.ts_n * line_b));
    CK(cudaMalloc(&route[d], s.sparse_route.size() * 4));
    CK(cudaMemcpy(route[d], s.sparse_route.data(), s.sparse_route.size() * 4,
                  cudaMemcpyHostToDevice));
    CK(cudaStreamCreateWithFlags(&st_[d], cudaStreamNonBlocking));
    CK(cudaEventCreate(&ev[d][0]));
    CK(cudaEventCreate(&ev[d][1]));
  }
  printf("== EP2 %d tok, both GPUs, source 1's %.1f MB of partials over NVLink each way\n",
         tokens, s.ts_n / 2 * row_b / 1e6);
  const char *names[] = {"token-major (the kernel's order)", "remote units first",
                         "remote on even blocks, local on odd", "every store local (no link)",
                         "no stores", "stores alone (no row loads)", "empty (the launch)"};
  /* both GPUs' k_partials_peer over rows of `width` channels */
  auto pair = [&](int width, int order, float t[2]) {
    median_pair_us(iters, st_, ev, [&](int d, cudaStream_t stream) {
      k_partials_peer<<<sms, 512, 0, stream>>>(y[d], route[d], out[d], out[1 - d], s.ts_n,
                                              width, order);
    }, t);
  };
  for (int order = 0; order < 7; ++order) {
    float t[2];
    pair(hidden, order, t);
    printf("  %-38s GPU0 %7.2f us, GPU1 %7.2f us\n", names[order], t[0], t[1]);
  }
  {
    float t[2];
    pair((int)(line_b / 2), 5, t);
    printf("  stores alone, %zu-byte line rows      GPU0 %7.2f us, GPU1 %7.2f us\n", line_b,
           t[0], t[1]);
  }
  for (int stages = 2; stages <= 3; ++stages) {
    auto k = stages == 2 ? k_partials_tma<2> : k_partials_tma<3>;
    const size_t smem = (size_t)16 * stages * 4096;
    for (int d = 0; d < 2; ++d) {
      CK(cudaSetDevice(d));
      CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    }
    float t[2];
    median_pair_us(iters, st_, ev, [&](int d, cudaStream_t stream) {
      k<<<sms, 512, smem, stream>>>(y[d], route[d], out[d], out[1 - d], s.ts_n, hidden);
    }, t);
    printf("  tma, %d stages, token-major             GPU0 %7.2f us, GPU1 %7.2f us\n", stages,
           t[0], t[1]);
  }
  for (int d = 0; d < 2; ++d) {
    CK(cudaSetDevice(d));
    CK(cudaFree(y[d]));
    CK(cudaFree(out[d]));
    CK(cudaFree(route[d]));
    CK(cudaStreamDestroy(st_[d]));
    CK(cudaEventDestroy(ev[d][0]));
    CK(cudaEventDestroy(ev[d][1]));
  }
  CK(cudaSetDevice(0));
}

int main(int argc, char **argv) {
  int iters = 200, hidden = 7168, sms = 0;
  for (int i = 1; i < argc; ++i)
    if (!strncmp(argv[i], "--iters=", 8)) iters = atoi(argv[i] + 8);
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const size_t fn16 = (size_t)256 << 20 >> 4; /* 256 MB: past L2 */
  uint4 *fbuf, *sink;
  CK(cudaMalloc(&fbuf, fn16 * 16));
  CK(cudaMalloc(&sink, (size_t)1 << 20));

  printf("empty launch, %d x 512: %.2f us\n", sms,
         median_us(iters, false, fbuf, fn16, [&] { k_empty<<<sms, 512>>>(); }));
  struct Shape { const char *name; int tokens, sources, experts, world, max_tokens; };
  const Shape shapes[] = {
      {"EP2 256 tok (2 sources)", 256, 2, 256, 2, 256},
      {"EP2 128 tok (2 sources)", 128, 2, 256, 2, 256},
      {"EP1 256 tok", 256, 1, 256, 1, 256},
  };
  for (const Shape &sh : shapes) {
    Setup s = make_setup(sh.tokens, sh.sources, sh.experts, sh.world, sh.max_tokens, 1);
    const size_t row_b = (size_t)hidden * 2;
    const size_t sparse_rows = (size_t)s.local_experts * s.cap;
    __nv_bfloat16 *y_sparse, *y_dense, *out;
    int *r_sparse, *r_dense;
    CK(cudaMalloc(&y_sparse, sparse_rows * row_b));
    CK(cudaMalloc(&y_dense, (size_t)s.rows * row_b));
    CK(cudaMalloc(&out, (size_t)s.ts_n * row_b));
    CK(cudaMemset(y_sparse, 0x3c, sparse_rows * row_b));
    CK(cudaMemset(y_dense, 0x3c, (size_t)s.rows * row_b));
    CK(cudaMalloc(&r_sparse, s.sparse_route.size() * 4));
    CK(cudaMalloc(&r_dense, s.dense_route.size() * 4));
    CK(cudaMemcpy(r_sparse, s.sparse_route.data(), s.sparse_route.size() * 4,
                  cudaMemcpyHostToDevice));
    CK(cudaMemcpy(r_dense, s.dense_route.data(), s.dense_route.size() * 4,
                  cudaMemcpyHostToDevice));
    const double mb = (double)s.rows * row_b / 1e6;
    printf("== %s: %d units of (token, source), %d expert rows = %.1f MB read, %.1f MB written; "
           "E_local %d, cap %d, %d SMs\n",
           sh.name, s.ts_n, s.rows, mb, s.ts_n * row_b / 1e6, s.local_experts, s.cap, sms);
    for (int flush = 0; flush < 2; ++flush) {
      const float st = median_us(iters, flush, fbuf, fn16, [&] {
        k_stream<<<sms, 512>>>(reinterpret_cast<const uint4 *>(y_dense), s.rows * row_b / 16, sink);
      });
      printf("  stream read, %s: %7.2f us (%5.2f TB/s)\n", flush ? "L2 flushed" : "warm      ", st,
             mb / st);
    }
    struct Cfg { int load, steps, batch, blocks_per_sm, threads; };
    /* 16 loads per lane in flight at most: 4 steps x 8 slots, or 8-step
     * units, spill at the kernel's 128 registers */
    const Cfg cfgs[] = {
        {kNc, 4, 4, 1, 512}, /* the kernel today at 128-256 tokens */
        {kNc, 1, 8, 1, 512},    {kNc, 2, 8, 1, 512}, {kCg, 4, 4, 1, 512}, {kCg, 1, 8, 1, 512},
        {kCg, 2, 8, 1, 512},    {kNa, 4, 4, 1, 512}, {kNa, 1, 8, 1, 512}, {kNa, 2, 8, 1, 512},
        {kPlain, 4, 4, 1, 512}, {kNc, 4, 4, 2, 256}, {kNc, 1, 8, 2, 256},
    };
    for (const Cfg &c : cfgs) {
      PartialKernel k = pick(c.load, c.steps, c.batch);
      if (k == nullptr) continue;
      int max_blocks = 0;
      CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&max_blocks, k, c.threads, 0));
      if (max_blocks < c.blocks_per_sm) {
        printf("  %-5s S=%d B=%d %dx%-4d: not resident (%d block(s) per SM)\n", kLoadName[c.load],
               c.steps, c.batch, c.blocks_per_sm * sms, c.threads, max_blocks);
        continue;
      }
      const int grid = c.blocks_per_sm * sms;
      float us[2][2];
      four_ways(iters, fbuf, fn16, y_sparse, y_dense, r_sparse, r_dense,
                [&](const __nv_bfloat16 *y, const int *r) {
                  k<<<grid, c.threads>>>(y, r, out, s.ts_n, hidden);
                }, us);
      printf("  %-5s S=%d B=%d %4dx%-4d: sparse %7.2f / flushed %7.2f us | dense %7.2f / "
             "flushed %7.2f us | sparse %.2f TB/s\n",
             kLoadName[c.load], c.steps, c.batch, grid, c.threads, us[0][0], us[0][1], us[1][0],
             us[1][1], mb / us[0][0]);
    }
    for (int stages = 2; stages <= 3; ++stages) {
      auto k = stages == 2 ? k_partials_tma<2> : k_partials_tma<3>;
      const size_t smem = (size_t)16 * stages * 4096;
      CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
      float us[2][2];
      four_ways(iters, fbuf, fn16, y_sparse, y_dense, r_sparse, r_dense,
                [&](const __nv_bfloat16 *y, const int *r) {
                  k<<<sms, 512, smem>>>(y, r, out, nullptr, s.ts_n, hidden);
                }, us);
      printf("  tma   S=1 %d stages %4dx512 : sparse %7.2f / flushed %7.2f us | dense %7.2f / "
             "flushed %7.2f us | sparse %.2f TB/s\n",
             stages, sms, us[0][0], us[0][1], us[1][0], us[1][1], mb / us[0][0]);
    }
    CK(cudaFree(y_sparse));
    CK(cudaFree(y_dense));
    CK(cudaFree(out));
    CK(cudaFree(r_sparse));
    CK(cudaFree(r_dense));
  }

  int ndev = 0;
  CK(cudaGetDeviceCount(&ndev));
  if (ndev >= 2)
    for (int round = 0; round < 2; ++round)
      for (int tokens : {128, 256}) peer_section(iters, hidden, sms, tokens);
  return 0;
}
