// worker_routing.cc: a device-resident topk_idx with an out-of-range expert
// id, then one with an expert repeated within tokens (nccl backend). The
// dispatch cannot check either before launching (that would need a sync);
// the kernel drops the slots and notes it, and group_poll_error reports it
// once as INVALID_ARGUMENT naming the entry or the source rank. The group
// stays usable: a verified round trip follows each. Last, an abandoned
// receive, which fails an nccl group for good.
#include <string>

#include "tests/host/ll_call.h"
#include "tests/host/worker_common.h"

namespace moe_ep_test {

// On the nccl backend an abandoned receive fails the group for good (its
// GPU signals accumulate): the status is the fatal MISMATCH, returned by
// every later call and poll alike, never the "refused, group usable"
// INVALID_ARGUMENT. The group is unusable after this: run it last.
static void abandoned_receive_fails_gpu_group(Ctx& c, const moe_ep_oracle::Problem& p,
                                              uint64_t seed) {
  LlCall a(c, p, seed);
  if (a.prepare() != MOE_EP_OK) return;
  moe_ep_hook_t* hook = nullptr;
  if (!expect_status(c, seed, "deferred dispatch (its hook to be freed unrun)",
                     a.dispatch(MOE_EP_FLAG_DEFER_RECV, &hook), MOE_EP_OK)) {
    return;
  }
  c.api->hook_free(hook);
  for (int i = 0; i < 2; i++) {
    expect_status(c, seed, "poll_error after an abandoned receive",
                  c.api->group_poll_error(c.group), MOE_EP_ERR_MISMATCH,
                  "cannot resynchronise its signals");
  }
  expect_status(c, seed, "dispatch after an abandoned receive", a.dispatch(0, nullptr),
                MOE_EP_ERR_MISMATCH, "the group failed earlier");
}

void run_routing(Ctx& c) {
  using moe_ep_oracle::Generator;
  if (!runs_on_nccl(c, "routing")) return;
  auto p = problem_for(c, c.opt.layers[0].first, c.opt.layers[0].second, Generator::kUniform);
  ll_roundtrip(c, p, 51, false);
  const int64_t bad = p.num_experts + 5;
  {
    LlCall call(c, p, 52);
    const bool corrupted = call.corrupt_first_slot(bad);
    if (call.prepare() != MOE_EP_OK) {
      fail(c, 52, "prepare", c.api->last_error());
      return;
    }
    expect_status(c, 52, "dispatch with an out-of-range id in device memory",
                  call.dispatch(0, nullptr), MOE_EP_OK);
    call.make_y();
    expect_status(c, 52, "combine after it", call.combine(0, nullptr), MOE_EP_OK);
    call.check_dispatch_quietly();  // waits for the device
    if (corrupted) {
      const std::string want = "topk_idx[0][0] = " + std::to_string(bad);
      expect_status(c, 52, "group_poll_error after the bad id", c.api->group_poll_error(c.group),
                    MOE_EP_ERR_INVALID_ARGUMENT, want.c_str());
    }
    expect_status(c, 52, "group_poll_error again (reported once)",
                  c.api->group_poll_error(c.group), MOE_EP_OK);
  }
  ll_roundtrip(c, p, 53, false);
  {
    // Rank 0 names one expert in all its slots: more than
    // max_tokens_per_rank from one source, which only a repeat within a
    // token makes. The host backend refuses that at prepare; the kernel
    // keeps the first max_tokens_per_rank, drops the rest and notes it, and
    // the expert's rank reports it once, naming rank 0.
    const int64_t expert = p.num_experts - 1;
    const int owner = static_cast<int>(expert / p.local_experts());
    LlCall call(c, p, 54);
    const bool over = call.repeat_expert_everywhere(0, expert);
    if (call.prepare() != MOE_EP_OK) {
      fail(c, 54, "prepare", c.api->last_error());
      return;
    }
    expect_status(c, 54, "dispatch with an expert repeated in device memory",
                  call.dispatch(0, nullptr), MOE_EP_OK);
    call.make_y();
    expect_status(c, 54, "combine after it", call.combine(0, nullptr), MOE_EP_OK);
    call.check_dispatch_quietly();  // waits for the device
    if (c.rank == owner && over) {
      const std::string want = "rank 0's topk_idx named local expert " +
                               std::to_string(expert % p.local_experts()) + " (expert " +
                               std::to_string(expert) + ")";
      expect_status(c, 54, "group_poll_error after the repeated expert",
                    c.api->group_poll_error(c.group), MOE_EP_ERR_INVALID_ARGUMENT, want.c_str());
    }
    expect_status(c, 54, "group_poll_error again (reported once)",
                  c.api->group_poll_error(c.group), MOE_EP_OK);
  }
  ll_roundtrip(c, p, 55, false);
  abandoned_receive_fails_gpu_group(c, p, 56);
}

}  // namespace moe_ep_test
