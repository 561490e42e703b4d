// worker_streams.cc: hooks on a second stream (nccl backend), in two-batch
// overlap's order: combine A's send deferred, dispatch B, then A's receive
// hook on another stream held back by a host function, then combine B on
// the same buffer set as A. Combine B's send must wait for A's receive
// (the runtime's order of a send after its set's last receive, which the
// two halves of the combine regions rest on: kernels/ll/PROTOCOL.md,
// section 6); otherwise B's send moves the set's combine epoch before A's
// receive reads it. Both combines are checked against the oracle.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include "tests/common/mirror.h"
#include "tests/host/ll_call.h"
#include "tests/host/worker_common.h"

namespace moe_ep_test {

namespace {

void CUDART_CB hold_back(void*) { usleep(100 * 1000); }

}  // namespace

void run_streams(Ctx& c) {
  if (!runs_on_nccl(c, "streams")) return;
  using moe_ep_oracle::Generator;
  auto p = problem_for(c, c.opt.layers[0].first, c.opt.layers[0].second, Generator::kUniform);
  cudaStream_t ops, hooks;
  cuda_check(cudaStreamCreateWithFlags(&ops, cudaStreamNonBlocking), "cudaStreamCreate");
  cuda_check(cudaStreamCreateWithFlags(&hooks, cudaStreamNonBlocking), "cudaStreamCreate");
  for (int s = 0; s < c.opt.seeds && c.failures == 0; s++) {
    const uint64_t seed = 700 + 2 * (uint64_t)s;
    LlCall a(c, p, seed), b(c, p, seed + 1);
    a.set_stream(ops);
    b.set_stream(ops);
    if (a.prepare() != MOE_EP_OK || b.prepare() != MOE_EP_OK) break;
    if (!expect_status(c, seed, "dispatch A", a.dispatch(0, nullptr), MOE_EP_OK)) break;
    a.check_dispatch();
    a.make_y();
    moe_ep_hook_t* ha = nullptr;
    if (!expect_status(c, seed, "combine A, receive deferred",
                       a.combine(MOE_EP_FLAG_DEFER_RECV, &ha), MOE_EP_OK))
      break;
    if (!expect_status(c, seed, "dispatch B, A's receive pending", b.dispatch(0, nullptr),
                       MOE_EP_OK)) {
      c.api->hook_free(ha);
      break;
    }
    // (these wait for the whole device: before A's receive is issued)
    b.check_dispatch();
    b.make_y();
    // A's receive on the hook stream, after a host function holds that
    // stream back 100 ms; combine B, issued right after on the op stream
    // with no host wait between, would otherwise run first.
    cuda_check(cudaLaunchHostFunc(hooks, hold_back, nullptr), "cudaLaunchHostFunc");
    const moe_ep_status_t sa = c.api->hook_run(ha, hooks);
    c.api->hook_free(ha);
    if (!expect_status(c, seed, "combine A's hook on another stream", sa, MOE_EP_OK)) break;
    if (!expect_status(c, seed, "combine B on A's buffer set", b.combine(0, nullptr), MOE_EP_OK))
      break;
    cuda_check(cudaStreamSynchronize(hooks), "cudaStreamSynchronize(hooks)");
    a.check_combine();
    b.check_combine();
  }
  expect_status(c, 0, "poll_error after the rounds", c.api->group_poll_error(c.group), MOE_EP_OK);
  cudaStreamDestroy(ops);
  cudaStreamDestroy(hooks);
}

}  // namespace moe_ep_test
