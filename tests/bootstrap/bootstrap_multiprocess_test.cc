// bootstrap_multiprocess_test.cc: the UCX bootstrap across real processes on
// loopback, at 2, 4 and 8 ranks: collective values, a rank that never
// starts, a rank killed mid-loop (rank 0 too), and strangers refused.
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

// The bootstrap timeout of the cases that wait it out (a rank never
// starts): long enough that every rank that does start has joined before
// rank 0 gives up, so rank 0 names the missing rank alone.
constexpr int kMissingTimeoutMs = 10000;
// Groups whose failures must come from a broken connection, not a timeout.
constexpr int kDeathTimeoutMs = 60000;
// Groups that must form: a timeout no step of a slow machine comes near.
constexpr int kFormTimeoutMs = 60000;
// Groups that must stay open while the test runs outsiders one after
// another: rank 0's formation deadline covers every wait of the test.
constexpr int kOpenTimeoutMs = 600000;
// How long the test waits for its processes before it kills them: a guard
// against a hang only, never what decides a case (8 UCX processes share 2
// loaded cores, under AddressSanitizer in CI).
constexpr int kHangGuardMs = 120000;
constexpr int kStatusInvalidArgument = 1;
constexpr int kStatusBootstrap = 5;
constexpr int kStatusPeerFailed = 6;

class BootstrapGroup : public ::testing::TestWithParam<int> {
 protected:
  int World() const { return GetParam(); }

  // One worker as `rank`, with common flags plus extra.
  std::unique_ptr<Proc> Start(int rank, int world, const std::string &scenario,
                              const std::string &token, int timeout_ms,
                              std::vector<std::string> extra = {},
                              const std::string &name = "") {
    std::vector<std::string> argv =
        WorkerArgv(rank, world, scenario, address_, token, timeout_ms);
    argv.insert(argv.end(), extra.begin(), extra.end());
    return std::make_unique<Proc>(
        Spawn(name.empty() ? "rank " + std::to_string(rank) : name, argv));
  }

  void SetUp() override {
    port_ = moe_ep_test::free_loopback_port();
    ASSERT_GT(port_, 0);
    address_ = "127.0.0.1:" + std::to_string(port_);
  }

  static std::vector<Proc *> Ptrs(std::vector<std::unique_ptr<Proc>> &v) {
    std::vector<Proc *> out;
    for (auto &p : v) {
      if (p) out.push_back(p.get());
    }
    return out;
  }

  int port_ = -1;
  std::string address_;
};

TEST_P(BootstrapGroup, CollectivesDeliverEveryRanksValues) {
  const int w = World();
  const int iters = 10;
  std::vector<std::unique_ptr<Proc>> procs;
  for (int r = 0; r < w; r++) {
    procs.push_back(Start(r, w, "collectives", "tok-abc-of-this-test", kFormTimeoutMs,
                          {"--iters=" + std::to_string(iters)}));
  }
  WaitAll(Ptrs(procs), NowMs() + kHangGuardMs);
  for (auto &p : procs) {
    auto res = p->Result();
    EXPECT_TRUE(p->Exited(0)) << p->Describe();
    EXPECT_EQ(res["status"], "MOE_EP_OK") << p->Describe();
    EXPECT_EQ(p->ResultInt("iters"), iters) << p->Describe();
  }
}

// `missing` never starts; everyone else must give up with BOOTSTRAP and say
// who (rank 0) or what (the others) went wrong. That they gave up by the
// timeout, not by a hang, shows in the status and the sentence (a hang
// meets the test's guard instead); how long it took is the machine's.
void ExpectMissingRank(std::vector<std::unique_ptr<Proc>> &procs, int missing,
                       const std::string &address) {
  for (auto &proc : procs) {
    Proc *p = proc.get();
    auto res = p->Result();
    EXPECT_TRUE(p->Exited(kStatusBootstrap)) << p->Describe();
    EXPECT_EQ(res["status"], "MOE_EP_ERR_BOOTSTRAP") << p->Describe();
    const std::string &msg = res["msg"];
    if (p->name == "rank 0") {
      EXPECT_NE(msg.find("rank " + std::to_string(missing) + " never joined"),
                std::string::npos)
          << p->Describe();
    } else if (missing == 0) {
      EXPECT_NE(msg.find("could not reach rank 0 at " + address),
                std::string::npos)
          << p->Describe();
    } else {
      // Rank 0's verdict names the missing rank; without it, the rank says
      // it was not told the group formed.
      bool named = msg.find("rank " + std::to_string(missing) +
                            " never joined") != std::string::npos;
      bool not_told = msg.find("not told the group formed") != std::string::npos;
      EXPECT_TRUE(named || not_told) << p->Describe();
    }
  }
}

TEST_P(BootstrapGroup, MissingLastRankFailsEveryoneWithinTimeout) {
  const int w = World();
  std::vector<std::unique_ptr<Proc>> procs;
  for (int r = 0; r < w - 1; r++) {
    procs.push_back(Start(r, w, "form", "tok-of-this-test-job", kMissingTimeoutMs));
  }
  WaitAll(Ptrs(procs), NowMs() + kHangGuardMs);
  ExpectMissingRank(procs, w - 1, address_);
}

TEST_P(BootstrapGroup, MissingRankZeroFailsEveryoneWithinTimeout) {
  const int w = World();
  std::vector<std::unique_ptr<Proc>> procs;
  for (int r = 1; r < w; r++) {
    procs.push_back(Start(r, w, "form", "tok-of-this-test-job", kMissingTimeoutMs));
  }
  WaitAll(Ptrs(procs), NowMs() + kHangGuardMs);
  ExpectMissingRank(procs, 0, address_);
}

// The victim SIGKILLs itself after its 20th barrier; every survivor's next
// barrier must fail with PEER_FAILED naming it, from the broken connection,
// not from the timeout. The timeout is long, so that eight ranks forming on
// a loaded machine never meet it: a failure that came from it would take
// the whole kDeathTimeoutMs.
TEST_P(BootstrapGroup, KilledRankFailsSurvivorsWithPeerFailed) {
  const int w = World();
  for (int victim : {w - 1, 0}) {
    SCOPED_TRACE("victim rank " + std::to_string(victim));
    port_ = moe_ep_test::free_loopback_port();
    address_ = "127.0.0.1:" + std::to_string(port_);
    std::vector<std::unique_ptr<Proc>> procs;
    for (int r = 0; r < w; r++) {
      procs.push_back(Start(r, w, "barrier_loop", "tok-of-this-test-job", kDeathTimeoutMs,
                            {"--die_rank=" + std::to_string(victim),
                             "--die_at=20", "--max_ms=" + std::to_string(kDeathTimeoutMs)}));
    }
    WaitAll(Ptrs(procs), NowMs() + 2 * kDeathTimeoutMs);
    for (int r = 0; r < w; r++) {
      Proc *p = procs[r].get();
      if (r == victim) {
        EXPECT_TRUE(p->Signaled(SIGKILL)) << p->Describe();
        continue;
      }
      auto res = p->Result();
      EXPECT_TRUE(p->Exited(kStatusPeerFailed)) << p->Describe();
      EXPECT_EQ(res["status"], "MOE_EP_ERR_PEER_FAILED") << p->Describe();
      EXPECT_NE(res["msg"].find("rank " + std::to_string(victim) + " failed"),
                std::string::npos)
          << p->Describe();
      // The culprit, not the messenger: rank 0 relays who failed, and says
      // what happened (its connection broke) rather than a UCX status name.
      if (victim != 0) {
        EXPECT_EQ(res["msg"].find("rank 0 failed"), std::string::npos)
            << p->Describe();
      }
      EXPECT_NE(res["msg"].find("connection broke"), std::string::npos)
          << p->Describe();
      // Completed the 20 barriers the victim did. Rank 0 releases each
      // barrier to the others, and once its 20th has returned it is killed
      // at once: whether its releases of that barrier left the process
      // before the kill is up to the scheduler, so with rank 0 the victim
      // a survivor may have seen 19.
      const int iters = p->ResultInt("iters");
      if (victim == 0) {
        EXPECT_TRUE(iters == 19 || iters == 20) << p->Describe();
      } else {
        EXPECT_EQ(iters, 20) << p->Describe();
      }
      // The failing barrier ended before its timeout could (the death was
      // heard, not waited out), and destroy did not wait it out either
      // (its close wait is 1 s).
      EXPECT_LT(p->ResultInt("op_ms"), kDeathTimeoutMs) << p->Describe();
      EXPECT_LT(p->ResultInt("destroy_ms"), kDeathTimeoutMs) << p->Describe();
    }
  }
}

TEST_P(BootstrapGroup, StrangersAreRefusedAndTheGroupStillForms) {
  const int w = World();
  const std::string token = "job-7f3a9c-2d41b6e8";
  std::vector<std::unique_ptr<Proc>> group;
  group.push_back(Start(0, w, "barrier", token, kOpenTimeoutMs));

  struct Stranger {
    std::string name;
    int world;
    std::string token;
    int timeout_ms;
    std::vector<std::string> said;  // in its error, in this order
  };
  // The right token with the wrong world size first: rank 0 proves its
  // refusal, which ends the join at once (well before kFormTimeoutMs), and
  // once it has, rank 0's gate is known to be listening. A wrong token
  // cannot be proven a refusal (the joiner cannot check rank 0's proof), so
  // that joiner knocks until its own deadline and then quotes the unproven
  // answer; rank 0 answers it on its first knock, since the gate listens
  // until the group forms, which waits for ranks started below.
  constexpr int kWrongTokenTimeoutMs = 10000;
  const std::vector<Stranger> strangers = {
      {"stranger(world size)", w + 1, token, kFormTimeoutMs,
       {"refused to admit rank 1 of " + std::to_string(w + 1), "world size mismatch"}},
      {"stranger(wrong token)", w, "not-the-job-token-at-all", kWrongTokenTimeoutMs,
       {"could not reach rank 0 at " + address_ + " within " +
            std::to_string(kWrongTokenTimeoutMs) + " ms",
        "rank 0 answered: wrong job token", "(not proven"}},
  };
  for (const Stranger &s : strangers) {
    auto p = Start(1, s.world, "form", s.token, s.timeout_ms, {}, s.name);
    WaitOne(p.get(), NowMs() + kHangGuardMs);
    auto res = p->Result();
    EXPECT_TRUE(p->Exited(kStatusBootstrap)) << p->Describe();
    EXPECT_EQ(res["status"], "MOE_EP_ERR_BOOTSTRAP") << p->Describe();
    size_t at = 0;
    for (const std::string &part : s.said) {
      at = res["msg"].find(part, at);
      EXPECT_NE(at, std::string::npos) << "expected \"" << part << "\": " << p->Describe();
      if (at == std::string::npos) break;
    }
  }

  // A process without a token, or with one too short to keep secret, does
  // not even knock.
  for (const auto &t : std::vector<std::pair<std::string, std::string>>{
           {"", "token is empty"},
           {"fifteen-chars!!", "token is 15 characters; a group of " + std::to_string(w) +
                                   " ranks needs at least 16"}}) {
    auto p = Start(1, w, "form", t.first, kFormTimeoutMs, {}, "stranger(token '" + t.first + "')");
    WaitOne(p.get(), NowMs() + kHangGuardMs);
    auto res = p->Result();
    EXPECT_TRUE(p->Exited(kStatusInvalidArgument)) << p->Describe();
    EXPECT_NE(res["msg"].find(t.second), std::string::npos) << p->Describe();
  }

  int first_real = 1;
  std::unique_ptr<Proc> dup_loser;
  if (w >= 3) {
    // Two processes both claim rank 1 with the right token: whichever comes
    // second is refused as a duplicate, the other one stays in the group.
    auto a = Start(1, w, "barrier", token, kOpenTimeoutMs, {}, "rank 1 (a)");
    auto b = Start(1, w, "barrier", token, kOpenTimeoutMs, {}, "rank 1 (b)");
    int i = WaitAny({a.get(), b.get()}, NowMs() + kHangGuardMs);
    ASSERT_GE(i, 0) << a->Describe() << b->Describe();
    dup_loser = i == 0 ? std::move(a) : std::move(b);
    group.push_back(i == 0 ? std::move(b) : std::move(a));
    auto res = dup_loser->Result();
    EXPECT_TRUE(dup_loser->Exited(kStatusBootstrap)) << dup_loser->Describe();
    EXPECT_NE(res["msg"].find("rank 1 already joined"), std::string::npos)
        << dup_loser->Describe();
    first_real = 2;
  }
  for (int r = first_real; r < w; r++) {
    group.push_back(Start(r, w, "barrier", token, kOpenTimeoutMs));
  }
  WaitAll(Ptrs(group), NowMs() + kHangGuardMs);
  for (auto &p : group) {
    auto res = p->Result();
    EXPECT_TRUE(p->Exited(0)) << p->Describe();
    EXPECT_EQ(res["status"], "MOE_EP_OK") << p->Describe();
    EXPECT_EQ(p->ResultInt("iters"), 1) << p->Describe();
  }
  // Rank 0 logs each refusal at WARN (the default level) with its reason.
  const std::string &log0 = group[0]->err;
  for (const char *reason : {"world size mismatch", "wrong job token"}) {
    EXPECT_NE(log0.find(reason), std::string::npos) << group[0]->Describe();
  }
}

// A setup phase closed by mep_bootstrap_agree: in step, every rank gets
// every rank's status (the last rank's setup failed); early, the failed
// rank's agreement meets the others' broadcast and every rank fails with
// PEER_FAILED naming it, its status and where the others were (not a
// collective mismatch). The failing rank is the last one, and rank 0.
TEST_P(BootstrapGroup, AgreementCarriesEachRanksSetupStatus) {
  const int w = World();
  std::vector<std::unique_ptr<Proc>> procs;
  for (int r = 0; r < w; r++) {
    procs.push_back(Start(r, w, "agree", "tok-of-this-test-job", kFormTimeoutMs,
                          {"--quit_rank=" + std::to_string(w - 1)}));
  }
  WaitAll(Ptrs(procs), NowMs() + kHangGuardMs);
  for (auto &p : procs) {
    EXPECT_TRUE(p->Exited(0)) << p->Describe();
    EXPECT_EQ(p->Result()["iters"], "1") << p->Describe();
  }
}

TEST_P(BootstrapGroup, AgreementDuringAnotherStepNamesTheRankThatGaveUp) {
  const int w = World();
  for (int quit : {w - 1, 0}) {
    SetUp();  // a fresh port for each group
    std::vector<std::unique_ptr<Proc>> procs;
    for (int r = 0; r < w; r++) {
      procs.push_back(Start(r, w, "agree", "tok-of-this-test-job", kFormTimeoutMs,
                            {"--quit_rank=" + std::to_string(quit), "--quit_early=1"}));
    }
    WaitAll(Ptrs(procs), NowMs() + kHangGuardMs);
    const std::string named = "rank " + std::to_string(quit) +
                              " gave up its part (MOE_EP_ERR_CUDA) while rank ";
    for (auto &p : procs) {
      auto res = p->Result();
      EXPECT_TRUE(p->Exited(kStatusPeerFailed)) << "quit " << quit << ": " << p->Describe();
      EXPECT_EQ(res["status"], "MOE_EP_ERR_PEER_FAILED") << p->Describe();
      EXPECT_NE(res["msg"].find(named), std::string::npos) << p->Describe();
      EXPECT_NE(res["msg"].find("broadcast #1"), std::string::npos) << p->Describe();
      EXPECT_EQ(res["msg"].find("mismatch"), std::string::npos) << p->Describe();
    }
  }
}

// Rank 0 comes late (by more than the slack a member allows past its own
// timeout) to a step that another rank never reaches. The members' waits
// run out before rank 0's; they ask rank 0 (OVERDUE), which names the
// missing rank, so nobody blames rank 0. If rank 0's own deadline comes
// first instead (a machine that delays a member), it names the same rank:
// the sentences do not depend on which came first.
class LateRootGroup : public BootstrapGroup {};
constexpr int kLateTimeoutMs = 6000;
constexpr int kLateMs = 1500; /* past the 750 ms slack of a 6000 ms timeout */

TEST_P(LateRootGroup, MembersNameTheRankMissingFromAStep) {
  const int w = World();
  const int hung = w - 1;
  const std::string hang_file = ::testing::TempDir() + "/late_root_hang";
  unlink(hang_file.c_str());
  std::vector<std::unique_ptr<Proc>> procs;
  for (int r = 0; r < w; r++) {
    procs.push_back(Start(r, w, "late_root", "tok-of-this-test-job", kLateTimeoutMs,
                          {"--late_ms=" + std::to_string(kLateMs),
                           "--hang_rank=" + std::to_string(hung), "--hang_file=" + hang_file}));
  }
  std::vector<Proc *> on_time;
  for (int r = 0; r < hung; r++) on_time.push_back(procs[r].get());
  WaitAll(on_time, NowMs() + kHangGuardMs);
  const int fd = open(hang_file.c_str(), O_CREAT | O_WRONLY, 0600);
  ASSERT_GE(fd, 0);
  close(fd);
  WaitAll(Ptrs(procs), NowMs() + kHangGuardMs);
  const std::string named = "barrier #2: rank " + std::to_string(hung) + " did not arrive";
  for (int r = 0; r < hung; r++) {
    Proc *p = procs[r].get();
    auto res = p->Result();
    EXPECT_EQ(res["status"], "MOE_EP_ERR_TIMEOUT") << p->Describe();
    EXPECT_NE(res["msg"].find(named), std::string::npos) << p->Describe();
    EXPECT_EQ(res["msg"].find("rank 0 did not complete"), std::string::npos) << p->Describe();
  }
  EXPECT_NE(procs[hung]->Result()["status"], "MOE_EP_OK") << procs[hung]->Describe();
  unlink(hang_file.c_str());
}

TEST_P(LateRootGroup, MembersNameTheRankThatNeverJoined) {
  const int w = World();
  std::vector<std::unique_ptr<Proc>> procs;
  for (int r = 0; r < w - 1; r++) {
    std::vector<std::string> extra;
    if (r == 0) extra.push_back("--start_delay_ms=" + std::to_string(kLateMs));
    procs.push_back(Start(r, w, "form", "tok-of-this-test-job", kLateTimeoutMs, extra));
  }
  WaitAll(Ptrs(procs), NowMs() + kHangGuardMs);
  const std::string named = "rank " + std::to_string(w - 1) + " never joined";
  for (auto &proc : procs) {
    auto res = proc->Result();
    EXPECT_EQ(res["status"], "MOE_EP_ERR_BOOTSTRAP") << proc->Describe();
    EXPECT_NE(res["msg"].find(named), std::string::npos) << proc->Describe();
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, LateRootGroup, ::testing::Values(4),
                         [](const ::testing::TestParamInfo<int> &i) {
                           return "world" + std::to_string(i.param);
                         });

INSTANTIATE_TEST_SUITE_P(Ranks, BootstrapGroup, ::testing::Values(2, 4, 8),
                         [](const ::testing::TestParamInfo<int> &i) {
                           return "world" + std::to_string(i.param);
                         });

}  // namespace
}  // namespace mep_test
