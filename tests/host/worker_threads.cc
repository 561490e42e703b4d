// worker_threads.cc: an engine's two-batch overlap with a second host
// thread, repeated: micro-batches A and B interleave; the second thread
// runs hooks (and frees them) while this thread dispatches and combines the
// other micro-batch; handles are freed from either thread after their
// combine. Every step is checked against the oracle, and the run is meant
// for ThreadSanitizer as much as for values.
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "tests/host/ll_call.h"
#include "tests/host/worker_common.h"

namespace moe_ep_test {
namespace {

// The engine's second thread: runs posted work in order. Results cross back
// only through drain(), which orders them before the caller reads them.
class SecondThread {
 public:
  SecondThread() : t_([this] { loop(); }) {}
  ~SecondThread() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    t_.join();
  }
  void post(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> l(mu_);
      work_.push_back(std::move(fn));
    }
    cv_.notify_all();
  }
  void drain() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [this] { return work_.empty() && !busy_; });
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> l(mu_);
    for (;;) {
      cv_.wait(l, [this] { return stop_ || !work_.empty(); });
      if (work_.empty()) return;
      std::function<void()> fn = std::move(work_.front());
      work_.pop_front();
      busy_ = true;
      l.unlock();
      fn();
      l.lock();
      busy_ = false;
      cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> work_;
  bool busy_ = false, stop_ = false;
  std::thread t_;  // last: starts after the fields it reads
};

// What the second thread saw: a status and that thread's last_error.
struct Outcome {
  moe_ep_status_t st = MOE_EP_ERR_INTERNAL;
  std::string msg = "never ran";
};

// Runs a hook on the calling thread, frees it, and maybe a handle too.
void run_and_free(const moe_ep_plugin_v1_t* api, moe_ep_hook_t* hook, moe_ep_handle_t* handle,
                  Outcome* out) {
  out->st = api->hook_run(hook, nullptr);
  out->msg = api->last_error();
  api->hook_free(hook);
  api->handle_free(handle);  // NULL: nothing
}

bool check(Ctx& c, uint64_t seed, const char* what, const Outcome& o) {
  c.checks++;
  if (o.st == MOE_EP_OK) return true;
  fail(c, seed, what, std::string("status ") + c.api->status_string(o.st) + " on the second thread: " + o.msg);
  return false;
}

// One round. Odd rounds free A's handle on the second thread and B's here;
// even rounds the other way round.
bool overlap_round(Ctx& c, SecondThread& t2, const moe_ep_oracle::Problem& p, uint64_t seed,
                   bool odd) {
  LlCall a(c, p, seed), b(c, p, seed + 1);
  if (a.prepare() != MOE_EP_OK || b.prepare() != MOE_EP_OK) return false;
  const uint32_t kDefer = MOE_EP_FLAG_DEFER_RECV;
  moe_ep_hook_t *ha = nullptr, *hb = nullptr, *hca = nullptr, *hcb = nullptr;
  Outcome ra, rb, rca;
  if (!expect_status(c, seed, "dispatch A", a.dispatch(kDefer, &ha), MOE_EP_OK)) return false;
  // A's receive on the second thread while B's send runs here.
  t2.post([&] { run_and_free(c.api, ha, nullptr, &ra); });
  bool ok = expect_status(c, seed, "dispatch B (A's hook running on the second thread)",
                          b.dispatch(kDefer, &hb), MOE_EP_OK);
  t2.drain();
  if (!check(c, seed, "dispatch hook A", ra) || !ok) return false;
  a.check_dispatch();
  a.make_y();
  // B's receive on the second thread while A's combine sends here.
  t2.post([&] { run_and_free(c.api, hb, nullptr, &rb); });
  ok = expect_status(c, seed, "combine A (B's hook running on the second thread)",
                     a.combine(kDefer, &hca), MOE_EP_OK);
  t2.drain();
  if (!check(c, seed, "dispatch hook B", rb) || !ok) return false;
  b.check_dispatch();
  b.make_y();
  // A's combine receive on the second thread (freeing A's handle there on
  // odd rounds) while B's combine runs here, its hook too.
  moe_ep_handle_t* a_handle = odd ? a.release_handle() : nullptr;
  t2.post([&] { run_and_free(c.api, hca, a_handle, &rca); });
  ok = expect_status(c, seed, "combine B (A's combine hook running on the second thread)",
                     b.combine(kDefer, &hcb), MOE_EP_OK);
  if (ok) {
    ok = expect_status(c, seed, "combine hook B", c.api->hook_run(hcb, nullptr), MOE_EP_OK);
    c.api->hook_free(hcb);
  }
  if (!odd) c.api->handle_free(b.release_handle());
  t2.drain();
  if (!check(c, seed, "combine hook A", rca) || !ok) return false;
  a.check_combine();
  b.check_combine();
  return true;
}

// A handle freed on this thread while the second thread runs its combine
// hook: the hook either ran first (OK, checked) or finds the handle gone
// (INVALID_ARGUMENT, its receive abandoned, which the host backend
// survives). Either way nothing crashes and the next rounds still match the
// oracle. The round keeps the protocol's order: each handle's combine runs
// on its dispatch's buffer set, before the next dispatch there (the raced
// combine's peers still send it; only this rank may skip its receive).
bool free_while_hook_runs(Ctx& c, SecondThread& t2, const moe_ep_oracle::Problem& p,
                          uint64_t seed) {
  LlCall a(c, p, seed), b(c, p, seed + 1);
  if (a.prepare() != MOE_EP_OK || b.prepare() != MOE_EP_OK) return false;
  if (!expect_status(c, seed, "dispatch A (raced round)", a.dispatch(0, nullptr), MOE_EP_OK) ||
      !expect_status(c, seed, "dispatch B (raced round)", b.dispatch(0, nullptr), MOE_EP_OK)) {
    return false;
  }
  a.check_dispatch();
  b.check_dispatch();
  a.make_y();
  b.make_y();
  moe_ep_hook_t* ha = nullptr;
  if (!expect_status(c, seed, "combine A (its handle freed under its hook)",
                     a.combine(MOE_EP_FLAG_DEFER_RECV, &ha), MOE_EP_OK)) {
    return false;
  }
  Outcome r;
  t2.post([&] { run_and_free(c.api, ha, nullptr, &r); });
  c.api->handle_free(a.release_handle());
  t2.drain();
  c.checks++;
  if (r.st == MOE_EP_OK) {
    a.check_combine();
  } else if (!(r.st == MOE_EP_ERR_INVALID_ARGUMENT && r.msg.find("freed") != std::string::npos)) {
    fail(c, seed, "hook_run racing handle_free",
         std::string("status ") + c.api->status_string(r.st) + ": " + r.msg);
    return false;
  }
  if (!expect_status(c, seed, "combine B (raced round)", b.combine(0, nullptr), MOE_EP_OK)) {
    return false;
  }
  b.check_combine();
  return true;
}

// last_error is per thread (moe_ep.h, "Threads"): a refusal on the second
// thread leaves this thread's sentence as it was, and each thread reads its
// own. Both calls are refused before anything is sent (the group stays
// usable, no peer takes part).
void last_error_per_thread(Ctx& c, SecondThread& t2) {
  const moe_ep_status_t mine = c.api->hook_run(nullptr, nullptr);
  const std::string before = c.api->last_error();
  Outcome theirs;
  t2.post([&] {
    moe_ep_handle_t* h = nullptr;
    theirs.st = c.api->prepare(c.group, nullptr, &h);
    theirs.msg = c.api->last_error();
  });
  t2.drain();
  const std::string after = c.api->last_error();
  c.checks += 3;
  if (mine != MOE_EP_ERR_INVALID_ARGUMENT || theirs.st != MOE_EP_ERR_INVALID_ARGUMENT)
    fail(c, 0, "last_error per thread",
         std::string("the two refusals returned ") + c.api->status_string(mine) + " and " +
             c.api->status_string(theirs.st) + ", expected MOE_EP_ERR_INVALID_ARGUMENT");
  if (before == theirs.msg)
    fail(c, 0, "last_error per thread", "both threads read the same sentence: " + before);
  if (after != before)
    fail(c, 0, "last_error per thread",
         "this thread's sentence changed after the second thread's refusal: got \"" + after +
             "\", expected \"" + before + "\"");
}

}  // namespace

void run_threads(Ctx& c) {
  const auto& layer = c.opt.layers.front();
  moe_ep_oracle::Problem p =
      problem_for(c, layer.first, layer.second, moe_ep_oracle::Generator::kUniform);
  SecondThread t2;
  // Abandoning a receive breaks an nccl group by design: host backend only.
  const bool race_frees = c.opt.backend == "host";
  last_error_per_thread(c, t2);
  for (int i = 0; i < c.opt.iterations && c.failures == 0; i++) {
    uint64_t seed = 500 + 2 * static_cast<uint64_t>(i);
    if (race_frees && i % 10 == 5 && !free_while_hook_runs(c, t2, p, seed + 100000)) break;
    if (!overlap_round(c, t2, p, seed, i % 2 == 1)) break;
  }
}

}  // namespace moe_ep_test
