// bootstrap_copies_test.cc: copies of messages on a group's own
// connections are dropped, and the connection they came on is kept:
//   unsealed  a copy whose MAC is wrong, ahead of the original, numbered
//             1000 past it (what UCX delivers there when it ties an
//             outsider's message to that connection by the endpoint id the
//             packet carries): dropped without its number being recorded,
//             so the original is still taken;
//   replayed  the same sealed bytes again after the original (what someone
//             who saw the message pass can send).
// One rank of two makes the copies (the test-only seams
// mep_bs_send_unsealed_first and mep_bs_send_replayed_first, in one real
// worker process), from its first message of the joining handshake or of
// the collectives on; every collective of the run must still complete with
// the right values on both ranks. Taken as real, a replayed copy would be
// a second HELLO, contribution or result for the same step, which cuts the
// connection; an unsealed one would put the original and the messages
// after it out of the window of numbers taken, and the run would stall.
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

void RunWithCopiesFrom(int sender, const std::string &kind, const std::string &at) {
  const int port = moe_ep_test::free_loopback_port();
  ASSERT_GT(port, 0);
  const std::string address = "127.0.0.1:" + std::to_string(port);
  std::vector<std::unique_ptr<Proc>> ranks;
  for (int r = 0; r < 2; r++) {
    std::vector<std::string> argv =
        WorkerArgv(r, 2, "collectives", address, "tok-copies-of-this-test", kTimeoutMs);
    argv.push_back("--copies_rank=" + std::to_string(sender));
    argv.push_back("--" + kind + "=6");
    argv.push_back("--copies_at=" + at);
    ranks.push_back(std::make_unique<Proc>(Spawn("rank " + std::to_string(r), argv)));
  }
  WaitAll({ranks[0].get(), ranks[1].get()}, NowMs() + kHangGuardMs);
  for (auto &p : ranks) {
    auto res = p->Result();
    EXPECT_TRUE(p->Exited(0)) << kind << " copies from rank " << sender << " from " << at
                              << " on: " << p->Describe();
    EXPECT_EQ(res["status"], "MOE_EP_OK") << p->Describe();
  }
}

TEST(BootstrapCopies, RootDropsAMembersUnsealedCopiesAndKeepsItsConnection) {
  RunWithCopiesFrom(1, "unsealed", "op");
}

TEST(BootstrapCopies, MemberDropsRootsUnsealedCopiesAndKeepsItsConnection) {
  RunWithCopiesFrom(0, "unsealed", "op");
}

TEST(BootstrapCopies, UnsealedCopiesOfTheHandshakeAreDropped) {
  RunWithCopiesFrom(1, "unsealed", "create");
  RunWithCopiesFrom(0, "unsealed", "create");
}

TEST(BootstrapCopies, RootDropsAMembersReplaysFromItsHelloOn) {
  RunWithCopiesFrom(1, "replayed", "create");
}

TEST(BootstrapCopies, MemberDropsRootsReplaysFromItsAcceptOn) {
  RunWithCopiesFrom(0, "replayed", "create");
}

TEST(BootstrapCopies, ReplaysInTheCollectivesAreDroppedEitherWay) {
  RunWithCopiesFrom(1, "replayed", "op");
  RunWithCopiesFrom(0, "replayed", "op");
}

}  // namespace
}  // namespace mep_test
