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
  if (a.prepare() != MOE_EP_OK ||
      !a.dispatch_abandoned("deferred dispatch (its hook to be freed unrun)")) {
    return;
  }
  for (int i = 0; i < 2; i++) {
    expect_status(c, seed, "poll_error after an abandoned receive",
                  c.api->group_poll_error(c.group), MOE_EP_ERR_MISMATCH,
                  "cannot resynchronise its signals");
  }
  expect_status(c, seed, "dispatch after an abandoned receive", a.dispatch(0, nullptr),
                MOE_EP_ERR_MISMATCH, "the group failed earlier");
}

// A round trip on `call` whose routing the kernel drops part of and notes:
// dispatch and combine succeed; where `noted`, group_poll_error then
// reports it once, naming `want`, and a second poll is clean. False when
// prepare failed (reported).
static bool noted_round_trip(Ctx& c, LlCall& call, uint64_t seed, const char* dispatch_what,
                             bool noted, const char* poll_what, const std::string& want) {
  if (call.prepare() != MOE_EP_OK) {
    fail(c, seed, "prepare", c.api->last_error());
    return false;
  }
  expect_status(c, seed, dispatch_what, call.dispatch(0, nullptr), MOE_EP_OK);
  call.make_y();
  expect_status(c, seed, "combine after it", call.combine(0, nullptr), MOE_EP_OK);
  call.check_dispatch_quietly();  // waits for the device
  if (noted) {
    expect_status(c, seed, poll_what, c.api->group_poll_error(c.group),
                  MOE_EP_ERR_INVALID_ARGUMENT, want.c_str());
  }
  expect_status(c, seed, "group_poll_error again (reported once)",
                c.api->group_poll_error(c.group), MOE_EP_OK);
  return true;
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
    if (!noted_round_trip(c, call, 52, "dispatch with an out-of-range id in device memory",
                          corrupted, "group_poll_error after the bad id",
                          "topk_idx[0][0] = " + std::to_string(bad))) {
      return;
    }
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
    if (!noted_round_trip(c, call, 54, "dispatch with an expert repeated in device memory",
                          c.rank == owner && over, "group_poll_error after the repeated expert",
                          "rank 0's topk_idx named local expert " +
                              std::to_string(expert % p.local_experts()) + " (expert " +
                              std::to_string(expert) + ")")) {
      return;
    }
  }
  ll_roundtrip(c, p, 55, false);
  abandoned_receive_fails_gpu_group(c, p, 56);
}

}  // namespace moe_ep_test
