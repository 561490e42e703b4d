// worker_combine_order.cc: two layer calls A and B in flight (one per
// buffer set), combined in different orders on different ranks (rank 0 A
// then B, the others B then A). Each rank's combine would sum rows of
// other tokens than its handle's; both combines are refused, naming the
// peer and both dispatches, and the group stays usable.
#include <string>
#include <utility>

#include "tests/host/ll_call.h"
#include "tests/host/worker_common.h"

namespace moe_ep_test {

void run_combine_order(Ctx& c) {
  auto& layer = c.opt.layers[0];
  auto p = problem_for(c, layer.first, layer.second, moe_ep_oracle::Generator::kUniform);
  {
    LlCall a(c, p, 60), b(c, p, 61);
    if (a.prepare() != MOE_EP_OK || b.prepare() != MOE_EP_OK) return;
    for (LlCall* call : {&a, &b}) {
      if (!expect_status(c, call->seed(), "dispatch", call->dispatch(0, nullptr), MOE_EP_OK)) return;
      call->check_dispatch();
      call->make_y();
    }
    LlCall* order[2] = {&a, &b};
    if (c.rank != 0) std::swap(order[0], order[1]);
    for (LlCall* call : order) {
      expect_status(c, call->seed(), "combine of another layer call than rank 0's",
                    call->combine(0, nullptr), MOE_EP_ERR_INVALID_ARGUMENT,
                    "every rank must combine the same layer call at the same operation");
    }
  }
  ll_roundtrip(c, p, 62, false);  // still usable
  ll_roundtrip(c, p, 63, true);
}

}  // namespace moe_ep_test
