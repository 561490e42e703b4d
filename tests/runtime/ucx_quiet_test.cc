// ucx_quiet_test.cc: UCX's warning for an active message whose id no
// handler took (what anyone who reaches a worker can cause, once per
// message) goes to the library's logger when the library progresses the
// worker (mep_ucx_progress) or within its entries (mep_ucx_quiet_enter /
// leave), and is printed by UCX as before when the progress is not the
// library's (the engine's own UCX use). Two real UCX
// workers in this process; the receiver handles one id, the sender sends
// another.
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <ucp/api/ucp.h>
#include <ucs/debug/log_def.h>

extern "C" {
#include "runtime/log.h"
#include "runtime/ucx_quiet.h"
}

namespace {

constexpr unsigned kHandled = 1, kStranger = 7;

ucs_status_t Ignore(void *, const void *, size_t, void *, size_t, const ucp_am_recv_param_t *) {
  return UCS_OK;
}

std::vector<std::string> g_lines;
void Record(void *, int, const char *message) { g_lines.emplace_back(message); }

// UCX lines seen by a handler of the test's own, pushed after the
// library's (so called first): it counts and passes every line on.
int g_ucx_lines = 0;
ucs_log_func_rc_t Count(const char *, unsigned, const char *, ucs_log_level_t,
                        const ucs_log_component_config_t *, const char *message, va_list) {
  g_ucx_lines += std::string(message).find("Active Message") != std::string::npos;
  return UCS_LOG_FUNC_RC_CONTINUE;
}

// Everything written to stdout and stderr while fn runs.
template <typename Fn>
std::string Captured(Fn fn) {
  fflush(stdout);
  fflush(stderr);
  char path[] = "/tmp/ucx_quiet_test.XXXXXX";
  int fd = mkstemp(path);
  int out = dup(1), err = dup(2);
  dup2(fd, 1);
  dup2(fd, 2);
  fn();
  fflush(stdout);
  fflush(stderr);
  dup2(out, 1);
  dup2(err, 2);
  close(out);
  close(err);
  std::string text;
  char buf[4096];
  lseek(fd, 0, SEEK_SET);
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) text.append(buf, (size_t)n);
  close(fd);
  unlink(path);
  return text;
}

class UcxQuiet : public ::testing::Test {
 protected:
  void SetUp() override {
    ucp_params_t cp = {};
    cp.field_mask = UCP_PARAM_FIELD_FEATURES;
    cp.features = UCP_FEATURE_AM;
    ASSERT_EQ(ucp_init(&cp, nullptr, &ctx_a_), UCS_OK);
    ASSERT_EQ(ucp_init(&cp, nullptr, &ctx_b_), UCS_OK);
    ucp_worker_params_t wp = {};
    ASSERT_EQ(ucp_worker_create(ctx_a_, &wp, &sender_), UCS_OK);
    ASSERT_EQ(ucp_worker_create(ctx_b_, &wp, &receiver_), UCS_OK);
    ucp_am_handler_param_t ap = {};
    ap.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB;
    ap.id = kHandled;
    ap.cb = Ignore;
    ASSERT_EQ(ucp_worker_set_am_recv_handler(receiver_, &ap), UCS_OK);
    ucp_address_t *addr = nullptr;
    size_t len = 0;
    ASSERT_EQ(ucp_worker_get_address(receiver_, &addr, &len), UCS_OK);
    ucp_ep_params_t ep = {};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    ep.address = addr;
    ASSERT_EQ(ucp_ep_create(sender_, &ep, &ep_), UCS_OK);
    ucp_worker_release_address(receiver_, addr);
  }
  void TearDown() override {
    if (ep_ != nullptr) {
      ucp_request_param_t rp = {};
      rp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      rp.flags = UCP_EP_CLOSE_FLAG_FORCE;
      void *r = ucp_ep_close_nbx(ep_, &rp);
      if (UCS_PTR_IS_PTR(r)) ucp_request_free(r);
    }
    if (sender_ != nullptr) ucp_worker_destroy(sender_);
    if (receiver_ != nullptr) ucp_worker_destroy(receiver_);
    if (ctx_a_ != nullptr) ucp_cleanup(ctx_a_);
    if (ctx_b_ != nullptr) ucp_cleanup(ctx_b_);
  }
  // Sends one message of the unhandled id, then progresses both workers
  // (the receiver by `progress`) until `done()` or 20 s.
  template <typename Progress, typename Done>
  void SendAndProgress(Progress progress, Done done) {
    ucp_request_param_t rp = {};
    void *r = ucp_am_send_nbx(ep_, kStranger, "x", 1, nullptr, 0, &rp);
    ASSERT_FALSE(UCS_PTR_IS_ERR(r));
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!done() && std::chrono::steady_clock::now() < end) {
      ucp_worker_progress(sender_);
      progress(receiver_);
    }
    while (UCS_PTR_IS_PTR(r) && ucp_request_check_status(r) == UCS_INPROGRESS &&
           std::chrono::steady_clock::now() < end) {
      ucp_worker_progress(sender_);
    }
    if (UCS_PTR_IS_PTR(r)) ucp_request_free(r);
  }

  ucp_context_h ctx_a_ = nullptr, ctx_b_ = nullptr;
  ucp_worker_h sender_ = nullptr, receiver_ = nullptr;
  ucp_ep_h ep_ = nullptr;
};

TEST_F(UcxQuiet, LibraryProgressSendsUcxLinesToTheLogger) {
  mep_log_set_logger(Record, nullptr);
  mep_log_thread_level(MOE_EP_LOG_DEBUG);
  const unsigned long long before = mep_ucx_lines_taken();
  const std::string printed = Captured([&] {
    SendAndProgress([](ucp_worker_h w) { mep_ucx_progress(w); },
                    [&] { return mep_ucx_lines_taken() > before; });
  });
  mep_log_set_logger(nullptr, nullptr);
  mep_log_thread_level(-1);
  EXPECT_GT(mep_ucx_lines_taken(), before) << "UCX's warning never reached the library";
  EXPECT_EQ(printed.find("Active Message"), std::string::npos) << printed;
  bool logged = false;
  for (const std::string &line : g_lines) {
    logged |= line.find("Active Message was received with id : 7") != std::string::npos;
  }
  EXPECT_TRUE(logged) << "the logger got " << g_lines.size() << " lines";
}

// Inside the library's entries and on its threads (mep_ucx_quiet_enter /
// leave), every UCX call's lines are the library's, not only progress's.
TEST_F(UcxQuiet, LinesBetweenEnterAndLeaveGoToTheLogger) {
  mep_log_set_logger(Record, nullptr);  // the library's own lines are not printed either
  const unsigned long long before = mep_ucx_lines_taken();
  const std::string printed = Captured([&] {
    mep_ucx_quiet_enter();
    mep_ucx_quiet_enter();  // nested, as an entry inside group_create's logger would be
    mep_ucx_quiet_leave();
    SendAndProgress([](ucp_worker_h w) { ucp_worker_progress(w); },
                    [&] { return mep_ucx_lines_taken() > before; });
    mep_ucx_quiet_leave();
  });
  mep_log_set_logger(nullptr, nullptr);
  EXPECT_GT(mep_ucx_lines_taken(), before) << "UCX's warning never reached the library";
  EXPECT_EQ(printed.find("Active Message"), std::string::npos) << printed;
}

TEST_F(UcxQuiet, OtherProgressKeepsUcxsOwnPrinting) {
  ucp_worker_h other = receiver_;
  mep_ucx_progress(other);  // the library's handler is installed (once per process)
  ucs_log_push_handler(Count);
  const unsigned long long before = mep_ucx_lines_taken();
  const int seen = g_ucx_lines;
  std::string printed;
  printed = Captured([&] {
    SendAndProgress([](ucp_worker_h w) { ucp_worker_progress(w); },
                    [&] { return g_ucx_lines > seen; });
  });
  ucs_log_pop_handler();
  EXPECT_GT(g_ucx_lines, seen) << "UCX's warning never came";
  EXPECT_EQ(mep_ucx_lines_taken(), before);
  EXPECT_NE(printed.find("Active Message was received with id : 7"), std::string::npos)
      << printed;
}

}  // namespace
