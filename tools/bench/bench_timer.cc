// bench_timer.cc: see bench_timer.h.
#include "tools/bench/bench_timer.h"

#include <algorithm>

#include "absl/flags/flag.h"
#include "tools/bench/bench_flags.h"
#include "tools/bench/bench_util.h"

namespace mep_bench {

Pct Percentiles(std::vector<float> v) {  // nearest rank, in microseconds
  Pct p;
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  size_t i50 = (n + 1) / 2 - 1;
  size_t i99 = static_cast<size_t>((99 * n + 99) / 100) - 1;
  p.p50 = v[i50] * 1e3;
  p.p99 = v[std::min(i99, n - 1)] * 1e3;
  return p;
}

void Timer::Init(cudaStream_t s, int it, int wu, Ref* r) {
  stream = s;
  iters = it;
  warmup = wu;
  ref = r;
  sync_each = absl::GetFlag(FLAGS_sync_each_iter);
  graph = absl::GetFlag(FLAGS_graph);
  ev.resize(static_cast<size_t>(iters) * kMaxPoints);
  for (cudaEvent_t& e : ev) CUDA_CHECK(cudaEventCreate(&e));
}

std::vector<std::vector<float>> Timer::Run(int points, const TimedBody& body,
                                           const std::function<void()>& after_warmup,
                                           double* host_s, bool allow_graph) {
  auto none = [](int) {};
  ref->Barrier();
  for (int i = 0; i < warmup; i++) {
    body(i, none);
    if (sync_each) CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  CUDA_CHECK(cudaStreamSynchronize(stream));
  if (after_warmup) after_warmup();
  double t0 = 0;
  if (graph && allow_graph) {
    // Every timed iteration goes into one graph; events become record
    // nodes (External: a plain record in a capture is only a dependency).
    cudaGraph_t g = nullptr;
    cudaGraphExec_t ge = nullptr;
    CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < iters; i++) {
      cudaEvent_t* e = &ev[static_cast<size_t>(i) * kMaxPoints];
      body(i, [&](int j) { CUDA_CHECK(cudaEventRecordWithFlags(e[j], stream, cudaEventRecordExternal)); });
    }
    CUDA_CHECK(cudaStreamEndCapture(stream, &g));
    CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
    ref->Barrier();
    CUDA_CHECK(cudaGraphLaunch(ge, stream));  // a warm replay, untimed
    CUDA_CHECK(cudaStreamSynchronize(stream));
    ref->Barrier();
    t0 = NowS();
    CUDA_CHECK(cudaGraphLaunch(ge, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    CUDA_CHECK(cudaGraphExecDestroy(ge));
    CUDA_CHECK(cudaGraphDestroy(g));
  } else {
    ref->Barrier();
    t0 = NowS();
    for (int i = 0; i < iters; i++) {
      cudaEvent_t* e = &ev[static_cast<size_t>(i) * kMaxPoints];
      body(i, [&](int j) { CUDA_CHECK(cudaEventRecord(e[j], stream)); });
      if (sync_each) CUDA_CHECK(cudaStreamSynchronize(stream));
    }
    CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  if (host_s) *host_s = NowS() - t0;
  std::vector<std::vector<float>> seg(points - 1, std::vector<float>(iters));
  for (int i = 0; i < iters; i++) {
    cudaEvent_t* e = &ev[static_cast<size_t>(i) * kMaxPoints];
    for (int j = 0; j + 1 < points; j++) CUDA_CHECK(cudaEventElapsedTime(&seg[j][i], e[j], e[j + 1]));
  }
  return seg;
}

}  // namespace mep_bench
