// ll_kernel_bench.cc: timings of the LL kernels themselves, below the public
// API (moe_ep_bench measures through it). One process per GPU, spawned by
// the binary (MOE_EP_TEST_WORLD ranks, default every GPU). Modes:
//   latency  eager dispatch (send + recv) and combine, 128 tokens, hidden
//            7168, top-8, 256 experts, fp8 / bf16; LSA and GIN-emulated,
//            weights at combine and at dispatch: "BENCH rank R ..." lines
//   phases   where the fused dispatch's time goes: every block stamps
//            %globaltimer at each phase boundary (mep_ll_ctx_t.stamps); per
//            launch each phase's min / median / max over blocks after the
//            launch's first entry, then the median over launches, at 1, 8
//            and 128 tokens: "PHASES rank R ..." lines
//            (tools/bench/RESULTS.md quotes them)
//   warm     phases with the fused dispatch launched twice per step, the
//            second one stamped: its code, parameters and inputs already
//            fetched by the first (what the cold launch pays for them).
//            The first runs on the other buffer set: two dispatches on one
//            set with no combine between would let a rank overwrite rows
//            a peer still reads
//   phases_bf16  phases with a bf16 dispatch (what the fp8 quantiser and
//            the scales cost, against the same routing)
//   all      latency and phases (the default)
// A print, no assertion on time; a kernel that records an error fails the
// run with the rank and the record.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/ll/ll.h"
#include "tests/gpu/ll_gpu_harness.h"

using namespace mep_ll_gpu;

namespace {

#define BENCH_CHECK(cond, what)                                               \
  do {                                                                        \
    if (!(cond)) {                                                            \
      fprintf(stderr, "rank %d: %s failed: %s\n", g_rank, what,               \
              mep_kernels_last_error());                                      \
      return false;                                                           \
    }                                                                         \
  } while (0)
#define BENCH_CUDA(x) BENCH_CHECK((x) == cudaSuccess, #x)
#define BENCH_MEP(x) BENCH_CHECK((x) == MEP_KSTATUS_OK, #x)

bool no_record(const Group &g) {
  const mep_ll_error_record_t *r = g.rec;
  if (r->flag == 0) return true;
  fprintf(stderr, "rank %d: a kernel recorded op %d rank %d peer %d expert %d set %d expected %llu seen %llu\n",
          g_rank, r->op, r->rank, r->peer, r->expert, r->buffer_set,
          (unsigned long long)r->expected, (unsigned long long)r->seen);
  return false;
}

// The case every mode times: 128 tokens per rank (or `tokens`), fp8 unless
// phases_bf16 asks otherwise.
Case bench_case(int tokens, int fp8 = 1) {
  return Case{7168, 8, 256, fp8, MOE_EP_FP8_SCALE_F32, 8, {tokens, tokens}, 12};
}

bool latency(Group &g) {
  const Case c = bench_case(128);
  const Inputs in = make_inputs(c, g_rank);
  BENCH_CHECK(upload(c, in, g.x, g.topk, g.w), "upload");
  for (int mode = 0; mode < 4; ++mode) {
    const int transport = mode % 2 ? MEP_LL_TRANSPORT_GIN_EMULATED : MEP_LL_TRANSPORT_LSA;
    const int weighted = mode / 2;
    g.ctx.transport = transport;
    mep_ll_dispatch_args_t d = dispatch_args(c, g, 0, g.x, g.topk, g.w, weighted);
    mep_ll_combine_args_t cb = combine_args(c, g, 0, g.topk, g.w, weighted);
    cudaEvent_t e0, e1, e2;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaEventCreate(&e2);
    std::vector<float> td, tc;
    for (int it = 0; it < 220; ++it) {
      cudaEventRecord(e0, g.stream);
      BENCH_MEP(mep_ll_dispatch_send(&g.ctx, &d, g.stream));
      BENCH_MEP(mep_ll_dispatch_recv(&g.ctx, &d, g.stream));
      cudaEventRecord(e1, g.stream);
      BENCH_MEP(mep_ll_combine_send(&g.ctx, &cb, g.stream));
      BENCH_MEP(mep_ll_combine_recv(&g.ctx, &cb, g.stream));
      cudaEventRecord(e2, g.stream);
      BENCH_CUDA(cudaEventSynchronize(e2));
      float a, b;
      cudaEventElapsedTime(&a, e0, e1);
      cudaEventElapsedTime(&b, e1, e2);
      if (it >= 20) {
        td.push_back(a * 1000);
        tc.push_back(b * 1000);
      }
    }
    if (!no_record(g)) return false;
    std::sort(td.begin(), td.end());
    std::sort(tc.begin(), tc.end());
    printf("BENCH rank %d transport %s %s sms %d: dispatch(fp8) median %.1f us p99 %.1f us | "
           "combine(bf16) median %.1f us p99 %.1f us\n",
           g_rank, transport == MEP_LL_TRANSPORT_LSA ? "lsa" : "gin_emulated",
           weighted ? "weights-at-dispatch" : "weights-at-combine", g.ctx.num_sms,
           median(td), td[td.size() * 99 / 100], median(tc), tc[tc.size() * 99 / 100]);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaEventDestroy(e2);
  }
  return true;
}

bool phases_for(Group &g, uint64_t *stamps, int grid_max, int tokens, bool warm, int fp8) {
  const int P = MEP_LL_STAMP_POINTS;
  const Case c = bench_case(tokens, fp8);
  g.ctx.transport = MEP_LL_TRANSPORT_LSA;
  const Inputs in = make_inputs(c, g_rank);
  BENCH_CHECK(upload(c, in, g.x, g.topk, g.w), "upload");
  mep_ll_dispatch_args_t d = dispatch_args(c, g, 0, g.x, g.topk, g.w, 1);
  const mep_ll_dispatch_args_t d_warm = dispatch_args(c, g, 1, g.x, g.topk, g.w, 1);
  mep_ll_combine_args_t cb = combine_args(c, g, 0, g.topk, g.w, 1);
  // per point: per-launch (min, median, max) over the blocks that reach it
  std::vector<std::vector<double>> lo(P), mid(P), hi(P);
  std::vector<double> ev;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<uint64_t> h(grid_max * P);
  // per block: its 'sent' stamp after the launch's first entry, per launch
  std::vector<std::vector<double>> sent_of(grid_max);
  for (int it = 0; it < 120; ++it) {
    BENCH_CUDA(cudaMemsetAsync(stamps, 0, grid_max * P * 8, g.stream));
    if (warm) BENCH_MEP(mep_ll_dispatch(&g.ctx, &d_warm, g.stream));
    g.ctx.stamps = stamps;
    cudaEventRecord(e0, g.stream);
    BENCH_MEP(mep_ll_dispatch(&g.ctx, &d, g.stream));
    cudaEventRecord(e1, g.stream);
    g.ctx.stamps = nullptr;
    BENCH_MEP(mep_ll_combine(&g.ctx, &cb, g.stream));
    BENCH_CUDA(cudaStreamSynchronize(g.stream));
    if (!no_record(g)) return false;
    if (it < 20) continue;
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    ev.push_back(ms * 1000);
    BENCH_CUDA(cudaMemcpy(h.data(), stamps, h.size() * 8, cudaMemcpyDeviceToHost));
    uint64_t t0 = UINT64_MAX;
    for (int b = 0; b < grid_max; ++b)
      if (h[b * P] != 0) t0 = std::min(t0, h[b * P]);
    for (int b = 0; b < grid_max; ++b)
      if (h[b * P + MEP_LL_STAMP_SENT] != 0)
        sent_of[b].push_back((h[b * P + MEP_LL_STAMP_SENT] - t0) / 1000.0);
    for (int i = 0; i < P; ++i) {
      std::vector<double> v;
      for (int b = 0; b < grid_max; ++b) {
        if (i == MEP_LL_STAMP_WORD_WAITS) {
          if (h[b * P + MEP_LL_STAMP_ENTRY] != 0) v.push_back((double)h[b * P + i]);
        } else if (h[b * P + i] != 0) {
          v.push_back((h[b * P + i] - t0) / 1000.0);
        }
      }
      if (v.empty()) continue;
      std::sort(v.begin(), v.end());
      lo[i].push_back(v.front());
      mid[i].push_back(v[v.size() / 2]);
      hi[i].push_back(v.back());
    }
  }
  static const char *names[] = {"entry",  "sent",   "signalled", "heads",     "scanned",
                                "seen",   "copied", "done",      "word waits", "1st words",
                                "1st step", "counts", "marked",  "joined"};
  static_assert(sizeof(names) / sizeof(names[0]) == MEP_LL_STAMP_POINTS, "a name per point");
  const char *warm_tag = warm ? " warm" : "";
  printf("PHASES rank %d tokens %d %s %s dispatch: event median %.1f us; per phase, us after "
         "the first block's entry (min / median / max over blocks; medians of 100 launches; "
         "word waits: a count per block)\n",
         g_rank, tokens, warm ? "warm" : "fused", fp8 ? "fp8" : "bf16", median(ev));
  for (int i = 0; i < P; ++i)
    if (!mid[i].empty())
      printf("PHASES rank %d tokens %d%s %-9s %6.2f %6.2f %6.2f\n", g_rank, tokens, warm_tag,
             names[i],
             median(lo[i]), median(mid[i]), median(hi[i]));
  // The blocks whose own send units end last (warp 0's units: block b
  // holds send units b * 16 .. b * 16 + 15 of the fused kernel's index
  // space), median over launches.
  std::vector<std::pair<double, int>> slow;
  for (int b = 0; b < grid_max; ++b)
    if (!sent_of[b].empty()) slow.push_back({median(sent_of[b]), b});
  std::sort(slow.rbegin(), slow.rend());
  printf("PHASES rank %d tokens %d%s slowest sent:", g_rank, tokens, warm_tag);
  for (size_t i = 0; i < slow.size() && i < 8; ++i)
    printf(" block %d %.2f", slow[i].second, slow[i].first);
  printf("\n");
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return true;
}

bool phases(Group &g, bool warm, int fp8) {
  const int grid_max = 256;
  uint64_t *stamps = nullptr;
  BENCH_CUDA(cudaMalloc((void **)&stamps, grid_max * MEP_LL_STAMP_POINTS * 8));
  bool ok = true;
  for (int tokens : {1, 8, 128}) ok = ok && phases_for(g, stamps, grid_max, tokens, warm, fp8);
  g.ctx.stamps = nullptr;
  cudaFree(stamps);
  return ok;
}

}  // namespace

int main(int argc, char **argv) {
  const std::string mode = argc > 1 ? argv[1] : "all";
  if (mode != "all" && mode != "latency" && mode != "phases" && mode != "warm" &&
      mode != "phases_bf16") {
    fprintf(stderr, "usage: %s [all|latency|phases|phases_bf16|warm]\n", argv[0]);
    return 2;
  }
  const char *r = getenv("MOE_EP_RANK"), *w = getenv("MOE_EP_WORLD_SIZE");
  if (!r || !w) return spawn_ranks(argv, "ll_kernel_bench");
  g_rank = atoi(r);
  g_world = atoi(w);
  setvbuf(stdout, nullptr, _IONBF, 0);  // nothing lost if the rank is killed
  if (cudaSetDevice(g_rank) != cudaSuccess) return 6;
  Group *g = group_create(nullptr);
  if (g == nullptr) return 3;
  bool ok = true;
  if (mode == "all" || mode == "latency") ok = latency(*g);
  if (ok && mode != "latency") ok = phases(*g, mode == "warm", mode == "phases_bf16" ? 0 : 1);
  group_free(g);
  return ok ? 0 : 1;
}
