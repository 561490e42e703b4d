// worker_busy.cc: deferred operations whose peer is busy elsewhere, as in an
// engine: between a send half and its hook a rank waits in something that
// is not moe-ep (its own barrier or all-reduce), or in another group. The
// host backend must land the peer's data and complete this rank's sends on
// its own; every run forms fresh groups, so the first operation after
// group_create is exercised each time. Values are checked against the oracle.
#include <cstdio>
#include <string>

#include "tests/host/ll_call.h"
#include "tests/host/worker_common.h"

namespace moe_ep_test {

using moe_ep_oracle::Generator;

namespace {

// A Ctx for another group of this process; its counts are folded back.
struct GroupCtx {
  Ctx ctx;
  Ctx& parent;
  GroupCtx(Ctx& c, moe_ep_group_t* g) : ctx(c), parent(c) {
    ctx.group = g;
    ctx.failures = 0;
    ctx.checks = 0;
  }
  ~GroupCtx() {
    if (ctx.group != nullptr) {
      moe_ep_status_t st = ctx.api->group_destroy(ctx.group);
      if (st != MOE_EP_OK) fail(ctx, 0, "group_destroy", ctx.api->last_error());
    }
    parent.failures += ctx.failures;
    parent.checks += ctx.checks;
  }
};

bool run_hook(Ctx& c, uint64_t seed, const std::string& what, moe_ep_hook_t* hook) {
  bool ok = expect_status(c, seed, what, c.api->hook_run(hook, nullptr), MOE_EP_OK);
  c.api->hook_free(hook);
  return ok;
}

bool have_ports(Ctx& c, size_t need) {
  c.checks++;
  if (c.opt.ports.size() >= need) return true;
  fail(c, 0, c.opt.scenario, "needs " + std::to_string(need) + " --ports, got " +
                                 std::to_string(c.opt.ports.size()));
  return false;
}

void report_runs(Ctx& c, int passed) {
  std::fprintf(stderr, "rank %d: %s: %d of %d runs passed\n", c.rank, c.opt.scenario.c_str(),
               passed, c.opt.runs);
}

// One run of pattern (a). The busy rank sends first, then waits outside
// moe-ep until the others have sent and received; the others start once
// it has sent. For combine the roles swap.
bool busy_peer_run(Ctx& parent, int run) {
  moe_ep_group_t* g = create_group_on_port(parent, parent.opt.ports[run]);
  if (g == nullptr) return false;
  GroupCtx gc(parent, g);
  Ctx& c = gc.ctx;
  auto& layer = c.opt.layers[0];
  // Every token to the busy rank's experts (seed % world picks it): the
  // others' sends to it are large (rendezvous: the receiver must act),
  // its own to them are small.
  auto p = problem_for(c, layer.first, layer.second, Generator::kAllToOneRank);
  uint64_t seed = static_cast<uint64_t>(c.world) * (500 + static_cast<uint64_t>(run)) +
                  static_cast<uint64_t>(c.world - 1);
  bool busy = c.rank == c.world - 1;
  std::string tag = std::to_string(run);
  LlCall call(c, p, seed);
  if (call.prepare() != MOE_EP_OK) return false;
  // Barriers run even after a failure, so the other ranks are not left
  // waiting in them.
  bool ok = true;
  moe_ep_hook_t* hook = nullptr;
  if (busy) {
    ok = expect_status(c, seed, "dispatch send half", call.dispatch(MOE_EP_FLAG_DEFER_RECV, &hook),
                       MOE_EP_OK);
    ok = outside_wait_for(c, "sent" + tag, c.rank) && ok;  // marks it: sent, now busy
    ok = outside_barrier(c, "dispatch" + tag) && ok;
    ok = ok && run_hook(c, seed, "dispatch hook", hook);
  } else {
    ok = outside_wait_for(c, "sent" + tag, c.world - 1);
    ok = ok && expect_status(c, seed, "dispatch send half (busy peer)",
                       call.dispatch(MOE_EP_FLAG_DEFER_RECV, &hook), MOE_EP_OK) &&
         run_hook(c, seed, "dispatch hook (busy peer)", hook);
    ok = outside_barrier(c, "dispatch" + tag) && ok;
  }
  if (ok) {
    call.check_dispatch();
    call.make_y();
  }
  if (!busy) {
    ok = ok && expect_status(c, seed, "combine send half",
                             call.combine(MOE_EP_FLAG_DEFER_RECV, &hook), MOE_EP_OK);
    ok = outside_barrier(c, "combine" + tag) && ok;
    ok = ok && run_hook(c, seed, "combine hook", hook);
  } else {
    ok = ok &&
         expect_status(c, seed, "combine send half (busy peer)",
                       call.combine(MOE_EP_FLAG_DEFER_RECV, &hook), MOE_EP_OK) &&
         run_hook(c, seed, "combine hook (busy peer)", hook);
    ok = outside_barrier(c, "combine" + tag) && ok;
  }
  if (!ok) return false;
  call.check_combine();
  return c.failures == 0;
}

// Both groups' send halves in this rank's order, then both hooks.
bool deferred_pair(Ctx* ctx[2], LlCall* call[2], uint64_t seed, bool combine) {
  std::string op = combine ? "combine" : "dispatch";
  moe_ep_hook_t* hook[2] = {nullptr, nullptr};
  for (int i = 0; i < 2; i++) {
    moe_ep_status_t st = combine ? call[i]->combine(MOE_EP_FLAG_DEFER_RECV, &hook[i])
                                 : call[i]->dispatch(MOE_EP_FLAG_DEFER_RECV, &hook[i]);
    if (!expect_status(*ctx[i], seed, (i ? "second group's " : "first group's ") + op, st,
                       MOE_EP_OK)) {
      return false;
    }
  }
  for (int i = 0; i < 2; i++) {
    if (!run_hook(*ctx[i], seed, op + " hook", hook[i])) return false;
  }
  return true;
}

// One run of pattern (b): two live groups; rank 0 issues A then B, the
// other ranks B then A, every half deferred.
bool two_groups_run(Ctx& parent, int run) {
  moe_ep_group_t* ga = create_group_on_port(parent, parent.opt.ports[2 * run]);
  if (ga == nullptr) return false;
  GroupCtx a(parent, ga);
  moe_ep_group_t* gb = create_group_on_port(parent, parent.opt.ports[2 * run + 1]);
  if (gb == nullptr) return false;
  GroupCtx b(parent, gb);
  auto& layer = parent.opt.layers[0];
  uint64_t seed = 900 + 2 * static_cast<uint64_t>(run);
  // Declared after the groups, so destroyed before them.
  LlCall call_a(a.ctx, problem_for(a.ctx, layer.first, layer.second, Generator::kUniform), seed);
  LlCall call_b(b.ctx, problem_for(b.ctx, layer.first, layer.second, Generator::kSkewed),
                seed + 1);
  if (call_a.prepare() != MOE_EP_OK || call_b.prepare() != MOE_EP_OK) return false;
  bool a_first = parent.rank == 0;
  Ctx* ctx[2] = {a_first ? &a.ctx : &b.ctx, a_first ? &b.ctx : &a.ctx};
  LlCall* call[2] = {a_first ? &call_a : &call_b, a_first ? &call_b : &call_a};
  if (!deferred_pair(ctx, call, seed, false)) return false;
  for (int i = 0; i < 2; i++) {
    call[i]->check_dispatch();
    call[i]->make_y();
  }
  if (!deferred_pair(ctx, call, seed, true)) return false;
  for (int i = 0; i < 2; i++) call[i]->check_combine();
  return a.ctx.failures == 0 && b.ctx.failures == 0;
}

// A handle and a pending hook kept past their group's destroy, the handle
// passed to the next group, which the allocator may place at the old
// group's address: refused as a destroyed group's (the hook's run too),
// freed without touching that group, and the new group still works.
bool stale_handle_run(Ctx& parent, int port_a, int port_b) {
  auto& layer = parent.opt.layers[0];
  const uint64_t seed = 950;
  moe_ep_handle_t* stale = nullptr;
  moe_ep_hook_t* stale_hook = nullptr;
  moe_ep_handle_t* hooked = nullptr;
  {
    moe_ep_group_t* g = create_group_on_port(parent, port_a);
    if (g == nullptr) return false;
    GroupCtx a(parent, g);
    LlCall call(a.ctx, problem_for(a.ctx, layer.first, layer.second, Generator::kUniform), seed);
    if (call.prepare() != MOE_EP_OK ||
        !expect_status(a.ctx, seed, "dispatch (its handle to outlive the group)",
                       call.dispatch(0, nullptr), MOE_EP_OK)) {
      return false;
    }
    stale = call.release_handle();
    // Its buffers go before the group: the hook never receives into them.
    LlCall pending(a.ctx, problem_for(a.ctx, layer.first, layer.second, Generator::kUniform),
                   seed + 2);
    if (pending.prepare() != MOE_EP_OK ||
        !expect_status(a.ctx, seed + 2, "deferred dispatch (its hook to outlive the group)",
                       pending.dispatch(MOE_EP_FLAG_DEFER_RECV, &stale_hook), MOE_EP_OK)) {
      parent.api->handle_free(stale);
      return false;
    }
    hooked = pending.release_handle();
  }
  // The group is destroyed; its hook reports that and runs nothing.
  expect_status(parent, seed + 2, "hook_run of a destroyed group's hook",
                parent.api->hook_run(stale_hook, nullptr), MOE_EP_ERR_INVALID_ARGUMENT,
                ("belongs to rank " + std::to_string(parent.rank) +
                 "'s group, which was destroyed").c_str());
  parent.api->hook_free(stale_hook);
  parent.api->handle_free(hooked);
  // Freed at once, although no group holds them any more.
  expect_status(parent, seed + 2, "hook_run after hook_free of a destroyed group's hook",
                parent.api->hook_run(stale_hook, nullptr), MOE_EP_ERR_INVALID_ARGUMENT,
                "not a live hook");
  moe_ep_group_t* g = create_group_on_port(parent, port_b);
  if (g == nullptr) {
    parent.api->handle_free(stale);
    return false;
  }
  GroupCtx b(parent, g);
  Ctx& c = b.ctx;
  auto p = problem_for(c, layer.first, layer.second, Generator::kUniform);
  moe_ep_hook_t* hook = nullptr;
  moe_ep_combine_params_t cp = MOE_EP_INIT(moe_ep_combine_params_t);
  cp.hidden = p.hidden;
  expect_status(c, seed, "combine on a destroyed group's handle",
                c.api->combine(c.group, stale, &cp, &hook), MOE_EP_ERR_INVALID_ARGUMENT,
                "was prepared on a group that has been destroyed");
  c.api->handle_free(stale);
  ll_roundtrip(c, p, seed + 1, false);
  return c.failures == 0;
}

}  // namespace

void run_busy_peer(Ctx& c) {
  const size_t runs = static_cast<size_t>(c.opt.runs);
  if (!have_ports(c, runs + 2)) return;
  int passed = 0;
  for (int run = 0; run < c.opt.runs; run++) passed += busy_peer_run(c, run);
  report_runs(c, passed);
  stale_handle_run(c, c.opt.ports[runs], c.opt.ports[runs + 1]);
}

void run_two_groups(Ctx& c) {
  if (!have_ports(c, 2 * static_cast<size_t>(c.opt.runs))) return;
  int passed = 0;
  for (int run = 0; run < c.opt.runs; run++) passed += two_groups_run(c, run);
  report_runs(c, passed);
}

}  // namespace moe_ep_test
