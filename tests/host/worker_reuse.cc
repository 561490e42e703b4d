// worker_reuse.cc: one dispatch more than there are buffer sets replaces
// the first handle's layout; combine on that handle is refused with a
// sentence saying so (deferred or not, no hook returned), while the other
// handles combine correctly and the group stays usable. And a dispatch
// that reuses a set while a peer's receive of the set's previous dispatch
// is still to run waits until that peer has read it.
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/host/ll_call.h"
#include "tests/host/worker_common.h"

namespace moe_ep_test {

void run_reuse(Ctx& c) {
  using moe_ep_oracle::Generator;
  auto& layer = c.opt.layers[0];
  auto p = problem_for(c, layer.first, layer.second, Generator::kSkewed);
  int sets = c.opt.double_buffer ? 2 : 1;
  std::vector<std::unique_ptr<LlCall>> calls;
  for (int i = 0; i <= sets; i++) {
    calls.emplace_back(new LlCall(c, p, 80 + static_cast<uint64_t>(i)));
    if (calls.back()->prepare() != MOE_EP_OK) return;
  }
  for (size_t i = 0; i < calls.size(); i++) {
    // No sync between the dispatches: with one buffer set the second waits
    // until every peer has read the first (run_slow_reader).
    LlCall& call = *calls[i];
    if (!expect_status(c, call.seed(), "dispatch", call.dispatch(0, nullptr), MOE_EP_OK)) return;
    call.check_dispatch();
    call.make_y();
  }
  LlCall& stale = *calls[0];
  moe_ep_hook_t* hook = nullptr;
  expect_status(c, stale.seed(), "combine after its buffer set was reused", stale.combine(0, nullptr),
                MOE_EP_ERR_INVALID_ARGUMENT, "overwritten by a later dispatch on the same set");
  expect_status(c, stale.seed(), "deferred combine after its buffer set was reused",
                stale.combine(MOE_EP_FLAG_DEFER_RECV, &hook), MOE_EP_ERR_INVALID_ARGUMENT,
                "lasts until the dispatch after next when dispatches follow each other");
  c.checks++;
  if (hook != nullptr) fail(c, stale.seed(), "refused combine", "returned a hook");
  for (size_t i = 1; i < calls.size(); i++) {
    if (!expect_status(c, calls[i]->seed(), "combine", calls[i]->combine(0, nullptr), MOE_EP_OK)) {
      return;
    }
    calls[i]->check_combine();
  }
  ll_roundtrip(c, p, 90, true);  // still usable
}

// A second dispatch into a set while the last rank's receive of the first
// is still pending (one buffer set, no combine between: a cached
// dispatch again, or the next layer after a dropped combine). The other
// ranks' second dispatch must wait until the last rank has read the first;
// written at once, its rows would land during the last rank's pause and
// that receive would return them instead of the first call's. The pause
// only gives such rows time to land: the checks hold at any timing.
void run_slow_reader(Ctx& c) {
  using moe_ep_oracle::Generator;
  auto& layer = c.opt.layers[0];
  auto p = problem_for(c, layer.first, layer.second, Generator::kSkewed);
  LlCall first(c, p, 95), second(c, p, 96);
  if (first.prepare() != MOE_EP_OK || second.prepare() != MOE_EP_OK) return;
  if (c.rank == c.world - 1) {
    moe_ep_hook_t* hook = nullptr;
    if (!expect_status(c, first.seed(), "deferred dispatch",
                       first.dispatch(MOE_EP_FLAG_DEFER_RECV, &hook), MOE_EP_OK)) {
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    const moe_ep_status_t st = c.api->hook_run(hook, nullptr);
    c.api->hook_free(hook);
    if (!expect_status(c, first.seed(), "its receive, run late", st, MOE_EP_OK)) return;
  } else if (!expect_status(c, first.seed(), "dispatch", first.dispatch(0, nullptr), MOE_EP_OK)) {
    return;
  }
  first.check_dispatch();
  if (!expect_status(c, second.seed(), "the next dispatch on the set", second.dispatch(0, nullptr),
                     MOE_EP_OK)) {
    return;
  }
  second.check_dispatch();
  second.make_y();
  if (!expect_status(c, second.seed(), "combine", second.combine(0, nullptr), MOE_EP_OK)) return;
  second.check_combine();
}

}  // namespace moe_ep_test
