// line_copy_probe.cu: one warp's copy of a received bf16 dispatch row
// into its slot, alone, no NCCL. Hidden 7168. Formats:
//   - plain: 14336 bytes, copied by the receive's mep_copy_warp<16>; also
//     with the row stored by st.volatile.v2.u64, as line rows are stored;
//   - line240: the combine's line format (ll_combine_partial.cuh): 512-byte
//     warp steps of 240 channels, lanes 0-6 of each 8-lane group 16 payload
//     bytes, lane 7 8 payload bytes and an 8-byte flag; 15360 bytes;
//   - line224: lane 7 of each group carries only the flag, so every payload
//     store is 16 bytes and 16-byte aligned; 16384 bytes.
// Line copies: 16 loads a lane in flight, stored, then the flags checked
// (a failed check waits on that step's flags and copies again from it):
//   - "check": the flags folded into a bit mask one step after another,
//     the stores in a branch per step (the form of wip/ll-dispatch-lines);
//   - "no check": the same without the flags;
//   - "fast": the flag lanes' payload paired by shuffles, one store a step;
//   - "1 check": one warp vote per row instead of one per batch;
//   - "or-tree": the stores as lane predicates (only the last step can be
//     partial), the flags folded by independent xor/or steps, one vote a
//     batch, the failing step worked out only after a failed vote.
// Rows are written by a fill kernel just before (in L2, as a received row
// is), or by other blocks of the same launch (the check then waits, as the
// receive does). Per copying warp: clock64 cycles from its first load to
// its last store's issue and a __syncwarp; medians over rounds; and the
// launch's event time. The first copier's output is checked against its
// row's payload. Build from the repository root:
//   nvcc -O3 -arch=sm_90 -I. -o line_copy_probe tools/probe/line_copy_probe.cu
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <vector>

#include "check.h"
#include "kernels/transport/copy_warp.cuh"

constexpr int kHidden = 7168;
constexpr int kPlainBytes = 2 * kHidden;           // 14336
constexpr int kLineStep = 480;                     // payload bytes per 512-byte step
constexpr int kSteps240 = (kPlainBytes + kLineStep - 1) / kLineStep;  // 30
constexpr int kLineBytes = kSteps240 * 512;        // 15360
constexpr int kStep224 = 448;
constexpr int kSteps224 = kPlainBytes / kStep224;  // 32
constexpr int kLine224Bytes = kSteps224 * 512;     // 16384
constexpr int kU = 16;                             // loads per lane per batch
constexpr uint64_t kFlag = 0x0000000700000007ull;

enum Mode {
  kPlain = 0, kLineNoCheck = 1, kLineCheck = 2, kLine224 = 3, kPlainVol = 4,
  kLineFast = 5, kLineDefer = 6, kLine224NoCheck = 7, kLine224Defer = 8,
  kLineOpt = 9, kLine224Opt = 10
};
static const char *kModeName[] = {"plain 14336", "line240 no check", "line240 check",
                                  "line224 check", "plain, vol. fill", "line240 fast",
                                  "line240 fast, 1 check", "line224 no check",
                                  "line224 1 check", "line240 or-tree", "line224 or-tree"};

// The modes whose rows are in the 224-channel format, and each mode's row size.
__host__ __device__ constexpr bool is224(int m) {
  return m == kLine224 || m == kLine224NoCheck || m == kLine224Defer || m == kLine224Opt;
}
__host__ __device__ constexpr int row_bytes_of(int m) {
  return m == kPlain || m == kPlainVol ? kPlainBytes : is224(m) ? kLine224Bytes : kLineBytes;
}

__device__ __forceinline__ void ld_v2(const void *p, uint64_t *a, uint64_t *b) {
  asm volatile("ld.volatile.global.v2.u64 {%0,%1}, [%2];" : "=l"(*a), "=l"(*b) : "l"(p));
}
__device__ __forceinline__ void st_v2(void *p, uint64_t a, uint64_t b) {
  asm volatile("st.volatile.global.v2.u64 [%0], {%1,%2};" ::"l"(p), "l"(a), "l"(b) : "memory");
}

// The sender's side of every format, one warp per row (the fill).
template <int M>
__device__ void fill_row(char *row, int seed) {
  const int lane = threadIdx.x & 31, g = lane >> 3, l = lane & 7;
  if (M == kPlain) {
    for (int i = lane; i < kPlainBytes / 16; i += 32)
      reinterpret_cast<uint4 *>(row)[i] = make_uint4(seed, i, seed ^ i, 1);
    return;
  }
  if (M == kPlainVol) {  // the plain layout stored as the lines are
    for (int i = lane; i < kPlainBytes / 16; i += 32)
      st_v2(row + 16 * i, (uint64_t)seed << 32 | (uint32_t)i, (uint64_t)(seed ^ i) << 32 | 1);
    return;
  }
  const int steps = is224(M) ? kSteps224 : kSteps240;
  for (int s = 0; s < steps; ++s) {
    const uint64_t a = (uint64_t)seed << 32 | (uint32_t)(s * 32 + lane);
    const uint64_t b = l == 7 ? kFlag : a ^ 0x5555;
    (void)g;
    st_v2(row + s * 512 + 16 * lane, a, b);
  }
}

template <int M>
__global__ void fill(char *rows, int n, int row_bytes, int seed) {
  const int w = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  if (w < n) fill_row<M>(rows + (size_t)w * row_bytes, seed + w);
}

// Line copies: every load of a batch issued, the batch stored, then (kCheck)
// the flag lanes' flags looked at; returns the first step of a batch with a
// line not landed, or -1.
template <int M, bool kCheck, bool kDefer = false>
__device__ __forceinline__ int line_copy_from(const char *row, char *dst, int payload, int s0) {
  const int lane = threadIdx.x & 31, g = lane >> 3, l = lane & 7;
  const bool fl = l == 7;
  constexpr int step_bytes = M == kLine224 ? kStep224 : kLineStep;
  const int steps = (payload + step_bytes - 1) / step_bytes;
  uint32_t first_bad = ~0u;
  const int off = M == kLine224 ? (7 * g + l) * 16 : (l < 7 ? (7 * g + l) * 16 : 448 + 8 * g);
  const uint4 *at = reinterpret_cast<const uint4 *>(row) + lane;
  for (; s0 < steps; s0 += kU) {
    uint4 v[kU];
#pragma unroll
    for (int j = 0; j < kU; ++j)
      v[j] = s0 + j < steps ? __ldcg(at + (s0 + j) * 32) : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
    for (int j = 0; j < kU; ++j) {
      const int o = (s0 + j) * step_bytes + off;
      if (s0 + j >= steps || o >= payload) continue;
      if (M == kLine224) {
        if (!fl) *reinterpret_cast<uint4 *>(dst + o) = v[j];
      } else if (fl) {
        *reinterpret_cast<uint2 *>(dst + o) = make_uint2(v[j].x, v[j].y);
      } else {
        *reinterpret_cast<uint4 *>(dst + o) = v[j];
      }
    }
    if (kCheck) {
      uint32_t bad = 0;
#pragma unroll
      for (int j = 0; j < kU; ++j)
        if (fl && s0 + j < steps && ((uint64_t)v[j].w << 32 | v[j].z) != kFlag) bad |= 1u << j;
      if (kDefer) {
        if (bad != 0 && first_bad == ~0u) first_bad = s0 + __ffs(bad) - 1;
      } else {
        const uint32_t all = __reduce_or_sync(0xffffffffu, bad);
        if (all != 0) return s0 + __ffs(all) - 1;
      }
    }
  }
  if (kDefer) {
    first_bad = __reduce_min_sync(0xffffffffu, first_bad);
    return first_bad == ~0u ? -1 : (int)first_bad;
  }
  return -1;
}

// The 240-channel copy without per-store predicates: steps wholly inside
// the payload in batches whose size is warp-uniform, the flag lanes' 8
// payload bytes paired by a shuffle (lane 7 takes lane 15's, lane 23
// lane 31's, the 32 bytes at 448 of the step being theirs in that order)
// so that a step is one 16-byte store per storing lane; the partial last
// step as the kept form. kDefer: the flags looked at once per row (the
// first step not landed over every batch) instead of after each batch.
template <bool kDefer>
__device__ __forceinline__ int line_fast_from(const char *row, char *dst, int payload, int s0) {
  const int lane = threadIdx.x & 31, g = lane >> 3, l = lane & 7;
  const bool fl = l == 7, stores = l < 7 || (g & 1) == 0;
  const int off = l < 7 ? (7 * g + l) * 16 : 448 + 8 * g;
  const int full = payload / kLineStep, steps = (payload + kLineStep - 1) / kLineStep;
  const uint4 *at = reinterpret_cast<const uint4 *>(row) + lane;
  uint32_t first_bad = ~0u;
  const int from = s0;
  for (; s0 < full; s0 += kU) {
    const int n = full - s0 < kU ? full - s0 : kU;
    uint4 v[kU];
#pragma unroll
    for (int j = 0; j < kU; ++j)
      v[j] = j < n ? __ldcg(at + (s0 + j) * 32) : make_uint4(0u, 0u, 0u, 0u);
    uint32_t bad = 0;
#pragma unroll
    for (int j = 0; j < kU; ++j) {
      const uint32_t px = __shfl_down_sync(0xffffffffu, v[j].x, 8);
      const uint32_t py = __shfl_down_sync(0xffffffffu, v[j].y, 8);
      if (j < n && stores)
        *reinterpret_cast<uint4 *>(dst + (s0 + j) * kLineStep + off) =
            fl ? make_uint4(v[j].x, v[j].y, px, py) : v[j];
      if (j < n && fl && ((uint64_t)v[j].w << 32 | v[j].z) != kFlag) bad |= 1u << j;
    }
    if (kDefer) {
      if (bad != 0 && first_bad == ~0u) first_bad = s0 + __ffs(bad) - 1;
    } else {
      const uint32_t all = __reduce_or_sync(0xffffffffu, bad);
      if (all != 0) return s0 + __ffs(all) - 1;
    }
  }
  if (full < steps && from <= full) {  // the partial last step
    const uint4 v = __ldcg(at + full * 32);
    const int o = full * kLineStep + off;
    if (o < payload) {
      if (fl)
        *reinterpret_cast<uint2 *>(dst + o) = make_uint2(v.x, v.y);
      else
        *reinterpret_cast<uint4 *>(dst + o) = v;
    }
    if (fl && ((uint64_t)v.w << 32 | v.z) != kFlag && first_bad == ~0u) first_bad = full;
  }
  first_bad = __reduce_min_sync(0xffffffffu, first_bad);
  return first_bad == ~0u ? -1 : (int)first_bad;
}

// Both line formats with stores and checks that cost no dependent chain:
// every store a lane predicate (no branch around it; only the row's last
// step can be partial), and a batch's flags folded by independent
// xor/or steps into one word per lane, a warp vote on it, and the first
// step not landed worked out only when the vote says one is not.
template <bool k224>
__device__ __forceinline__ int line_opt_from(const char *row, char *dst, int payload, int s0) {
  const int lane = threadIdx.x & 31, g = lane >> 3, l = lane & 7;
  const bool fl = l == 7;
  constexpr int step_bytes = k224 ? kStep224 : kLineStep;
  const int off = k224 || l < 7 ? (7 * g + l) * 16 : 448 + 8 * g;
  const int steps = (payload + step_bytes - 1) / step_bytes, full = payload / step_bytes;
  const uint32_t lo = (uint32_t)kFlag, hi = (uint32_t)(kFlag >> 32);
  const uint4 *at = reinterpret_cast<const uint4 *>(row) + lane;
  for (; s0 < steps; s0 += kU) {
    const int n = steps - s0 < kU ? steps - s0 : kU;
    uint4 v[kU];
#pragma unroll
    for (int j = 0; j < kU; ++j) v[j] = j < n ? __ldcg(at + (s0 + j) * 32) : make_uint4(0u, 0u, lo, hi);
#pragma unroll
    for (int j = 0; j < kU; ++j) {
      const int o = (s0 + j) * step_bytes + off;
      const bool in = j < n && (s0 + j < full || o < payload);
      if (in && !fl) *reinterpret_cast<uint4 *>(dst + o) = v[j];
      if (!k224 && in && fl) *reinterpret_cast<uint2 *>(dst + o) = make_uint2(v[j].x, v[j].y);
    }
    uint32_t x[kU];
#pragma unroll
    for (int j = 0; j < kU; ++j) x[j] = (v[j].z ^ lo) | (v[j].w ^ hi);
#pragma unroll
    for (int w = 1; w < kU; w *= 2)
#pragma unroll
      for (int j = 0; j + w < kU; j += 2 * w) x[j] |= x[j + w];
    if (__any_sync(0xffffffffu, fl && x[0] != 0)) {
      uint32_t bad = 0;
#pragma unroll
      for (int j = 0; j < kU; ++j)
        if (fl && j < n && ((uint64_t)v[j].w << 32 | v[j].z) != kFlag) bad |= 1u << j;
      return s0 + __ffs(__reduce_or_sync(0xffffffffu, bad)) - 1;
    }
  }
  return -1;
}

// Spins (bounded by `spins`) until step s's flag lanes see kFlag. Out of
// line, as in the receive.
static __device__ __noinline__ bool step_wait(const char *row, int s) {
  const int lane = threadIdx.x & 31;
  bool ok = true;
  if ((lane & 7) == 7) {
    uint64_t a, b;
    long spins = 0;
    do {
      ld_v2(row + s * 512 + 16 * lane, &a, &b);
    } while (b != kFlag && ++spins < (1l << 26));
    ok = b == kFlag;
  }
  return !__any_sync(0xffffffffu, !ok);
}

// A line copy (from(s): -1 once copied, else the first step not landed)
// that waits on that step's flags and copies again from it, as the receive
// does.
template <typename From>
__device__ __forceinline__ void copy_waiting(const char *row, From from) {
  int s = 0;
  while ((s = from(s)) >= 0)
    if (!step_wait(row, s)) return;
}

template <int M>
__device__ __forceinline__ void copy_row(const char *row, char *dst, int payload) {
  if (M == kPlain || M == kPlainVol) {
    mep_copy_warp<kU>(dst, row, (uint32_t)payload);  // the receive's plain copy
  } else if (M == kLineNoCheck) {
    line_copy_from<kLineCheck, false>(row, dst, payload, 0);
  } else if (M == kLine224NoCheck) {
    line_copy_from<kLine224, false>(row, dst, payload, 0);
  } else if (M == kLineFast || M == kLineDefer) {
    copy_waiting(row, [&](int s) { return line_fast_from<M == kLineDefer>(row, dst, payload, s); });
  } else if (M == kLineOpt || M == kLine224Opt) {
    copy_waiting(row, [&](int s) { return line_opt_from<M == kLine224Opt>(row, dst, payload, s); });
  } else if (M == kLine224Defer) {
    copy_waiting(row, [&](int s) { return line_copy_from<kLine224, true, true>(row, dst, payload, s); });
  } else {
    copy_waiting(row, [&](int s) { return line_copy_from<M, true>(row, dst, payload, s); });
  }
}

// copiers warps (one per row, spread one per block from block 0) copy
// their row; with `fill_blocks` > 0 the last fill_blocks blocks write the
// rows first in the same launch (the copies then wait on flags; plain and
// no-check copies do not wait and are not timed that way).
template <int M>
__global__ void copy(char *rows, char *out, int row_bytes, int copiers, int seed,
                     int fill_blocks, long long *cycles) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int copy_blocks = gridDim.x - fill_blocks;
  if ((int)blockIdx.x >= copy_blocks) {
    const int w = ((int)blockIdx.x - copy_blocks) * (blockDim.x / 32) + warp;
    for (int r = w; r < copiers; r += fill_blocks * (blockDim.x / 32))
      fill_row<M == kLineNoCheck ? kLineCheck : M>(rows + (size_t)r * row_bytes, seed + r);
    return;
  }
  // copier c: block c % copy_blocks, warp c / copy_blocks
  const int c = warp * copy_blocks + blockIdx.x;
  if (c >= copiers) return;
  __syncwarp();
  const long long t0 = clock64();
  // the payload as the receive has it, known only at run time
  copy_row<M>(rows + (size_t)c * row_bytes, out + (size_t)c * kPlainBytes,
              kPlainBytes + (seed < 0 ? 16 : 0));
  __syncwarp();
  const long long t1 = clock64();
  if (lane == 0) cycles[c] = t1 - t0;
}

template <int M>
static bool verify(const char *rows, const char *out);

template <int M>
static void run(char *rows, char *out, long long *d_cycles, int copiers, int grid, int fill_blocks,
                int rounds, double ghz) {
  const int row_bytes = row_bytes_of(M);
  constexpr int F = M == kLineNoCheck ? kLineCheck : M;
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<double> med_warp, slow_warp, ev;
  std::vector<long long> cyc(copiers);
  for (int r = 0; r < rounds; ++r) {
    const int seed = 1000 * (r + 1);
    if (fill_blocks == 0) {
      // old flags first, so a check that passes saw this round's fill
      fill<F><<<(copiers + 15) / 16, 512>>>(rows, copiers, row_bytes, seed);
    } else {
      CK(cudaMemset(rows, 0, (size_t)copiers * row_bytes));
    }
    CK(cudaEventRecord(e0));
    copy<M><<<grid + fill_blocks, 512>>>(rows, out, row_bytes, copiers, seed, fill_blocks, d_cycles);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    CK(cudaMemcpy(cyc.data(), d_cycles, copiers * sizeof(long long), cudaMemcpyDeviceToHost));
    std::sort(cyc.begin(), cyc.end());
    if (r == 0) continue;  // first launch: module load, cold code
    med_warp.push_back(cyc[copiers / 2] / ghz / 1000.0);
    slow_warp.push_back(cyc[copiers - 1] / ghz / 1000.0);
    ev.push_back(ms * 1000.0);
  }
  if (!verify<M>(rows, out)) exit(1);
  auto med = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  printf("%-18s copiers %4d grid %3d fill_blocks %2d: warp copy median %.3f us, slowest %.3f us, "
         "launch %.2f us\n",
         kModeName[M], copiers, grid, fill_blocks, med(med_warp), med(slow_warp), med(ev));
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
}

// The first copier's output against the payload its row carries (host
// side, from the row's bytes and the format's lane map): a probe that
// copied the wrong bytes would time the wrong work.
template <int M>
static bool verify(const char *rows, const char *out) {
  const int row_bytes = row_bytes_of(M);
  std::vector<char> row(row_bytes), got(kPlainBytes), want(kPlainBytes);
  CK(cudaMemcpy(row.data(), rows, row_bytes, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(got.data(), out, kPlainBytes, cudaMemcpyDeviceToHost));
  if (M == kPlain || M == kPlainVol) {
    want = row;
  } else {
    const bool f224 = is224(M);
    const int steps = f224 ? kSteps224 : kSteps240;
    const int step_bytes = f224 ? kStep224 : kLineStep;
    for (int s = 0; s < steps; ++s)
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane >> 3, l = lane & 7;
        if (l == 7 && f224) continue;
        const int off = l < 7 ? (7 * g + l) * 16 : 448 + 8 * g, n = l < 7 ? 16 : 8;
        for (int i = 0; i < n; ++i) {
          const int o = s * step_bytes + off + i;
          if (o < kPlainBytes) want[o] = row[s * 512 + 16 * lane + i];
        }
      }
  }
  for (int i = 0; i < kPlainBytes; ++i)
    if (got[i] != want[i]) {
      printf("%s: copy wrong at byte %d: expected %d got %d\n", kModeName[M], i, want[i], got[i]);
      return false;
    }
  return true;
}

int main(int argc, char **argv) {
  const int rounds = argc > 1 ? atoi(argv[1]) : 200;
  int clk_khz = 0;
  CK(cudaDeviceGetAttribute(&clk_khz, cudaDevAttrClockRate, 0));
  const double ghz = clk_khz / 1e6;
  const int max_rows = 132 * 16;
  char *rows, *out;
  long long *d_cycles;
  CK(cudaMalloc(&rows, (size_t)max_rows * kLine224Bytes));
  CK(cudaMalloc(&out, (size_t)max_rows * kPlainBytes));
  CK(cudaMalloc(&d_cycles, max_rows * sizeof(long long)));
  printf("clock %.2f GHz (cycles to us at that rate), %d rounds\n", ghz, rounds);
  const int shapes[][2] = {{1, 132}, {8, 132}, {132, 132}, {1056, 132}, {2112, 132}};
  for (const auto &s : shapes) {
    run<kPlain>(rows, out, d_cycles, s[0], s[1], 0, rounds, ghz);
    run<kPlainVol>(rows, out, d_cycles, s[0], s[1], 0, rounds, ghz);
    run<kLineNoCheck>(rows, out, d_cycles, s[0], s[1], 0, rounds, ghz);
    run<kLineCheck>(rows, out, d_cycles, s[0], s[1], 0, rounds, ghz);
    run<kLine224>(rows, out, d_cycles, s[0], s[1], 0, rounds, ghz);
    run<kLineFast>(rows, out, d_cycles, s[0], s[1], 0, rounds, ghz);
    run<kLineDefer>(rows, out, d_cycles, s[0], s[1], 0, rounds, ghz);
    run<kLine224NoCheck>(rows, out, d_cycles, s[0], s[1], 0, rounds, ghz);
    run<kLine224Defer>(rows, out, d_cycles, s[0], s[1], 0, rounds, ghz);
    run<kLineOpt>(rows, out, d_cycles, s[0], s[1], 0, rounds, ghz);
    run<kLine224Opt>(rows, out, d_cycles, s[0], s[1], 0, rounds, ghz);
  }
  // rows written by other blocks of the same launch: the check waits
  for (int copiers : {1, 8}) {
    run<kLineCheck>(rows, out, d_cycles, copiers, 124, 8, rounds, ghz);
    run<kLineFast>(rows, out, d_cycles, copiers, 124, 8, rounds, ghz);
    run<kLineDefer>(rows, out, d_cycles, copiers, 124, 8, rounds, ghz);
    run<kLine224>(rows, out, d_cycles, copiers, 124, 8, rounds, ghz);
    run<kLine224Defer>(rows, out, d_cycles, copiers, 124, 8, rounds, ghz);
    run<kLineOpt>(rows, out, d_cycles, copiers, 124, 8, rounds, ghz);
    run<kLine224Opt>(rows, out, d_cycles, copiers, 124, 8, rounds, ghz);
  }
  CK(cudaFree(rows));
  CK(cudaFree(out));
  CK(cudaFree(d_cycles));
  return 0;
}
