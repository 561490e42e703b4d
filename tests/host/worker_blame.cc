// worker_blame.cc: failure sentences name the rank that really failed and
// what happened to it. With double_buffer: false, rank 0 runs one operation
// more than the others (a combine whose hook it abandons): every other rank
// r must hear "rank 0 is ahead of rank r", at once, not that rank 0 "did not
// take part". The last rank then destroys its group, and rank 0, waiting on
// it, must hear that that rank left; the ranks between stay in their broken
// groups until rank 0 has heard it, so the rank it names is the one that
// left at any world size. Barriers outside moe-ep order the steps, so no
// assertion depends on timing beyond a generous bound (timeouts.kernel_ms).
#include <string>

#include "tests/host/ll_call.h"
#include "tests/host/worker_common.h"

namespace moe_ep_test {

void run_ahead(Ctx& c) {
  using moe_ep_oracle::Generator;
  auto& layer = c.opt.layers[0];
  auto p = problem_for(c, layer.first, layer.second, Generator::kUniform);
  LlCall a(c, p, 71), b(c, p, 72);
  if (a.prepare() != MOE_EP_OK || b.prepare() != MOE_EP_OK) return;
  bool ahead = c.rank == 0;
  moe_ep_hook_t* hook = nullptr;
  if (!expect_status(c, 71, "dispatch A", a.dispatch(0, nullptr), MOE_EP_OK)) return;
  a.check_dispatch();
  if (ahead) {
    // The extra operation: combine's send half, its receive abandoned.
    a.make_y();
    expect_status(c, 71, "combine A send half", a.combine(MOE_EP_FLAG_DEFER_RECV, &hook),
                  MOE_EP_OK);
    c.api->hook_free(hook);
  }
  if (!outside_barrier(c, "ahead1")) return;
  if (!ahead) {
    expect_status(c, 72, "dispatch B send half", b.dispatch(MOE_EP_FLAG_DEFER_RECV, &hook),
                  MOE_EP_OK);
  }
  if (!outside_barrier(c, "ahead2")) return;
  const int leaver = c.world - 1;
  const std::string leaver_s = "rank " + std::to_string(leaver);
  if (ahead) {
    expect_status(c, 72, "dispatch B while " + leaver_s + " leaves", b.dispatch(0, nullptr),
                  MOE_EP_ERR_PEER_FAILED, (leaver_s + " left the group").c_str());
    outside_wait_for(c, "ahead_heard", 0);  // lets the ranks between go
    return;
  }
  const std::string behind = "rank 0 is ahead of rank " + std::to_string(c.rank);
  expect_status(c, 72, "dispatch B hook behind rank 0", c.api->hook_run(hook, nullptr),
                MOE_EP_ERR_MISMATCH, behind.c_str());
  c.api->hook_free(hook);
  // The group is broken for good; destroying it (main) tells rank 0.
  moe_ep_handle_t* h = nullptr;
  moe_ep_prepare_params_t pp = MOE_EP_INIT(moe_ep_prepare_params_t);
  expect_status(c, 73, "the next call after the mismatch", c.api->prepare(c.group, &pp, &h),
                MOE_EP_ERR_MISMATCH, behind.c_str());
  if (c.rank != leaver) outside_wait_for(c, "ahead_heard", 0);
}

}  // namespace moe_ep_test
