// log_test.cc: the logging contract across threads: set_logger returns only
// after every running callback has returned (so the engine may free `user`),
// does not wait for itself when called from inside a callback, and each
// thread logs at the level of the group it works for.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/log.h"

namespace {

// A logger whose callback holds until released, recording what it saw.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool entered = false, released = false, returned = false;
  std::vector<std::string> lines;
};

void gate_logger(void* user, int level, const char* message) {
  Gate* g = static_cast<Gate*>(user);
  std::unique_lock<std::mutex> l(g->mu);
  g->lines.push_back(std::to_string(level) + " " + message);
  g->entered = true;
  g->cv.notify_all();
  g->cv.wait(l, [g] { return g->released; });
  g->returned = true;
}

TEST(Log, SetLoggerWaitsForRunningCallbacks) {
  Gate gate;
  mep_log_set_logger(gate_logger, &gate);
  std::thread emitter([] { MEP_LOG_ERROR("test", "held message %d", 7); });
  {
    std::unique_lock<std::mutex> l(gate.mu);
    gate.cv.wait(l, [&] { return gate.entered; });
  }
  // The callback is running now; set_logger must not return before it does.
  std::atomic<bool> set_returned{false};
  bool returned_seen_by_setter = false;
  std::thread setter([&] {
    mep_log_set_logger(nullptr, nullptr);
    std::lock_guard<std::mutex> l(gate.mu);
    returned_seen_by_setter = gate.returned;
    set_returned = true;
  });
  // Whatever the scheduling, a correct set_logger is still blocked here.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(set_returned.load()) << "set_logger returned while a callback was running";
  {
    std::lock_guard<std::mutex> l(gate.mu);
    gate.released = true;
  }
  gate.cv.notify_all();
  setter.join();
  emitter.join();
  EXPECT_TRUE(returned_seen_by_setter) << "set_logger returned before the callback did";
  ASSERT_EQ(gate.lines.size(), 1u);
  EXPECT_NE(gate.lines[0].find("held message 7"), std::string::npos) << gate.lines[0];
  EXPECT_EQ(gate.lines[0].rfind("1 ", 0), 0u) << gate.lines[0];  // MOE_EP_LOG_ERROR
}

// A logger that records every line and holds only the calls whose message
// contains "hold", until released.
struct HoldGate {
  std::mutex mu;
  std::condition_variable cv;
  bool held = false, released = false;
  std::vector<std::string> lines;
};

void hold_gate_logger(void* user, int, const char* message) {
  HoldGate* g = static_cast<HoldGate*>(user);
  std::unique_lock<std::mutex> l(g->mu);
  g->lines.push_back(message);
  if (std::string(message).find("hold") == std::string::npos) return;
  g->held = true;
  g->cv.notify_all();
  g->cv.wait(l, [g] { return g->released; });
}

void wait_held(HoldGate& g) {
  std::unique_lock<std::mutex> l(g.mu);
  g.cv.wait(l, [&] { return g.held; });
}

void release(HoldGate& g) {
  {
    std::lock_guard<std::mutex> l(g.mu);
    g.released = true;
  }
  g.cv.notify_all();
}

// set_logger waits for the replaced logger's calls only: a call that began
// on the new logger after the swap, and still runs, does not hold it (else
// steady logging through the new logger could keep it waiting for ever).
TEST(Log, SetLoggerWaitsOnlyForTheReplacedLoggersCalls) {
  HoldGate old_gate, new_gate;
  mep_log_set_logger(hold_gate_logger, &old_gate);
  std::thread old_call([] { MEP_LOG_ERROR("test", "hold: through the old logger"); });
  wait_held(old_gate);
  std::mutex mu;
  std::condition_variable cv;
  bool set_returned = false;
  std::thread setter([&] {
    mep_log_set_logger(hold_gate_logger, &new_gate);
    std::lock_guard<std::mutex> l(mu);
    set_returned = true;
    cv.notify_all();
  });
  // Probes until one reaches the new logger (the swap is done), then a call
  // held inside it.
  for (bool swapped = false; !swapped;) {
    MEP_LOG_ERROR("test", "probe");
    std::lock_guard<std::mutex> l(new_gate.mu);
    swapped = !new_gate.lines.empty();
  }
  std::thread new_call([] { MEP_LOG_ERROR("test", "hold: through the new logger"); });
  wait_held(new_gate);
  release(old_gate);
  old_call.join();
  bool returned;
  {
    // Bounded only so that the old behaviour fails instead of hanging: a
    // correct set_logger returns as soon as old_call has.
    std::unique_lock<std::mutex> l(mu);
    returned = cv.wait_for(l, std::chrono::seconds(60), [&] { return set_returned; });
  }
  EXPECT_TRUE(returned) << "set_logger still waits, for a call of the logger it installed";
  release(new_gate);
  new_call.join();
  setter.join();
  mep_log_set_logger(nullptr, nullptr);
}

int self_replacing_calls = 0;
void self_replacing_logger(void*, int, const char*) {
  self_replacing_calls++;
  mep_log_set_logger(nullptr, nullptr);  // must not wait for itself
}

TEST(Log, SetLoggerFromInsideItsCallbackDoesNotWaitForItself) {
  self_replacing_calls = 0;
  mep_log_set_logger(self_replacing_logger, nullptr);
  MEP_LOG_ERROR("test", "first");
  MEP_LOG_ERROR("test", "second goes to stderr");
  EXPECT_EQ(self_replacing_calls, 1);
}

struct Lines {
  std::mutex mu;
  std::vector<std::string> v;
};
void collect(void* user, int, const char* message) {
  Lines* l = static_cast<Lines*>(user);
  std::lock_guard<std::mutex> g(l->mu);
  l->v.push_back(message);
}

TEST(Log, EachThreadLogsAtItsGroupsLevel) {
  if (getenv("MOE_EP_LOG_LEVEL") != nullptr) GTEST_SKIP() << "MOE_EP_LOG_LEVEL overrides groups";
  Lines lines;
  mep_log_set_logger(collect, &lines);
  // Two threads working for groups with different levels, interleaved many
  // times: neither may change what the other logs.
  auto worker = [](int level, const char* name) {
    for (int i = 0; i < 200; i++) {
      mep_log_thread_level(level);
      MEP_LOG_DEBUG("test", "%s debug %d", name, i);
      MEP_LOG_WARN("test", "%s warn %d", name, i);
      mep_log_thread_level(-1);
      MEP_LOG_INFO("test", "%s outside %d", name, i);  // default: warn
    }
  };
  std::thread quiet(worker, MOE_EP_LOG_ERROR, "quiet");
  std::thread chatty(worker, MOE_EP_LOG_DEBUG, "chatty");
  quiet.join();
  chatty.join();
  mep_log_set_logger(nullptr, nullptr);
  int chatty_debug = 0, chatty_warn = 0, quiet_any = 0, outside = 0;
  for (const std::string& s : lines.v) {
    chatty_debug += s.find("chatty debug") != std::string::npos;
    chatty_warn += s.find("chatty warn") != std::string::npos;
    quiet_any += s.find("quiet") != std::string::npos;
    outside += s.find("outside") != std::string::npos;
  }
  EXPECT_EQ(chatty_debug, 200);
  EXPECT_EQ(chatty_warn, 200);
  EXPECT_EQ(quiet_any, 0);
  EXPECT_EQ(outside, 0);
}

}  // namespace
