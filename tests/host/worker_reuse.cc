// worker_reuse.cc: one dispatch more than there are buffer sets replaces
// the first handle's layout; combine on that handle is refused with a
// sentence saying so (deferred or not, no hook returned), while the other
// handles combine correctly and the group stays usable.
#include <memory>
#include <string>
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
    // With one buffer set, two dispatches in a row need the engine's own
    // sync between them: a fast rank would overwrite the set a slow rank
    // is still receiving (see the "ahead" scenario).
    if (i > 0 && sets == 1 && !outside_barrier(c, "reuse" + std::to_string(i))) return;
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
                "combine each handle before the dispatch after next");
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

}  // namespace moe_ep_test
