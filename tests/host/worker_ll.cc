// worker_ll.cc: LL conformance: every layer shape x routing generator x
// seed, then two micro-batches interleaved through hooks run from another
// thread, with the third pending operation refused.
#include <memory>
#include <thread>

#include "tests/host/ll_call.h"
#include "tests/host/worker_common.h"

namespace moe_ep_test {

using moe_ep_oracle::Generator;

static const Generator kGenerators[] = {Generator::kUniform, Generator::kSkewed,
                                        Generator::kAllToOneRank, Generator::kEmptyRanks,
                                        Generator::kMasked};

void ll_roundtrip(Ctx& c, const moe_ep_oracle::Problem& p, uint64_t seed, bool defer) {
  LlCall call(c, p, seed);
  if (call.prepare() != MOE_EP_OK) return;
  uint32_t flags = defer ? MOE_EP_FLAG_DEFER_RECV : 0;
  moe_ep_hook_t* hook = nullptr;
  if (!expect_status(c, seed, "dispatch", call.dispatch(flags, defer ? &hook : nullptr),
                     MOE_EP_OK)) {
    return;
  }
  if (defer) {
    expect_status(c, seed, "dispatch hook_run", c.api->hook_run(hook, nullptr), MOE_EP_OK);
    c.api->hook_free(hook);
  }
  call.check_dispatch();
  call.make_y();
  if (!expect_status(c, seed, "combine", call.combine(flags, defer ? &hook : nullptr),
                     MOE_EP_OK)) {
    return;
  }
  if (defer) {
    expect_status(c, seed, "combine hook_run", c.api->hook_run(hook, nullptr), MOE_EP_OK);
    c.api->hook_free(hook);
  }
  call.check_combine();
}

// Two micro-batches A and B in flight at once (two buffer sets); their
// receives run on a second thread, as an engine's overlap scheduler would.
static void ll_double_buffered(Ctx& c, const moe_ep_oracle::Problem& p, uint64_t seed) {
  LlCall a(c, p, seed), b(c, p, seed + 1000), third(c, p, seed + 2000);
  if (a.prepare() || b.prepare() || third.prepare()) return;
  moe_ep_hook_t *ha = nullptr, *hb = nullptr, *hc = nullptr;
  if (!expect_status(c, seed, "dispatch A", a.dispatch(MOE_EP_FLAG_DEFER_RECV, &ha), MOE_EP_OK) ||
      !expect_status(c, seed, "dispatch B", b.dispatch(MOE_EP_FLAG_DEFER_RECV, &hb), MOE_EP_OK)) {
    return;
  }
  expect_status(c, seed, "third pending dispatch", third.dispatch(MOE_EP_FLAG_DEFER_RECV, &hc),
                MOE_EP_ERR_BUSY, "pending");
  if (hc != nullptr) fail(c, seed, "third pending dispatch", "returned a hook on failure");
  // group_busy_hook names the hook BUSY waits for: A's, whose receive holds
  // the buffer set the third dispatch uses.
  moe_ep_hook_t* busy = nullptr;
  if (expect_status(c, seed, "group_busy_hook", c.api->group_busy_hook(c.group, &busy),
                    MOE_EP_OK) &&
      busy != ha) {
    fail(c, seed, "group_busy_hook", "did not name dispatch A's hook, whose set is next");
  }
  expect_status(c, seed, "group_busy_hook without an output",
                c.api->group_busy_hook(c.group, nullptr), MOE_EP_ERR_INVALID_ARGUMENT,
                "hook must be non-NULL");
  // A's receive runs on a second thread while this thread runs B's: the two
  // entries really overlap, as in an engine's two-batch overlap.
  moe_ep_status_t sa = MOE_EP_ERR_INTERNAL, sb = MOE_EP_ERR_INTERNAL;
  std::thread t([&] { sa = c.api->hook_run(ha, nullptr); });
  sb = c.api->hook_run(hb, nullptr);
  t.join();
  expect_status(c, seed, "hook A (second thread)", sa, MOE_EP_OK);
  expect_status(c, seed, "hook B (concurrently, first thread)", sb, MOE_EP_OK);
  expect_status(c, seed, "hook A run twice", c.api->hook_run(ha, nullptr),
                MOE_EP_ERR_INVALID_ARGUMENT, "already ran");
  if (expect_status(c, seed, "group_busy_hook after the receives",
                    c.api->group_busy_hook(c.group, &busy), MOE_EP_OK) &&
      busy != nullptr) {
    fail(c, seed, "group_busy_hook after the receives", "named a hook; both sets are free");
  }
  c.api->hook_free(ha);
  c.api->hook_free(hb);
  a.check_dispatch();
  b.check_dispatch();
  a.make_y();
  b.make_y();
  if (!expect_status(c, seed, "combine A", a.combine(MOE_EP_FLAG_DEFER_RECV, &ha), MOE_EP_OK) ||
      !expect_status(c, seed, "combine B", b.combine(MOE_EP_FLAG_DEFER_RECV, &hb), MOE_EP_OK)) {
    return;
  }
  std::thread t2([&] {
    sb = c.api->hook_run(hb, nullptr);  // B's receive first: order is free
    sa = c.api->hook_run(ha, nullptr);
  });
  t2.join();
  expect_status(c, seed, "combine hook B", sb, MOE_EP_OK);
  expect_status(c, seed, "combine hook A", sa, MOE_EP_OK);
  c.api->hook_free(ha);
  c.api->hook_free(hb);
  a.check_combine();
  b.check_combine();
}

// A's combine receive still to run when B's dispatch reuses A's dispatch's
// buffer set (two-batch overlap's order: A dispatch, A combine, B
// dispatch, then A's combine hook). A peer may still be reading A's
// dispatch there; B's dispatch waits for every peer's combine of A (the
// nccl backend's order_reuse). Values of both round trips against the
// oracle.
static void ll_combine_received_after_next_dispatch(Ctx& c, const moe_ep_oracle::Problem& p,
                                                    uint64_t seed) {
  LlCall a(c, p, seed), b(c, p, seed + 1000);
  if (a.prepare() || b.prepare()) return;
  if (!expect_status(c, seed, "dispatch A", a.dispatch(0, nullptr), MOE_EP_OK)) return;
  a.check_dispatch();
  a.make_y();
  moe_ep_hook_t *ha = nullptr, *hb = nullptr;
  if (!expect_status(c, seed, "combine A (receive deferred)",
                     a.combine(MOE_EP_FLAG_DEFER_RECV, &ha), MOE_EP_OK))
    return;
  // B's dispatch lands on A's dispatch's set while A's combine hook waits.
  const moe_ep_status_t sb = b.dispatch(MOE_EP_FLAG_DEFER_RECV, &hb);
  expect_status(c, seed, "combine hook A (after dispatch B)", c.api->hook_run(ha, nullptr),
                MOE_EP_OK);
  c.api->hook_free(ha);
  a.check_combine();
  if (!expect_status(c, seed, "dispatch B (reusing A's set)", sb, MOE_EP_OK)) return;
  expect_status(c, seed, "dispatch hook B", c.api->hook_run(hb, nullptr), MOE_EP_OK);
  c.api->hook_free(hb);
  b.check_dispatch();
  b.make_y();
  if (expect_status(c, seed, "combine B", b.combine(0, nullptr), MOE_EP_OK)) b.check_combine();
}

void run_ll_conformance(Ctx& c) {
  for (auto& layer : c.opt.layers) {
    for (Generator g : kGenerators) {
      for (int s = 0; s < c.opt.seeds; s++) {
        uint64_t seed = 1 + static_cast<uint64_t>(s) * 7919 + static_cast<uint64_t>(g) * 101;
        // Alternate by generator too, so single-seed runs still defer.
        bool defer = (s + static_cast<int>(g)) % 2 == 1;
        ll_roundtrip(c, problem_for(c, layer.first, layer.second, g), seed, defer);
      }
    }
  }
  if (c.opt.hooks) {
    // Alternate layers between micro-batch rounds: one group, two shapes.
    for (size_t i = 0; i < c.opt.layers.size(); i++) {
      auto& layer = c.opt.layers[i];
      ll_double_buffered(c, problem_for(c, layer.first, layer.second, Generator::kMasked),
                         40 + i);
      ll_combine_received_after_next_dispatch(
          c, problem_for(c, layer.first, layer.second, Generator::kUniform), 60 + i);
    }
  }
}

}  // namespace moe_ep_test
