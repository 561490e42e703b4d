// worker_logger.cc: set_logger delivers the library's messages. Installed
// before group_create with log_level: debug in the config, the logger must
// receive the group's INFO line ("formed") and, for a refused call, the
// DEBUG line carrying last_error's sentence (before the entry names its
// rank in front), each with its level; after
// set_logger(NULL) messages go to stderr again and the logger gets none.
// A logger that calls an entry on the group whose entry is logging gets
// INVALID_ARGUMENT at once (the group's lock is held: it would wait for
// ever), and the logging entry's last_error is left as it was; a hook and
// a handle it frees there (a garbage collector running in a Python
// logger) are freed once that entry lets the lock go: the hook's receive
// is abandoned and its buffer set is free again.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "tests/host/ll_call.h"
#include "tests/host/worker_common.h"

namespace moe_ep_test {
namespace {

struct Message {
  int level;
  std::string text;
};

// The library may log from its own threads: every access under the lock.
std::mutex g_lock;
std::vector<Message> g_messages;
int g_user_tag = 0;  // the `user` pointer the logger must get back

void test_logger(void* user, int level, const char* message) {
  std::lock_guard<std::mutex> l(g_lock);
  if (user != &g_user_tag) {
    g_messages.push_back({-1, "logger called with user pointer not the one installed"});
    return;
  }
  g_messages.push_back({level, message ? message : "(null)"});
}

// The first message containing `needle` (level -2 when there is none).
Message find_message(const std::string& needle) {
  std::lock_guard<std::mutex> l(g_lock);
  for (const Message& m : g_messages)
    if (m.text.find(needle) != std::string::npos) return m;
  return {-2, ""};
}

size_t message_count() {
  std::lock_guard<std::mutex> l(g_lock);
  return g_messages.size();
}

void expect_delivered(Ctx& c, const std::string& what, const std::string& needle, int level) {
  c.checks++;
  Message m = find_message(needle);
  if (m.level == -2) {
    fail(c, 0, what, "the logger got no message containing \"" + needle + "\" (" +
                         std::to_string(message_count()) + " messages in all)");
  } else if (m.level != level) {
    fail(c, 0, what, "message \"" + m.text + "\" came with level " + std::to_string(m.level) +
                         ", expected " + std::to_string(level));
  }
}

// Runs `call` with stderr sent to a temporary file; returns what it wrote.
template <typename F>
std::string capture_stderr(F call) {
  char path[] = "/tmp/moe_ep_logger_XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return "(mkstemp failed)";
  std::fflush(stderr);
  int saved = dup(2);
  dup2(fd, 2);
  call();
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  std::string text;
  char buf[512];
  ssize_t n;
  lseek(fd, 0, SEEK_SET);
  while ((n = read(fd, buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(n));
  close(fd);
  unlink(path);
  return text;
}

// What a logger that calls back into the library saw (reentrant_logger).
struct Reentry {
  Ctx* c = nullptr;
  moe_ep_hook_t* hook = nullptr;      // freed from inside the logger
  moe_ep_handle_t* handle = nullptr;  // likewise
  bool called = false;
  moe_ep_status_t status = MOE_EP_OK;
  std::string error;
} g_reentry;

void reentrant_logger(void*, int, const char* message) {
  if (g_reentry.called || std::string(message).find("set_num_sms") == std::string::npos) return;
  g_reentry.called = true;
  const moe_ep_plugin_v1_t* api = g_reentry.c->api;
  g_reentry.status = api->group_poll_error(g_reentry.c->group);
  g_reentry.error = api->last_error();
  // Each twice: the second free of an object already queued must be a
  // no-op, as a second free is outside the logger.
  for (int i = 0; i < 2; i++) {
    api->hook_free(g_reentry.hook);
    api->handle_free(g_reentry.handle);
  }
}

void check_reentrant_logger(Ctx& c) {
  g_reentry.c = &c;
  auto p = problem_for(c, c.opt.layers[0].first, c.opt.layers[0].second,
                       moe_ep_oracle::Generator::kUniform);
  LlCall pending(c, p, 61), spare(c, p, 62);
  if (pending.prepare() != MOE_EP_OK || spare.prepare() != MOE_EP_OK) return;
  if (!expect_status(c, 61, "deferred dispatch", pending.dispatch(MOE_EP_FLAG_DEFER_RECV,
                                                                  &g_reentry.hook),
                     MOE_EP_OK)) {
    return;
  }
  g_reentry.handle = spare.release_handle();
  expect_status(c, 0, "set_logger(reentrant)", c.api->set_logger(reentrant_logger, nullptr),
                MOE_EP_OK);
  expect_status(c, 0, "set_num_sms(-5) under a logger that calls group_poll_error",
                c.api->set_num_sms(c.group, -5), MOE_EP_ERR_INVALID_ARGUMENT, "set_num_sms");
  c.checks++;
  if (std::string(c.api->last_error()).find("called from inside") != std::string::npos)
    fail(c, 0, "reentrant logger", std::string("the logger's own call replaced the entry's "
                                               "last_error: \"") + c.api->last_error() + "\"");
  c.checks++;
  if (!g_reentry.called) {
    fail(c, 0, "reentrant logger", "the logger never saw the set_num_sms refusal");
  } else if (g_reentry.status != MOE_EP_ERR_INVALID_ARGUMENT ||
             g_reentry.error.find("called from inside another entry") == std::string::npos) {
    fail(c, 0, "reentrant logger",
         std::string("group_poll_error from inside the logger returned ") +
             c.api->status_string(g_reentry.status) + " \"" + g_reentry.error +
             "\", want MOE_EP_ERR_INVALID_ARGUMENT saying it was called from inside another "
             "entry");
  }
  expect_status(c, 0, "set_logger(NULL)", c.api->set_logger(nullptr, nullptr), MOE_EP_OK);
  // Both frees were done when set_num_sms let the lock go: the handle is
  // gone, and the hook's buffer set takes the next operations.
  moe_ep_dispatch_params_t dp = MOE_EP_INIT(moe_ep_dispatch_params_t);
  expect_status(c, 62, "dispatch on the handle the logger freed",
                c.api->dispatch(c.group, g_reentry.handle, &dp, nullptr),
                MOE_EP_ERR_INVALID_ARGUMENT, "handle");
  ll_roundtrip(c, p, 63, false);
  ll_roundtrip(c, p, 64, false);
}

}  // namespace

void install_test_logger(Ctx& c) {
  c.opt.log_level = "debug";  // config_yaml is built after this
  expect_status(c, 0, "set_logger", c.api->set_logger(test_logger, &g_user_tag), MOE_EP_OK);
}

void run_logger(Ctx& c) {
  const std::string me = "rank " + std::to_string(c.rank);
  expect_delivered(c, me + ": group_create's INFO line",
                   me + "/" + std::to_string(c.world) + " formed", MOE_EP_LOG_INFO);
  // A refused call: last_error's sentence reaches the logger at DEBUG, as
  // the failing check made it (the entry then names this rank in front).
  const std::string named = me + ": ";
  auto as_made = [&named](std::string s) {
    return s.rfind(named, 0) == 0 ? s.substr(named.size()) : s;
  };
  expect_status(c, 0, "set_num_sms(-3)", c.api->set_num_sms(c.group, -3),
                MOE_EP_ERR_INVALID_ARGUMENT, (named + "set_num_sms").c_str());
  const std::string sentence = as_made(c.api->last_error());
  expect_delivered(c, "a refused call's DEBUG line", sentence, MOE_EP_LOG_DEBUG);
  {
    std::lock_guard<std::mutex> l(g_lock);
    for (const Message& m : g_messages) {
      c.checks++;
      if (m.level < MOE_EP_LOG_ERROR || m.level > MOE_EP_LOG_TRACE || m.text.empty())
        fail(c, 0, "logger message", "level " + std::to_string(m.level) + " text \"" + m.text + "\"");
    }
  }
  // NULL restores stderr: the next refusal is written there, not to us.
  expect_status(c, 0, "set_logger(NULL)", c.api->set_logger(nullptr, nullptr), MOE_EP_OK);
  const size_t before = message_count();
  const std::string err = capture_stderr([&] { c.api->set_num_sms(c.group, -4); });
  c.checks++;
  if (message_count() != before)
    fail(c, 0, "after set_logger(NULL)", "the removed logger still got a message");
  c.checks++;
  if (err.find(as_made(c.api->last_error())) == std::string::npos)
    fail(c, 0, "after set_logger(NULL)",
         "stderr did not get the refusal \"" + std::string(c.api->last_error()) + "\"; it got \"" +
             err + "\"");
  check_reentrant_logger(c);
  check_logger_across_groups(c);
  // The group is still fine after all that.
  auto p = problem_for(c, c.opt.layers[0].first, c.opt.layers[0].second,
                       moe_ep_oracle::Generator::kUniform);
  ll_roundtrip(c, p, 71, false);
}

}  // namespace moe_ep_test
