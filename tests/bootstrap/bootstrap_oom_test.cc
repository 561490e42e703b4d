// bootstrap_oom_test.cc: a rank whose bootstrap runs out of memory for a
// message it must send (the test-only seam mep_bs_fail_alloc_after, set in
// one real worker process of two) fails naming itself and the memory, and
// its peer fails naming it too, rather than timing out or being blamed.
// Every wait is bounded by a long timeout that no case meets; what a case
// checks is which rank each sentence names, never how long it took.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/bootstrap/proc_util.h"
#include "tests/common/ports.h"

namespace mep_test {
namespace {

// Groups that must form (and ops that must not time out): far longer than
// any step of a loaded machine.
constexpr int kTimeoutMs = 60000;
// A guard against a hang only.
constexpr int kHangGuardMs = 150000;
constexpr int kStatusNoMemory = 4;
constexpr int kStatusBootstrap = 5;
constexpr int kStatusUcx = 11;

class BootstrapOom : public ::testing::Test {
 protected:
  void SetUp() override {
    const int port = moe_ep_test::free_loopback_port();
    ASSERT_GT(port, 0);
    address_ = "127.0.0.1:" + std::to_string(port);
  }

  std::unique_ptr<Proc> Start(int rank, const std::string &scenario,
                              std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = WorkerArgv(rank, 2, scenario, address_, "tok-oom-of-this-test", kTimeoutMs);
    argv.insert(argv.end(), extra.begin(), extra.end());
    return std::make_unique<Proc>(Spawn("rank " + std::to_string(rank), argv));
  }

  std::string address_;
};

bool Has(const std::string &msg, const std::string &part) {
  return msg.find(part) != std::string::npos;
}

// Rank 0 has no memory for the allgather's result. Rank 0 keeps its
// connection up until rank 1 has ended, so what rank 1 reports is what
// rank 0 told it (the ABORT), not the connection's end.
TEST_F(BootstrapOom, RootWithoutMemoryForTheResultFailsNamingItself) {
  const std::string hold = ::testing::TempDir() + "/oom_hold";
  unlink(hold.c_str());
  auto r0 = Start(0, "allgather",
                  {"--oom_rank=0", "--oom_at=op", "--hold_file=" + hold,
                   "--max_ms=" + std::to_string(kHangGuardMs)});
  auto r1 = Start(1, "allgather");
  WaitOne(r1.get(), NowMs() + kHangGuardMs);
  const int fd = open(hold.c_str(), O_CREAT | O_WRONLY, 0600);
  if (fd >= 0) close(fd);
  WaitOne(r0.get(), NowMs() + kHangGuardMs);

  const std::string want0 =
      "rank 0 had no memory to send the result of allgather #1 to rank 1 (UCS_ERR_NO_MEMORY)";
  auto res0 = r0->Result();
  EXPECT_TRUE(r0->Exited(kStatusUcx)) << r0->Describe();
  EXPECT_EQ(res0["status"], "MOE_EP_ERR_UCX") << r0->Describe();
  EXPECT_TRUE(Has(res0["msg"], want0)) << "expected \"" << want0 << "\": " << r0->Describe();

  auto res1 = r1->Result();
  const std::string want1 = "rank 1: allgather #1 failed; rank 0 reports: " + want0;
  EXPECT_TRUE(r1->Exited(kStatusUcx)) << r1->Describe();
  EXPECT_EQ(res1["status"], "MOE_EP_ERR_UCX") << r1->Describe();
  EXPECT_TRUE(Has(res1["msg"], want1)) << "expected \"" << want1 << "\": " << r1->Describe();
  EXPECT_FALSE(Has(res1["msg"], "did not complete")) << r1->Describe();
}

// Rank 0 has no memory for the ACCEPT answering rank 1's HELLO: rank 0
// fails naming itself; rank 1 fails naming rank 0 (its ABORT, or its
// connection's end once rank 0 has given up), not waiting out its timeout.
TEST_F(BootstrapOom, RootWithoutMemoryForAcceptFailsNamingItself) {
  auto r0 = Start(0, "form", {"--oom_rank=0", "--oom_at=create"});
  auto r1 = Start(1, "form");
  WaitAll({r0.get(), r1.get()}, NowMs() + kHangGuardMs);

  const std::string want0 = "rank 0 had no memory to send ACCEPT";
  auto res0 = r0->Result();
  EXPECT_TRUE(r0->Exited(kStatusNoMemory)) << r0->Describe();
  EXPECT_EQ(res0["status"], "MOE_EP_ERR_NO_MEMORY") << r0->Describe();
  EXPECT_TRUE(Has(res0["msg"], want0 + " (the answer to its HELLO) to rank 1"))
      << r0->Describe();

  auto res1 = r1->Result();
  EXPECT_TRUE(r1->Exited(kStatusBootstrap)) << r1->Describe();
  EXPECT_EQ(res1["status"], "MOE_EP_ERR_BOOTSTRAP") << r1->Describe();
  const std::string &msg1 = res1["msg"];
  const bool told = Has(msg1, "rank 1: rank 0 at " + address_ + " reports: " + want0);
  const bool broke = Has(msg1, "rank 1: rank 0 at " + address_ + " failed while this rank waited");
  EXPECT_TRUE(told || broke) << r1->Describe();
  EXPECT_FALSE(Has(msg1, "within")) << r1->Describe();
}

// Rank 1 has no memory for its HELLO once admitted: it fails at once naming
// itself (rank 0, which would only see a rank that never joined, is ended
// by the test).
TEST_F(BootstrapOom, JoinerWithoutMemoryForHelloFailsNamingItself) {
  auto r0 = Start(0, "form");
  auto r1 = Start(1, "form", {"--oom_rank=1", "--oom_at=create"});
  WaitOne(r1.get(), NowMs() + kHangGuardMs);
  KillNow(r0.get(), SIGKILL);

  auto res1 = r1->Result();
  EXPECT_TRUE(r1->Exited(kStatusNoMemory)) << r1->Describe();
  EXPECT_EQ(res1["status"], "MOE_EP_ERR_NO_MEMORY") << r1->Describe();
  const std::string want1 = "rank 1 had no memory to send its HELLO to rank 0 at " + address_;
  EXPECT_TRUE(Has(res1["msg"], want1)) << "expected \"" << want1 << "\": " << r1->Describe();
}

}  // namespace
}  // namespace mep_test
