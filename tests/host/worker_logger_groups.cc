// worker_logger_groups.cc: a logger that frees another group's hook and
// handle (a garbage collector running in it), on two threads at once, each
// inside an entry on its own group. A free there must not wait for the
// other group's lock: each thread holds the lock the other would wait for,
// and neither entry would ever return. Both frees are done by the time the
// entries have returned, and both groups go on working.
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "tests/host/ll_call.h"
#include "tests/host/worker_common.h"

namespace moe_ep_test {
namespace {

// What one thread's logger frees: the other group's objects.
struct Victims {
  moe_ep_hook_t* hook = nullptr;
  moe_ep_handle_t* handle = nullptr;
};

struct Rendezvous {
  std::mutex m;
  std::condition_variable cv;
  int inside = 0;
  bool timed_out = false;
} g_meet;

const moe_ep_plugin_v1_t* g_api = nullptr;
thread_local Victims* tl_victims = nullptr;  // armed on the two test threads only

// Waits (bounded) until both threads are inside their entries' logger
// calls, each holding its own group's lock, then frees the other group's
// objects, each twice (the second free of a queued object is a no-op).
void cross_logger(void*, int, const char* message) {
  Victims* v = tl_victims;
  if (v == nullptr || std::string(message).find("set_num_sms") == std::string::npos) return;
  tl_victims = nullptr;
  {
    std::unique_lock<std::mutex> l(g_meet.m);
    g_meet.inside++;
    g_meet.cv.notify_all();
    if (!g_meet.cv.wait_for(l, std::chrono::seconds(30), [] { return g_meet.inside >= 2; }))
      g_meet.timed_out = true;
  }
  for (int i = 0; i < 2; i++) {
    g_api->hook_free(v->hook);
    g_api->handle_free(v->handle);
  }
}

// A pending hook and a spare handle on c's group, for the other thread's
// logger to free.
bool make_victims(Ctx& c, LlCall& pending, LlCall& spare, uint64_t seed, Victims& v) {
  if (pending.prepare() != MOE_EP_OK || spare.prepare() != MOE_EP_OK) return false;
  if (!expect_status(c, seed, "deferred dispatch (its hook freed by the other thread's logger)",
                     pending.dispatch(MOE_EP_FLAG_DEFER_RECV, &v.hook), MOE_EP_OK)) {
    return false;
  }
  v.handle = spare.release_handle();
  return true;
}

void refuse_under_logger(Ctx& c, Victims* free_these, const std::string& who) {
  tl_victims = free_these;
  expect_status(c, 0, who + " set_num_sms(-5) under a logger freeing the other group's objects",
                c.api->set_num_sms(c.group, -5), MOE_EP_ERR_INVALID_ARGUMENT, "set_num_sms");
  tl_victims = nullptr;
}

// The freed handle is refused, and the freed hook's buffer set takes the
// next operations.
void expect_freed(Ctx& c, const moe_ep_oracle::Problem& p, const Victims& v, uint64_t seed,
                  const std::string& who) {
  moe_ep_dispatch_params_t dp = MOE_EP_INIT(moe_ep_dispatch_params_t);
  expect_status(c, seed, who + " dispatch on the handle the other thread's logger freed",
                c.api->dispatch(c.group, v.handle, &dp, nullptr), MOE_EP_ERR_INVALID_ARGUMENT,
                "handle");
  ll_roundtrip(c, p, seed + 1, false);
  ll_roundtrip(c, p, seed + 2, false);
}

}  // namespace

void check_logger_across_groups(Ctx& c) {
  c.checks++;
  if (c.opt.ports.empty()) {
    fail(c, 0, "logger across groups", "needs one --ports for the second group");
    return;
  }
  Ctx other = c;
  other.failures = 0;
  other.checks = 0;
  other.group = create_group_on_port(c, c.opt.ports[0]);
  if (other.group == nullptr) return;
  g_api = c.api;
  const auto& layer = c.opt.layers[0];
  auto p = problem_for(c, layer.first, layer.second, moe_ep_oracle::Generator::kUniform);
  {
    LlCall pending_a(c, p, 81), spare_a(c, p, 82);
    LlCall pending_b(other, p, 83), spare_b(other, p, 84);
    Victims a, b;  // a: this group's objects, b: the other group's
    if (make_victims(c, pending_a, spare_a, 81, a) && make_victims(other, pending_b, spare_b, 83, b)) {
      expect_status(c, 0, "set_logger(cross)", c.api->set_logger(cross_logger, nullptr), MOE_EP_OK);
      std::thread second(refuse_under_logger, std::ref(other), &a, "second thread:");
      refuse_under_logger(c, &b, "first thread:");
      second.join();
      expect_status(c, 0, "set_logger(NULL)", c.api->set_logger(nullptr, nullptr), MOE_EP_OK);
      c.checks++;
      if (g_meet.timed_out)
        fail(c, 0, "logger across groups", "the two loggers did not meet within 30 s");
      expect_freed(c, p, a, 85, "first group:");
      expect_freed(other, p, b, 88, "second group:");
    }
  }
  expect_status(c, 0, "second group's group_destroy", c.api->group_destroy(other.group),
                MOE_EP_OK);
  c.failures += other.failures;
  c.checks += other.checks;
}

}  // namespace moe_ep_test
