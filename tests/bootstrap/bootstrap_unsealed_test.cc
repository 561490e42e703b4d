// bootstrap_unsealed_test.cc: a message on a group's own connection that
// the job token's key did not seal (what UCX delivers there when it ties
// an outsider's message to that connection by the endpoint id the packet
// carries) is dropped, and the connection it came on is kept: with one
// rank of two putting an unsealed copy ahead of each of its first messages
// (the test-only seam mep_bs_send_unsealed_first, in one real worker
// process), every collective of the run still completes with the right
// values on both ranks. Taken as real, each copy would be a second
// contribution or result for the same step, which cuts the connection.
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/bootstrap/proc_util.h"
#include "tests/common/ports.h"

namespace mep_test {
namespace {

constexpr int kTimeoutMs = 60000;
constexpr int kHangGuardMs = 150000;

void RunWithUnsealedCopiesFrom(int sender) {
  const int port = moe_ep_test::free_loopback_port();
  ASSERT_GT(port, 0);
  const std::string address = "127.0.0.1:" + std::to_string(port);
  std::vector<std::unique_ptr<Proc>> ranks;
  for (int r = 0; r < 2; r++) {
    std::vector<std::string> argv =
        WorkerArgv(r, 2, "collectives", address, "tok-unsealed", kTimeoutMs);
    argv.push_back("--unsealed_rank=" + std::to_string(sender));
    argv.push_back("--unsealed=4");
    ranks.push_back(std::make_unique<Proc>(Spawn("rank " + std::to_string(r), argv)));
  }
  WaitAll({ranks[0].get(), ranks[1].get()}, NowMs() + kHangGuardMs);
  for (auto &p : ranks) {
    auto res = p->Result();
    EXPECT_TRUE(p->Exited(0)) << "unsealed copies from rank " << sender << ": " << p->Describe();
    EXPECT_EQ(res["status"], "MOE_EP_OK") << p->Describe();
  }
}

TEST(BootstrapUnsealed, RootDropsAMembersUnsealedCopiesAndKeepsItsConnection) {
  RunWithUnsealedCopiesFrom(1);
}

TEST(BootstrapUnsealed, MemberDropsRootsUnsealedCopiesAndKeepsItsConnection) {
  RunWithUnsealedCopiesFrom(0);
}

}  // namespace
}  // namespace mep_test
