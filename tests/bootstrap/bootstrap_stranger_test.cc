// bootstrap_stranger_test.cc: outsiders against real ranks on loopback,
// while the group forms: on rank 0's gate (bootstrap_knocker: a knock with
// the wrong token, one announcing a 1 GiB address, bytes that are no
// knock, floods of connections that never finish a knock) and with UCX
// speaking the bootstrap's messages to the address (bootstrap_stranger).
// The real ranks must form and get every collective's values right (the
// worker checks each byte); rank 0 must turn each outsider away, say so
// naming it, and stay within its memory bound.
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/bootstrap_types.h"
#include "tests/bootstrap/proc_util.h"
#include "tests/common/ports.h"

namespace mep_test {
namespace {

// Rank 0 is started first and must still be forming when the outsiders
// are done (they run one after another, each given up to 90 s, and the
// flood waits up to 60 s for the gate): its formation deadline covers the
// test's own waits, so a loaded machine slows the test but cannot fail it.
// Those waits only guard against a hang, and the target is sized "large"
// (900 s) so that a case that meets them still ends inside Bazel's bound.
constexpr int kTimeoutMs = 600000;
constexpr int kIters = 3;
const char kToken[] = "job-5e1d07-9a3c4f12";
// Rank 0's peak RSS may grow by at most this much over the run (kB),
// counted from before the bootstrap existed: the bootstrap's own queue
// bound (bootstrap_types.h: about 0.5 MiB at 8 ranks), the gate's 64 knock
// slots (about 550 KiB), UCX's context, worker and endpoints. A plain
// 2-rank run grows by about 8 MiB. When UCX itself listened on the
// address, 256 unsolicited 1 MiB messages grew it by 257 MiB before the
// bootstrap bounded its queues, and still by one eager message per
// connection after.
constexpr long kRssGrowthBoundKb = 32 * 1024;
// The bound holds for the plain build only. Under AddressSanitizer RSS also
// counts shadow memory and the freed-block quarantine, and how much of the
// flood is queued when rank 0 drains it is then up to the scheduler; under
// ThreadSanitizer shadow memory again. The test and rank 0's worker are
// built in one configuration, so the test's own build tells.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitizedBuild = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitizedBuild = true;
#else
constexpr bool kSanitizedBuild = false;
#endif
#else
constexpr bool kSanitizedBuild = false;
#endif

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

  // Starts one outsider: bootstrap_stranger (UCX) or bootstrap_knocker
  // (the gate's records); each gives up by itself.
  std::unique_ptr<Proc> StartOutsider(const std::string &binary,
                                      const std::vector<std::string> &flags) {
    std::vector<std::string> argv = {Runfile("tests/bootstrap/" + binary),
                                     "--address=" + address_,
                                     "--world=" + std::to_string(World())};
    if (binary == "bootstrap_stranger") argv.push_back("--label=1");
    argv.insert(argv.end(), flags.begin(), flags.end());
    std::string name = binary;
    for (const std::string &f : flags) name += " " + f;
    return std::make_unique<Proc>(Spawn(name, argv));
  }

  std::unique_ptr<Proc> RunOutsider(const std::string &binary,
                                    const std::vector<std::string> &flags) {
    auto p = StartOutsider(binary, flags);
    WaitOne(p.get(), NowMs() + 90000);
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

  // The UCX stranger got nothing meant for a member and was cut off.
  static void ExpectShutOut(const Proc &s) {
    size_t at = s.out.find("STRANGER ");
    ASSERT_NE(at, std::string::npos) << s.Describe();
    EXPECT_TRUE(s.Exited(0)) << s.Describe();
    EXPECT_NE(s.out.find(" accepted=0 "), std::string::npos) << s.Describe();
    EXPECT_NE(s.out.find(" results=0 "), std::string::npos) << s.Describe();
    EXPECT_NE(s.out.find(" cut=1 "), std::string::npos) << s.Describe();
  }

  // The knocker's connections were all closed by rank 0, none admitted;
  // returns its "refused=" count.
  static int ExpectTurnedAway(const Proc &k) {
    EXPECT_TRUE(k.Exited(0)) << k.Describe();
    size_t at = k.out.find("KNOCKER ");
    EXPECT_NE(at, std::string::npos) << k.Describe();
    if (at == std::string::npos) return -1;
    int opened = -1, closed = -2, refused = -1, admitted = -1;
    sscanf(k.out.c_str() + at,
           "KNOCKER mode=%*s opened=%d closed=%d refused=%d admitted=%d",
           &opened, &closed, &refused, &admitted);
    EXPECT_GT(opened, 0) << k.Describe();
    EXPECT_EQ(closed, opened) << k.Describe();
    EXPECT_EQ(admitted, 0) << k.Describe();
    return refused;
  }

  std::string address_;
};

// The gate answers a wrong token and an absurd length with the reason,
// closes on bytes that are not a knock, and a UCX client that speaks the
// bootstrap's messages to the address (a HELLO with the wrong token, then
// rank 1's part of the first exchange, at once or while the real ranks
// form) never reaches UCX on rank 0.
TEST_P(StrangerTest, GateTurnsAwayEveryOutsider) {
  auto rank0 = StartRank(0);
  auto wrong = RunOutsider("bootstrap_knocker", {"--mode=wrong"});
  auto notoken = RunOutsider("bootstrap_knocker", {"--mode=notoken"});
  auto huge = RunOutsider("bootstrap_knocker", {"--mode=huge"});
  auto garbage = RunOutsider("bootstrap_knocker", {"--mode=garbage"});
  std::vector<std::unique_ptr<Proc>> strangers;
  strangers.push_back(
      RunOutsider("bootstrap_stranger", {"--mode=contrib", "--hello=wrong"}));
  strangers.push_back(RunOutsider(
      "bootstrap_stranger", {"--mode=answer", "--hello=wrong", "--duration_ms=1000"}));
  auto group = FinishGroup(std::move(rank0));
  EXPECT_EQ(ExpectTurnedAway(*wrong), 1);
  EXPECT_NE(wrong->out.find("reason=wrong job token"), std::string::npos)
      << wrong->Describe();
  EXPECT_EQ(ExpectTurnedAway(*notoken), 1);
  EXPECT_NE(notoken->out.find("reason=no job token presented (the knock claimed rank 1"),
            std::string::npos)
      << notoken->Describe();
  EXPECT_EQ(ExpectTurnedAway(*huge), 1);
  EXPECT_NE(huge->out.find("a 1073741824-byte knock body"),
            std::string::npos)
      << huge->Describe();
  EXPECT_EQ(ExpectTurnedAway(*garbage), 0);
  for (auto &s : strangers) ExpectShutOut(*s);
  // Rank 0 names each connection it refused and why: the four knockers,
  // and per UCX stranger its probe (a connect that waits for the listener)
  // and its UCX connection, whose first bytes are no knock.
  const std::string &log0 = group[0]->err;
  auto count = [&log0](const std::string &what) {
    size_t n = 0;
    for (size_t at = 0; (at = log0.find(what, at)) != std::string::npos; at++) n++;
    return n;
  };
  EXPECT_EQ(count("rank 0 refused a connection from 127.0.0.1:"),
            4 + 2 * strangers.size())
      << group[0]->Describe();
  EXPECT_EQ(count("wrong job token"), 1u) << group[0]->Describe();
  EXPECT_EQ(count("do not start a moe-ep knock"), 1 + strangers.size())
      << group[0]->Describe();
}

// A proven knock replayed on another connection, and one altered after
// proving, are refused as a wrong token: the proof binds the gate's fresh
// challenge and every byte of the knock, so the altered worker address
// never reaches UCX (a malformed one would abort rank 0 inside it).
TEST_P(StrangerTest, GateRefusesReplayedAndAlteredKnocks) {
  auto rank0 = StartRank(0);
  auto replay = RunOutsider("bootstrap_forger", {"--mode=replay", std::string("--token=") + kToken});
  auto tamper = RunOutsider("bootstrap_forger", {"--mode=tamper", std::string("--token=") + kToken});
  auto group = FinishGroup(std::move(rank0));
  const std::string refuse = std::to_string(MEP_BS_KNOCK_REFUSE) + ":";
  EXPECT_TRUE(replay->Exited(0)) << replay->Describe();
  // The original is proven (refused for its world size), its replay is not.
  EXPECT_NE(replay->out.find("first=" + refuse + "world size mismatch"), std::string::npos)
      << replay->Describe();
  EXPECT_NE(replay->out.find("second=" + refuse + "wrong job token"), std::string::npos)
      << replay->Describe();
  EXPECT_TRUE(tamper->Exited(0)) << tamper->Describe();
  EXPECT_NE(tamper->out.find("first=" + refuse + "wrong job token"), std::string::npos)
      << tamper->Describe();
}

// While the group forms: 512 connections that never finish a knock (more
// than rank 0's 64 slots), 256 x 1 MiB UCX messages eagerly and by
// rendezvous, and 64 MiB of bytes that are no knock. The real ranks join
// through the flood; rank 0 closes every outsider's connection and its
// memory stays bounded.
TEST_P(StrangerTest, FloodDuringFormationKeepsRankZeroBounded) {
  auto rank0 = StartRank(0);
  // The other ranks start once rank 0 has closed 100 of the silent
  // connections itself (the group cannot form before they start, so those
  // were the gate's doing, not the kernel's after the gate closed).
  const std::string ready = ::testing::TempDir() + "/flood_ready_" + std::to_string(World());
  unlink(ready.c_str());
  auto silent = StartOutsider("bootstrap_knocker", {"--mode=silent", "--conns=512",
                                                    "--ready_file=" + ready,
                                                    "--ready_closed=100"});
  for (int64_t until = NowMs() + 60000; access(ready.c_str(), F_OK) != 0 && NowMs() < until;) {
    usleep(20000);
  }
  ASSERT_EQ(access(ready.c_str(), F_OK), 0)
      << "rank 0 did not close 100 silent connections within 60 s";
  std::vector<std::unique_ptr<Proc>> strangers;
  for (const char *proto : {"eager", "rndv"}) {
    strangers.push_back(RunOutsider(
        "bootstrap_stranger", {"--mode=flood", "--hello=none", "--count=256",
                               "--bytes=1048576", std::string("--proto=") + proto}));
  }
  auto garbage =
      RunOutsider("bootstrap_knocker", {"--mode=garbage", "--bytes=67108864"});
  auto group = FinishGroup(std::move(rank0));
  WaitOne(silent.get(), NowMs() + 90000);
  EXPECT_EQ(ExpectTurnedAway(*silent), 0);
  EXPECT_EQ(ExpectTurnedAway(*garbage), 0);
  for (auto &s : strangers) ExpectShutOut(*s);
  const Proc &p0 = *group[0];
  long start_kb = p0.ResultInt("rss_start_kb");
  long hwm_kb = p0.ResultInt("hwm_kb");
  ASSERT_GT(start_kb, 0) << p0.Describe();
  ASSERT_GT(hwm_kb, 0) << p0.Describe();
  if (!kSanitizedBuild) {
    EXPECT_LE(hwm_kb - start_kb, kRssGrowthBoundKb)
        << "rank 0's peak RSS grew by " << (hwm_kb - start_kb) << " kB\n"
        << p0.Describe();
  }
  // The flood is counted, not logged line by line.
  EXPECT_NE(p0.err.find("connections on " + address_ + " while the group formed"),
            std::string::npos)
      << p0.Describe();
}

// Once the group formed, rank 0's bootstrap address refuses connections at
// the kernel: the gate no longer listens, though it keeps the port bound.
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
