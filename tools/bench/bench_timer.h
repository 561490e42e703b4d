// bench_timer.h: the timing loop every measurement shares (warm-up, then
// timed iterations between CUDA events, eager or as one CUDA graph) and the
// percentiles of its per-iteration times.
#ifndef MOE_EP_TOOLS_BENCH_BENCH_TIMER_H_
#define MOE_EP_TOOLS_BENCH_BENCH_TIMER_H_

#include <cuda_runtime.h>

#include <functional>
#include <vector>

#include "tools/bench/bench_ref_comm.h"

namespace mep_bench {

struct Pct {
  double p50 = 0, p99 = 0;
};
Pct Percentiles(std::vector<float> v);  // nearest rank, ms in, us out
// p as time stat k's (p50, p99) pair of st (bench_case.h's Stat layout).
inline void SetTime(std::vector<double>* st, int k, const Pct& p) {
  (*st)[2 * k] = p.p50;
  (*st)[2 * k + 1] = p.p99;
}

// One iteration's body: body(i, rec), where rec(j) records event j.
using TimedBody = std::function<void(int, const std::function<void(int)>&)>;

// Runs `warmup` untimed then `iters` timed iterations of a body; returns
// per-segment times (ms) between consecutive events, [segments][iters],
// and the host seconds the timed loop took to enqueue and finish.
struct Timer {
  cudaStream_t stream;
  std::vector<cudaEvent_t> ev;  // iters * kMaxPoints
  static const int kMaxPoints = 5;
  int iters, warmup;
  bool sync_each, graph;
  Ref* ref;

  void Init(cudaStream_t s, int it, int wu, Ref* r);
  std::vector<std::vector<float>> Run(int points, const TimedBody& body,
                                      const std::function<void()>& after_warmup, double* host_s,
                                      bool allow_graph = true);
};

}  // namespace mep_bench

#endif  // MOE_EP_TOOLS_BENCH_BENCH_TIMER_H_
