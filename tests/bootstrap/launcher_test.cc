// launcher_test.cc: moe_ep_run end to end with real bootstrap workers: a
// passing 4-rank job, the environment it hands out, a failing rank, the
// job timeout, SIGTERM forwarding; NaN durations refused, an inherited
// ignored SIGCHLD, and no rank or rank's child outliving the job.
#include <signal.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/bootstrap/proc_util.h"
#include "tools/launcher/loopback_port.h"

namespace mep_test {
namespace {

std::string Launcher() { return Runfile("tools/launcher/moe_ep_run"); }
std::string Worker() { return Runfile("tests/bootstrap/bootstrap_worker"); }

int Count(const std::string &hay, const std::string &needle) {
  int n = 0;
  for (size_t at = hay.find(needle); at != std::string::npos;
       at = hay.find(needle, at + 1)) {
    n++;
  }
  return n;
}

// Whether pid still runs (a zombie awaiting its reaper counts as gone).
bool Alive(pid_t pid) {
  char path[64], state = 0;
  snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (f == nullptr) return false;
  int ok = fscanf(f, "%*d (%*[^)]) %c", &state);
  fclose(f);
  return ok == 1 && state != 'Z' && state != 'X';
}

// Pids printed as "<tag><pid>" lines.
std::vector<pid_t> Pids(const std::string &out, const std::string &tag) {
  std::vector<pid_t> pids;
  for (size_t at = out.find(tag); at != std::string::npos;
       at = out.find(tag, at + 1)) {
    pids.push_back((pid_t)atoi(out.c_str() + at + tag.size()));
  }
  return pids;
}

// True once every pid is gone (bounded); kills survivors so none leaks.
bool AllGone(const std::vector<pid_t> &pids, int64_t within_ms) {
  int64_t until = NowMs() + within_ms;
  bool gone = false;
  while (!gone && NowMs() < until) {
    gone = true;
    for (pid_t q : pids) gone = gone && !Alive(q);
    if (!gone) usleep(50000);
  }
  for (pid_t q : pids) {
    if (Alive(q)) kill(q, SIGKILL);
  }
  return gone;
}

TEST(Launcher, FourRanksRunCollectives) {
  Proc p = Spawn("moe_ep_run -n 4", {Launcher(), "-n", "4", "--", Worker(),
                                     "--scenario=collectives", "--iters=5"});
  WaitOne(&p, NowMs() + 30000);
  EXPECT_TRUE(p.Exited(0)) << p.Describe();
  EXPECT_EQ(Count(p.out, "status=MOE_EP_OK"), 4) << p.Describe();
}

TEST(Launcher, SetsRankEnvironmentAndKeepsAGivenToken) {
  Proc p = Spawn("moe_ep_run env", {Launcher(), "-n", "3", "--", Worker(),
                                    "--scenario=env"});
  WaitOne(&p, NowMs() + 10000);
  EXPECT_TRUE(p.Exited(0)) << p.Describe();
  EXPECT_EQ(Count(p.out, "ok=1"), 3) << p.Describe();
  EXPECT_EQ(Count(p.out, "token_len=32"), 3) << p.Describe();  // 16 random bytes
  for (int r = 0; r < 3; r++) {
    EXPECT_NE(p.out.find("ENV rank=" + std::to_string(r) + " world=3"),
              std::string::npos)
        << p.Describe();
  }
  // The address is a loopback port below the kernel's ephemeral range
  // (where it leaves room), which no rank's outgoing connection can take.
  const size_t at = p.out.find("address=127.0.0.1:");
  ASSERT_NE(at, std::string::npos) << p.Describe();
  const int port = atoi(p.out.c_str() + at + strlen("address=127.0.0.1:"));
  if (moe_ep::loopback_port_range_has_room()) {
    EXPECT_GE(port, moe_ep::kFreePortLow) << p.Describe();
    EXPECT_LT(port, moe_ep::ephemeral_port_low()) << p.Describe();
  }
  Proc q = Spawn("moe_ep_run env token",
                 {Launcher(), "-n", "2", "--", Worker(), "--scenario=env"},
                 {"MOE_EP_JOB_TOKEN=feedface-given-token"});
  WaitOne(&q, NowMs() + 10000);
  EXPECT_TRUE(q.Exited(0)) << q.Describe();
  EXPECT_EQ(Count(q.out, "token_len=20"), 2) << q.Describe();
}

TEST(Launcher, FailingRankFailsTheJobAfterGrace) {
  // Rank 1 exits 3 at once; the others wait for it in bootstrap_create
  // (120 s timeout) until the 1 s grace period ends and they are killed.
  int64_t t0 = NowMs();
  Proc p = Spawn("moe_ep_run failing rank",
                 {Launcher(), "-n", "3", "--grace_s", "1", "--", Worker(),
                  "--scenario=form", "--fail_rank=1", "--timeout_ms=120000"});
  WaitOne(&p, NowMs() + 150000);
  int64_t took = NowMs() - t0;
  EXPECT_TRUE(p.Exited(3)) << p.Describe();
  EXPECT_NE(p.err.find("rank 1 (pid"), std::string::npos) << p.Describe();
  EXPECT_NE(p.err.find("exited with status 3"), std::string::npos)
      << p.Describe();
  EXPECT_NE(p.err.find("job failed: rank 1"), std::string::npos) << p.Describe();
  // Upper bound only, generous for a loaded machine, yet well short of the
  // 120 s the others would wait without the grace period.
  EXPECT_LT(took, 60000) << p.Describe();
}

TEST(Launcher, TimeoutKillsEverything) {
  int64_t t0 = NowMs();
  Proc p = Spawn("moe_ep_run timeout", {Launcher(), "-n", "2", "--timeout_s",
                                        "1", "--", Worker(), "--scenario=sleep"});
  WaitOne(&p, NowMs() + 30000);
  EXPECT_TRUE(p.Exited(124)) << p.Describe();
  EXPECT_NE(p.err.find("--timeout_s 1.0 expired"), std::string::npos)
      << p.Describe();
  // The ranks sleep 60 s: ending far sooner is the timeout at work.
  EXPECT_LT(NowMs() - t0, 20000) << p.Describe();
}

TEST(Launcher, ForwardsSigterm) {
  Proc p = Spawn("moe_ep_run sigterm",
                 {Launcher(), "-n", "2", "--", Worker(), "--scenario=sleep"});
  // Signal only once both ranks run (the launcher has its handler by then),
  // however long a loaded machine takes to start them.
  int64_t started_by = NowMs() + 20000;
  while (Count(p.out, "SLEEPING") < 2 && NowMs() < started_by) {
    ASSERT_EQ(WaitAny({&p}, NowMs() + 50), -1) << p.Describe();
  }
  ASSERT_EQ(Count(p.out, "SLEEPING"), 2) << p.Describe();
  kill(p.pid, SIGTERM);
  WaitOne(&p, NowMs() + 30000);
  EXPECT_TRUE(p.Exited(128 + SIGTERM)) << p.Describe();
  EXPECT_NE(p.err.find("forwarding to 2 rank(s)"), std::string::npos)
      << p.Describe();
  // Both ranks ended by the forwarded SIGTERM, not by the launcher's own
  // SIGKILL that follows it after 10 s.
  EXPECT_EQ(Count(p.err, "killed by signal 15"), 2) << p.Describe();
}

TEST(Launcher, RejectsBadUsage) {
  Proc p = Spawn("moe_ep_run -n 0", {Launcher(), "-n", "0", "--", Worker()});
  WaitOne(&p, NowMs() + 5000);
  EXPECT_TRUE(p.Exited(2)) << p.Describe();
  Proc q = Spawn("moe_ep_run no prog", {Launcher(), "-n", "2"});
  WaitOne(&q, NowMs() + 5000);
  EXPECT_TRUE(q.Exited(2)) << q.Describe();
  EXPECT_NE(q.err.find("no program to run"), std::string::npos) << q.Describe();
  // Each misuse is named, not only the usage printed.
  Proc r = Spawn("moe_ep_run -n", {Launcher(), "-n"});
  WaitOne(&r, NowMs() + 5000);
  EXPECT_TRUE(r.Exited(2)) << r.Describe();
  EXPECT_NE(r.err.find("-n needs a value"), std::string::npos) << r.Describe();
  Proc t = Spawn("moe_ep_run no -n", {Launcher(), "--", "/bin/true"});
  WaitOne(&t, NowMs() + 5000);
  EXPECT_TRUE(t.Exited(2)) << t.Describe();
  EXPECT_NE(t.err.find("-n N (the number of ranks) is required"), std::string::npos)
      << t.Describe();
}

TEST(Launcher, RejectsNanDurations) {
  for (const char *flag : {"--grace_s", "--timeout_s"}) {
    Proc p = Spawn(std::string("moe_ep_run ") + flag + " nan",
                   {Launcher(), "-n", "1", flag, "nan", "--", "/bin/true"});
    WaitOne(&p, NowMs() + 5000);
    EXPECT_TRUE(p.Exited(2)) << p.Describe();
    EXPECT_NE(p.err.find(std::string(flag) + " nan"), std::string::npos)
        << p.Describe();
  }
}

TEST(Launcher, InheritedIgnoredSigchldStillEnds) {
  // SIG_IGN for SIGCHLD survives exec; the kernel would then reap the ranks
  // and waitpid never report them.
  Proc p = Spawn("moe_ep_run SIGCHLD ignored",
                 {"/usr/bin/env", "--ignore-signal=CHLD", Launcher(), "-n", "2", "--timeout_s", "5", "--", "/bin/sh",
                  "-c", "exit 3"});
  WaitOne(&p, NowMs() + 15000);
  EXPECT_TRUE(p.Exited(3)) << p.Describe();
}

TEST(Launcher, RanksDoNotOutliveTheLauncher) {
  for (int sig : {SIGHUP, SIGKILL}) {
    Proc p = Spawn("moe_ep_run killed by " + std::to_string(sig),
                   {Launcher(), "-n", "2", "--", "/bin/sh", "-c",
                    "echo RANKPID=$$; exec sleep 60"});
    int64_t started_by = NowMs() + 20000;
    while (Count(p.out, "RANKPID=") < 2 && NowMs() < started_by) {
      ASSERT_EQ(WaitAny({&p}, NowMs() + 50), -1) << p.Describe();
    }
    std::vector<pid_t> ranks = Pids(p.out, "RANKPID=");
    ASSERT_EQ(ranks.size(), 2u) << p.Describe();
    kill(p.pid, sig);
    WaitOne(&p, NowMs() + 10000);
    EXPECT_TRUE(AllGone(ranks, 30000)) << "signal " << sig << ": " << p.Describe();
  }
}

TEST(Launcher, DeadRanksChildrenDoNotOutliveTheJob) {
  // Rank 1's wrapper dies (as if OOM-killed) and leaves its worker behind.
  Proc p = Spawn("moe_ep_run orphan",
                 {Launcher(), "-n", "2", "--grace_s", "1", "--", "/bin/sh",
                  "-c",
                  "if [ \"$MOE_EP_RANK\" = 1 ]; then sleep 60 & echo "
                  "CHILD=$!; kill -9 $$; fi; exec sleep 60"});
  WaitOne(&p, NowMs() + 20000);
  EXPECT_TRUE(p.Exited(128 + SIGKILL)) << p.Describe();
  std::vector<pid_t> child = Pids(p.out, "CHILD=");
  ASSERT_EQ(child.size(), 1u) << p.Describe();
  EXPECT_TRUE(AllGone(child, 30000)) << p.Describe();
}

}  // namespace
}  // namespace mep_test
