// worker_graph.cc: CUDA graph capture through the public API (nccl
// backend). Dispatch and combine are captured once each (with and without
// hooks: the deferred receive is captured by running the hook on the
// capture stream), and prepare with its layout outputs, then replayed on
// fresh inputs written into the same buffers; every replay is checked
// against the oracle.
#include <cuda_runtime_api.h>

#include <string>

#include "tests/common/mirror.h"
#include "tests/host/ll_call.h"
#include "tests/host/worker_common.h"

namespace moe_ep_test {

namespace {

// Captures one operation (and its hook) on `s`; false after reporting.
template <typename Op>
bool capture(Ctx& c, uint64_t seed, const char* what, cudaStream_t s, bool defer, Op op,
             cudaGraphExec_t* exec) {
  cudaGraph_t graph = nullptr;
  cuda_check(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), "cudaStreamBeginCapture");
  moe_ep_hook_t* hook = nullptr;
  moe_ep_status_t st = op(defer ? MOE_EP_FLAG_DEFER_RECV : 0u, defer ? &hook : nullptr);
  if (st == MOE_EP_OK && defer) st = c.api->hook_run(hook, s);
  c.api->hook_free(hook);
  cudaError_t e = cudaStreamEndCapture(s, &graph);
  if (!expect_status(c, seed, what, st, MOE_EP_OK)) return false;
  cuda_check(e, "cudaStreamEndCapture");
  cuda_check(cudaGraphInstantiate(exec, graph, 0), "cudaGraphInstantiate");
  cudaGraphDestroy(graph);
  return true;
}

}  // namespace

void run_graph(Ctx& c) {
  if (!runs_on_nccl(c, "graph")) return;
  using moe_ep_oracle::Generator;
  auto p = problem_for(c, c.opt.layers[0].first, c.opt.layers[0].second, Generator::kUniform);
  cudaStream_t s;
  cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  // An engine's order: one eager round on the default stream first (its
  // receives leave events on that stream), then captures on another
  // stream, whose sends must not wait on those events (CUDA refuses a
  // capturing stream's wait on an event recorded outside the capture).
  {
    LlCall warm(c, p, 400);
    if (warm.prepare() != MOE_EP_OK) return;
    if (!expect_status(c, 400, "eager dispatch before the captures", warm.dispatch(0, nullptr),
                       MOE_EP_OK))
      return;
    warm.check_dispatch();
    warm.make_y();
    if (!expect_status(c, 400, "eager combine before the captures", warm.combine(0, nullptr),
                       MOE_EP_OK))
      return;
    warm.check_combine();
  }
  for (int defer = 0; defer < 2; defer++) {
    uint64_t seed = 500 + defer * 1000;
    LlCall call(c, p, seed);
    call.set_stream(s);
    if (call.prepare() != MOE_EP_OK) return;
    cudaGraphExec_t g_dispatch = nullptr, g_combine = nullptr;
    std::string tag = defer ? "graph+hooks " : "graph ";
    if (!capture(c, seed, (tag + "capture dispatch").c_str(), s, defer,
                 [&](uint32_t f, moe_ep_hook_t** h) { return call.dispatch(f, h); }, &g_dispatch) ||
        !capture(c, seed, (tag + "capture combine").c_str(), s, defer,
                 [&](uint32_t f, moe_ep_hook_t** h) { return call.combine(f, h); }, &g_combine)) {
      return;
    }
    int replays = c.opt.seeds;
    for (int i = 0; i < replays; i++) {
      call.reseed(seed + 1 + i);
      cuda_check(cudaGraphLaunch(g_dispatch, s), "cudaGraphLaunch(dispatch)");
      cuda_check(cudaStreamSynchronize(s), "replay dispatch");
      call.check_dispatch();
      call.make_y();
      cuda_check(cudaGraphLaunch(g_combine, s), "cudaGraphLaunch(combine)");
      cuda_check(cudaStreamSynchronize(s), "replay combine");
      call.check_combine();
      if (c.failures > 0) break;
    }
    expect_status(c, seed, tag + "poll_error after replays", c.api->group_poll_error(c.group),
                  MOE_EP_OK);
    cudaGraphExecDestroy(g_dispatch);
    cudaGraphExecDestroy(g_combine);
  }
  // prepare's layout outputs captured too (no sync or allocation inside):
  // each replay recomputes them from the reseeded topk_idx.
  {
    uint64_t seed = 3000;
    LlCall call(c, p, seed);
    call.set_stream(s);
    cudaGraphExec_t g_prepare = nullptr;
    if (!capture(c, seed, "graph capture prepare", s, false,
                 [&](uint32_t, moe_ep_hook_t**) { return call.prepare(false); }, &g_prepare)) {
      return;
    }
    for (int i = 0; i < c.opt.seeds && c.failures == 0; i++) {
      call.reseed(seed + 1 + i);
      cuda_check(cudaGraphLaunch(g_prepare, s), "cudaGraphLaunch(prepare)");
      cuda_check(cudaStreamSynchronize(s), "replay prepare");
      call.check_prepare();
    }
    cudaGraphExecDestroy(g_prepare);
  }
  cudaStreamDestroy(s);
}

}  // namespace moe_ep_test
