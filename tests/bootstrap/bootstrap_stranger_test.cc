// bootstrap_stranger_test.cc: outsiders speaking the bootstrap's wire
// protocol (bootstrap_stranger) against real ranks on loopback: messages
// labelled as rank 1 from a connection that never joined or was refused,
// and floods of 1 MiB messages while the group forms. The real ranks must
// form and get every collective's values right (the worker checks each
// byte); rank 0 must cut the stranger, say so naming it, and stay within
// its memory bound.
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/bootstrap/proc_util.h"
#include "tests/common/ports.h"

namespace mep_test {
namespace {

constexpr int kTimeoutMs = 20000;
constexpr int kIters = 3;
const char kToken[] = "job-5e1d07";
// Rank 0's peak RSS may grow by at most this much over the run (kB),
// counted from before the bootstrap existed: the bootstrap's own queue
// bound (bootstrap_types.h: about 0.6 MiB at 8 ranks) plus UCX's context,
// worker, endpoints and one in-flight 1 MiB eager reassembly buffer. A
// plain 2-rank run grows by about 8 MiB, with this test's floods about
// 10 MiB; before rank 0 bounded its queues, 256 unsolicited 1 MiB messages
// grew it by 257 MiB.
constexpr long kRssGrowthBoundKb = 32 * 1024;

class StrangerTest : public ::testing::TestWithParam<int> {
 protected:
  int World() const { return GetParam(); }

  void SetUp() override {
    int port = moe_ep_test::free_loopback_port();
    ASSERT_GT(port, 0);
    address_ = "127.0.0.1:" + std::to_string(port);
  }

  std::unique_ptr<Proc> StartRank(int rank) {
    std::vector<std::string> argv = WorkerArgv(
        rank, World(), "collectives", address_, kToken, kTimeoutMs);
    argv.push_back("--iters=" + std::to_string(kIters));
    return std::make_unique<Proc>(Spawn("rank " + std::to_string(rank), argv));
  }

  // Runs one stranger to its end (it gives up by itself within seconds).
  std::unique_ptr<Proc> RunStranger(const std::vector<std::string> &flags) {
    std::vector<std::string> argv = {
        Runfile("tests/bootstrap/bootstrap_stranger"), "--address=" + address_,
        "--world=" + std::to_string(World()), "--label=1"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    std::string name = "stranger";
    for (const std::string &f : flags) name += " " + f;
    auto p = std::make_unique<Proc>(Spawn(name, argv));
    WaitOne(p.get(), NowMs() + 30000);
    return p;
  }

  // Rank 0 was started first; the strangers have had their go; now the
  // other ranks join and every rank runs the checked collectives.
  std::vector<std::unique_ptr<Proc>> FinishGroup(std::unique_ptr<Proc> rank0) {
    std::vector<std::unique_ptr<Proc>> group;
    group.push_back(std::move(rank0));
    for (int r = 1; r < World(); r++) group.push_back(StartRank(r));
    std::vector<Proc *> ptrs;
    for (auto &p : group) ptrs.push_back(p.get());
    WaitAll(ptrs, NowMs() + 90000);
    for (auto &p : group) {
      auto res = p->Result();
      EXPECT_TRUE(p->Exited(0)) << p->Describe();
      EXPECT_EQ(res["status"], "MOE_EP_OK") << p->Describe();
      EXPECT_EQ(p->ResultInt("iters"), kIters) << p->Describe();
    }
    return group;
  }

  // The stranger got nothing meant for a member and was cut off.
  static void ExpectShutOut(const Proc &s) {
    size_t at = s.out.find("STRANGER ");
    ASSERT_NE(at, std::string::npos) << s.Describe();
    EXPECT_TRUE(s.Exited(0)) << s.Describe();
    EXPECT_NE(s.out.find(" accepted=0 "), std::string::npos) << s.Describe();
    EXPECT_NE(s.out.find(" results=0 "), std::string::npos) << s.Describe();
    EXPECT_NE(s.out.find(" cut=1 "), std::string::npos) << s.Describe();
  }

  std::string address_;
};

// (a) A CONTRIB labelled rank 1 from a connection that sent no HELLO, an
// empty token, or a wrong one: before, it stood in for rank 1 and both real
// ranks failed with MISMATCH.
TEST_P(StrangerTest, ContributionFromUnjoinedConnectionIsDropped) {
  auto rank0 = StartRank(0);
  std::vector<std::unique_ptr<Proc>> strangers;
  for (const char *hello : {"none", "empty", "wrong"}) {
    strangers.push_back(
        RunStranger({"--mode=contrib", std::string("--hello=") + hello}));
  }
  auto group = FinishGroup(std::move(rank0));
  for (auto &s : strangers) ExpectShutOut(*s);
  // Rank 0 names each connection it cut and why.
  const std::string &log0 = group[0]->err;
  size_t cut = 0;
  for (size_t at = 0; (at = log0.find("rank 0 closed a connection from 127.0.0.1:",
                                      at)) != std::string::npos;
       at++) {
    cut++;
  }
  EXPECT_EQ(cut, strangers.size()) << group[0]->Describe();
  EXPECT_NE(log0.find("sent a CONTRIB (labelled rank 1) before joining"),
            std::string::npos)
      << group[0]->Describe();
}

// (c) Refused, then answering rank 1's part of the first exchange while the
// real ranks form: before, group formation returned OK on the real ranks
// with the stranger standing in for rank 1.
TEST_P(StrangerTest, RefusedStrangerCannotAnswerForRankOne) {
  auto rank0 = StartRank(0);
  auto s = RunStranger({"--mode=answer", "--hello=wrong", "--duration_ms=3000"});
  auto group = FinishGroup(std::move(rank0));
  ExpectShutOut(*s);
  EXPECT_NE(s->out.find(" refused=1 "), std::string::npos) << s->Describe();
  const std::string &log0 = group[0]->err;
  EXPECT_NE(log0.find("rank 0 refused a connection from 127.0.0.1:"),
            std::string::npos)
      << group[0]->Describe();
  EXPECT_NE(log0.find("sent a CONTRIB after its handshake was refused"),
            std::string::npos)
      << group[0]->Describe();
}

// (b) 256 x 1 MiB unsolicited messages to rank 0 during formation, eagerly
// and by rendezvous: rank 0 must not hold them.
TEST_P(StrangerTest, FloodDuringFormationKeepsRankZeroBounded) {
  auto rank0 = StartRank(0);
  std::vector<std::unique_ptr<Proc>> strangers;
  for (const char *proto : {"eager", "rndv"}) {
    strangers.push_back(RunStranger({"--mode=flood", "--hello=none",
                                     "--count=256", "--bytes=1048576",
                                     std::string("--proto=") + proto}));
  }
  auto group = FinishGroup(std::move(rank0));
  for (auto &s : strangers) ExpectShutOut(*s);
  const Proc &p0 = *group[0];
  long start_kb = p0.ResultInt("rss_start_kb");
  long hwm_kb = p0.ResultInt("hwm_kb");
  ASSERT_GT(start_kb, 0) << p0.Describe();
  ASSERT_GT(hwm_kb, 0) << p0.Describe();
  EXPECT_LE(hwm_kb - start_kb, kRssGrowthBoundKb)
      << "rank 0's peak RSS grew by " << (hwm_kb - start_kb) << " kB\n"
      << p0.Describe();
}

// Once the group formed, rank 0's bootstrap address refuses connections at
// the kernel: UCX holds no listener that outsiders could fill with
// connections it would only reject (UCX 1.13 crashed rank 0 past about a
// thousand at once, during the group's whole life).
TEST_P(StrangerTest, AddressTakesNoConnectionOnceFormed) {
  std::vector<std::unique_ptr<Proc>> group;
  for (int r = 0; r < World(); r++) {
    group.push_back(std::make_unique<Proc>(Spawn(
        "rank " + std::to_string(r), WorkerArgv(r, World(), "port", address_, kToken,
                                                kTimeoutMs))));
  }
  std::vector<Proc *> ptrs;
  for (auto &p : group) ptrs.push_back(p.get());
  WaitAll(ptrs, NowMs() + 90000);
  for (auto &p : group) {
    EXPECT_TRUE(p->Exited(0)) << p->Describe();
    EXPECT_EQ(p->Result()["status"], "MOE_EP_OK") << p->Describe();
  }
  EXPECT_NE(group[0]->out.find("PORT rank=0 accepts=0"), std::string::npos)
      << group[0]->Describe();
}

INSTANTIATE_TEST_SUITE_P(Ranks, StrangerTest, ::testing::Values(2, 4),
                         [](const ::testing::TestParamInfo<int> &i) {
                           return "world" + std::to_string(i.param);
                         });

}  // namespace
}  // namespace mep_test
