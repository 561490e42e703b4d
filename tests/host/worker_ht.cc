// worker_ht.cc: HT conformance: prepare announces the receive count, then
// dispatch (bf16 or pre-quantised fp8 rows, local ids, weights, per-expert
// counts; exact or worst-case sized outputs) and combine (partials summed
// back over ranks), all against the oracle; and a second dispatch on the
// same handle (DeepEP's cached layout) before the combine, refused while a
// combine of the handle waits in its hook.
#include <vector>

#include "tests/common/plugin_api.h"
#include "tests/host/ht_call.h"
#include "tests/host/worker_common.h"

namespace moe_ep_test {

using namespace moe_ep_oracle;

// Outputs exactly N_recv rows; with --worst_case, world * max_tokens rows
// (some seeds a few more), num_recv_tokens on even seeds only, and y for the
// combine of the dispatch's fixed size.
static void ht_roundtrip(Ctx& c, const Problem& p, uint64_t seed, bool defer) {
  HtCall call(c, p, seed);
  if (call.prepare() != MOE_EP_OK) return;
  const uint32_t hook_flag = defer ? MOE_EP_FLAG_DEFER_RECV : 0;
  const bool worst = c.opt.worst_case;
  int64_t rows = call.num_recv();
  if (worst) rows = static_cast<int64_t>(p.world) * p.max_tokens_per_rank + (seed % 3 == 0 ? 3 : 0);
  uint32_t flags = hook_flag | (worst ? MOE_EP_FLAG_WORST_CASE : 0u);
  if (!expect_status(c, seed, "ht dispatch", call.dispatch(flags, rows, !worst || seed % 2 == 0),
                     MOE_EP_OK)) {
    return;
  }
  call.check_dispatch();
  if (!expect_status(c, seed, "ht combine", call.combine(hook_flag, worst ? rows : call.num_recv()),
                     MOE_EP_OK)) {
    return;
  }
  call.check_combine();
}

// Two dispatches of different x (and hidden) on one handle, the second
// deferred; the combine follows the latest: its hidden, not the first's.
static void ht_cached_layout(Ctx& c, const Problem& p, uint64_t seed) {
  HtCall call(c, p, seed);
  if (call.prepare() != MOE_EP_OK) return;
  if (!expect_status(c, seed, "cached: first dispatch", call.dispatch(0, call.num_recv()),
                     MOE_EP_OK)) {
    return;
  }
  call.check_dispatch();
  const int hidden2 = p.hidden > 128 ? p.hidden - 128 : p.hidden;
  call.set_x_variant(hidden2);
  if (!expect_status(c, seed, "cached: second dispatch on the handle",
                     call.dispatch(MOE_EP_FLAG_DEFER_RECV, call.num_recv()), MOE_EP_OK)) {
    return;
  }
  call.check_dispatch();
  if (hidden2 != p.hidden) {
    std::vector<uint16_t> y(static_cast<size_t>(call.num_recv()) * p.hidden + 1);
    std::vector<uint16_t> out(static_cast<size_t>(num_tokens_for_rank(p, c.rank, seed)) * p.hidden + 1);
    Tensor ty(y.data(), DT::kBf16, {call.num_recv(), p.hidden});
    Tensor to(out.data(), DT::kBf16, {num_tokens_for_rank(p, c.rank, seed), p.hidden});
    moe_ep_combine_params_t cp = MOE_EP_INIT(moe_ep_combine_params_t);
    cp.hidden = p.hidden;
    cp.y = ty.get();
    cp.out = to.get();
    expect_status(c, seed, "cached: combine at the first dispatch's hidden",
                  c.api->combine(c.group, call.handle(), &cp, nullptr),
                  MOE_EP_ERR_INVALID_ARGUMENT, "differs from the dispatch's hidden");
  }
  if (!expect_status(c, seed, "cached: combine", call.combine(0, call.num_recv()), MOE_EP_OK)) {
    return;
  }
  call.check_combine();
}

// A deferred combine, then a dispatch on its handle before its hook ran:
// refused (the receive answers the dispatch before), the hook then gives
// the oracle's sums, and the handle dispatches and combines again.
static void ht_dispatch_under_pending_combine(Ctx& c, const Problem& p, uint64_t seed) {
  HtCall call(c, p, seed);
  if (call.prepare() != MOE_EP_OK) return;
  if (!expect_status(c, seed, "pending combine: dispatch", call.dispatch(0, call.num_recv()),
                     MOE_EP_OK)) {
    return;
  }
  moe_ep_hook_t* hook = nullptr;
  if (!expect_status(c, seed, "pending combine: deferred combine",
                     call.combine(MOE_EP_FLAG_DEFER_RECV, call.num_recv(), &hook), MOE_EP_OK)) {
    return;
  }
  expect_status(c, seed, "pending combine: dispatch on its handle before its hook",
                call.dispatch(0, call.num_recv()), MOE_EP_ERR_INVALID_ARGUMENT,
                "has a combine whose hook=");
  expect_status(c, seed, "pending combine: its hook", c.api->hook_run(hook, nullptr), MOE_EP_OK);
  c.api->hook_free(hook);
  call.check_combine();
  if (!expect_status(c, seed, "pending combine: dispatch after the hook",
                     call.dispatch(0, call.num_recv()), MOE_EP_OK)) {
    return;
  }
  call.check_dispatch();
  if (expect_status(c, seed, "pending combine: combine after the hook",
                    call.combine(0, call.num_recv()), MOE_EP_OK)) {
    call.check_combine();
  }
}

void run_ht_conformance(Ctx& c) {
  const Generator gens[] = {Generator::kUniform, Generator::kSkewed, Generator::kAllToOneRank,
                            Generator::kEmptyRanks, Generator::kMasked};
  for (auto& layer : c.opt.layers) {
    for (Generator g : gens) {
      for (int s = 0; s < c.opt.seeds; s++) {
        uint64_t seed = 3 + static_cast<uint64_t>(s) * 7717 + static_cast<uint64_t>(g) * 31;
        ht_roundtrip(c, problem_for(c, layer.first, layer.second, g), seed, s % 2 == 1);
      }
    }
    ht_cached_layout(c, problem_for(c, layer.first, layer.second, Generator::kMasked), 61);
    ht_dispatch_under_pending_combine(c, problem_for(c, layer.first, layer.second,
                                                     Generator::kUniform), 67);
  }
}

}  // namespace moe_ep_test
