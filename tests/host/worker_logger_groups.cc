// worker_logger_groups.cc: loggers that free another group's hook and
// handle (a garbage collector running in them), each inside an entry on
// its own group on a thread of its own, or inside group_create. Such a free must not wait for the
// other group's lock: two threads, each holding the lock the other would
// wait for, would never return. The freed objects are gone at once, and
// their freeing is finished on their own group (by its lock holder, its
// next entry, or its group_destroy), never by the freeing thread later.
#include <chrono>
#include <condition_variable>
#include <functional>
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

// Named points the two threads wait for, each wait bounded.
class Points {
 public:
  void reach(int bit) {
    std::lock_guard<std::mutex> l(m_);
    reached_ |= 1 << bit;
    cv_.notify_all();
  }
  bool await(int bit) {
    std::unique_lock<std::mutex> l(m_);
    return cv_.wait_for(l, std::chrono::seconds(30), [&] { return (reached_ >> bit) & 1; });
  }
  void reset() {
    std::lock_guard<std::mutex> l(m_);
    reached_ = 0;
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  int reached_ = 0;
};

Points g_points;
bool g_missed = false;  // a wait for a point ran out
const moe_ep_plugin_v1_t* g_api = nullptr;
// This thread's logger action, run once, on the first message containing
// tl_trigger (the set_num_sms refusal unless a round says otherwise).
thread_local std::function<void()> tl_action;
thread_local const char* tl_trigger = "set_num_sms";

void acting_logger(void*, int, const char* message) {
  if (!tl_action || std::string(message).find(tl_trigger) == std::string::npos) return;
  std::function<void()> act;
  act.swap(tl_action);
  act();
}

void await_point(int bit) {
  if (!g_points.await(bit)) g_missed = true;
}

// Each twice: the second free of an object already taken is a no-op.
void free_victims(const Victims& v) {
  for (int i = 0; i < 2; i++) {
    g_api->hook_free(v.hook);
    g_api->handle_free(v.handle);
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

// An entry on c's group whose logger runs `action` (set_num_sms(-5),
// refused while the group's lock is held).
void refuse_acting(Ctx& c, std::function<void()> action, const std::string& who) {
  tl_action = std::move(action);
  expect_status(c, 0, who + " set_num_sms(-5) under an acting logger",
                c.api->set_num_sms(c.group, -5), MOE_EP_ERR_INVALID_ARGUMENT, "set_num_sms");
  tl_action = nullptr;
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

// Both loggers inside their entries at once, each freeing the other
// group's objects.
void crossed_frees(Ctx& a, Ctx& b, const moe_ep_oracle::Problem& p) {
  LlCall pending_a(a, p, 81), spare_a(a, p, 82);
  LlCall pending_b(b, p, 83), spare_b(b, p, 84);
  Victims va, vb;
  if (!make_victims(a, pending_a, spare_a, 81, va) || !make_victims(b, pending_b, spare_b, 83, vb))
    return;
  g_points.reset();
  auto meet_then_free = [](int mine, int theirs, Victims v) {
    return [=] {
      g_points.reach(mine);
      await_point(theirs);
      free_victims(v);
    };
  };
  std::thread second(refuse_acting, std::ref(b), meet_then_free(1, 0, va), "second thread:");
  refuse_acting(a, meet_then_free(0, 1, vb), "first thread:");
  second.join();
  expect_freed(a, p, va, 85, "first group:");
  expect_freed(b, p, vb, 88, "second group:");
}

// The second thread holds b's lock while the first thread's logger frees
// b's objects (queued on b, finished by the second thread as it lets b's
// lock go), then destroys b while the first thread is still inside its
// entry, which then returns without touching b (under ASan a leak, or a
// use of the freed group, fails the run).
void free_then_destroy(Ctx& a, Ctx& b, const moe_ep_oracle::Problem& p) {
  Victims vb;
  {
    LlCall pending_b(b, p, 91), spare_b(b, p, 92);
    if (!make_victims(b, pending_b, spare_b, 91, vb)) return;
    g_points.reset();
    enum { kHeld, kFreed, kDestroyed };
    auto hold = [] {
      g_points.reach(kHeld);
      await_point(kFreed);
    };
    auto free_and_wait = [vb] {
      await_point(kHeld);
      free_victims(vb);
      g_points.reach(kFreed);
      await_point(kDestroyed);
    };
    std::thread second([&] {
      refuse_acting(b, hold, "second thread:");
      // pending_b's buffers outlive b: its hook never receives into them.
      expect_status(b, 0, "second group's group_destroy with frees queued on it",
                    b.api->group_destroy(b.group), MOE_EP_OK);
      b.group = nullptr;
      g_points.reach(kDestroyed);
    });
    refuse_acting(a, free_and_wait, "first thread:");
    second.join();
  }
  ll_roundtrip(a, p, 95, false);
}

// The second thread holds b's lock (its logger waits inside an entry on b)
// while the first thread's logger, inside group_create of a third group on
// `port`, frees b's objects. group_create holds no group's lock, but its
// logger is inside the library all the same: a free that waited for b's
// lock would wait for the second thread, which waits for that free (30 s,
// then g_missed).
void free_inside_create(Ctx& a, Ctx& b, const moe_ep_oracle::Problem& p, int port) {
  LlCall pending_b(b, p, 101), spare_b(b, p, 102);
  Victims vb;
  if (!make_victims(b, pending_b, spare_b, 101, vb)) return;
  g_points.reset();
  enum { kHeld, kFreed };
  std::thread second(refuse_acting, std::ref(b),
                     [] {
                       g_points.reach(kHeld);
                       await_point(kFreed);
                     },
                     "second thread:");
  await_point(kHeld);
  bool ran = false;
  tl_trigger = "setup: the bootstrap";  // group_create's first line, at debug
  tl_action = [&ran, vb] {
    ran = true;
    free_victims(vb);
    g_points.reach(kFreed);
  };
  setenv("MOE_EP_LOG_LEVEL", "debug", 1);  // the third group's lines reach the logger
  moe_ep_group_t* third = create_group_on_port(a, port);
  unsetenv("MOE_EP_LOG_LEVEL");
  tl_action = nullptr;
  tl_trigger = "set_num_sms";
  if (!ran) g_points.reach(kFreed);  // the second thread need not wait out its bound
  second.join();
  a.checks++;
  if (!ran) fail(a, 0, "logger inside group_create", "group_create logged no setup line");
  if (third != nullptr) {
    expect_status(a, 0, "third group's group_destroy", a.api->group_destroy(third), MOE_EP_OK);
  }
  expect_freed(b, p, vb, 103, "second group, its objects freed inside group_create:");
}

}  // namespace

void check_logger_across_groups(Ctx& c) {
  c.checks++;
  g_api = c.api;
  const auto& layer = c.opt.layers[0];
  auto p = problem_for(c, layer.first, layer.second, moe_ep_oracle::Generator::kUniform);
  if (c.opt.ports.size() < 4) {
    fail(c, 0, "logger across groups", "needs four --ports for the other groups");
    return;
  }
  expect_status(c, 0, "set_logger(acting)", c.api->set_logger(acting_logger, nullptr), MOE_EP_OK);
  for (int round = 0; round < 3; round++) {
    Ctx other = c;
    other.failures = 0;
    other.checks = 0;
    other.group = create_group_on_port(c, c.opt.ports[round]);
    if (other.group == nullptr) break;
    if (round == 0) {
      crossed_frees(c, other, p);
    } else if (round == 1) {
      free_then_destroy(c, other, p);
    } else {
      free_inside_create(c, other, p, c.opt.ports[3]);
    }
    if (other.group != nullptr) {
      expect_status(c, 0, "other group's group_destroy", c.api->group_destroy(other.group),
                    MOE_EP_OK);
    }
    c.failures += other.failures;
    c.checks += other.checks;
  }
  expect_status(c, 0, "set_logger(NULL)", c.api->set_logger(nullptr, nullptr), MOE_EP_OK);
  c.checks++;
  if (g_missed) fail(c, 0, "logger across groups", "a thread waited 30 s for the other");
}

}  // namespace moe_ep_test
