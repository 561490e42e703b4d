// conformance_test.cc: drives the host-backend conformance matrix: each case
// starts N real worker processes over UCX on loopback; every rank checks its
// outputs against the oracle and exits non-zero on the first mismatch
// (its log, printed here, names rank, seed, index, expected and got).
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "tests/common/ports.h"
#include "tests/common/spawn.h"

namespace moe_ep_test {
namespace {

struct Case {
  const char* name;
  int world;
  std::vector<std::string> args;
  int ports = 0;  // free bootstrap ports for the groups the scenario forms
};

std::string describe(const std::vector<RankExit>& exits) {
  std::string s;
  for (size_t r = 0; r < exits.size(); r++) {
    s += "---- rank " + std::to_string(r) + " exit=" + std::to_string(exits[r].code) +
         " signal=" + std::to_string(exits[r].signal) + "\n" + exits[r].log;
  }
  return s;
}

// A fresh folder for the workers' barriers outside moe-ep, or "" and why
// not. No shared folder stands in for it: another run's barrier files there
// would let a barrier pass before its ranks arrived.
std::string barrier_dir(std::string* why) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string pattern = std::string(tmp ? tmp : "/tmp") + "/barrier.XXXXXX";
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) {
    *why = "mkdtemp " + pattern + ": " + std::strerror(errno);
    return "";
  }
  return buf.data();
}

bool listenable(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  bool ok = fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
            listen(fd, 1) == 0;
  if (fd >= 0) close(fd);
  return ok;
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : fallback;
}

// n free ports for one scenario's groups, below the kernel's ephemeral
// range (the groups' own connections take ephemeral local ports, and one
// of those, or its TIME_WAIT, must not land on a port a later group
// listens on) and below kFreePortLow: the other multi-process tests draw
// from there up right before they listen, while a scenario picks all its
// ports at its start and listens on the last a minute later. Each test
// shard draws from its own slice of [10000, kFreePortLow), so shards that
// run at the same time never pick the same port (a port a group listened
// on stays unusable for a minute, TIME_WAIT, so a shared range collides).
std::string distinct_ports(int n) {
  const int shards = std::max(1, env_int("TEST_TOTAL_SHARDS", 1));
  const int shard = std::min(std::max(0, env_int("TEST_SHARD_INDEX", 0)), shards - 1);
  const int top = std::min(moe_ep_test::kFreePortLow, moe_ep_test::ephemeral_port_low());
  const int span = std::max(4 * n, (top - 10000) / shards);
  int low = 10000 + shard * span, high = low + span;
  // Seeded from the kernel's entropy: copies of one shard run at once
  // (--runs_per_test) may see the same pid and start in the same second.
  std::random_device entropy;
  std::mt19937 rng(entropy());
  std::set<int> seen;
  std::string list;
  while (static_cast<int>(seen.size()) < n) {
    int p = low + static_cast<int>(rng() % static_cast<unsigned>(high - low));
    if (seen.count(p) || !listenable(p)) continue;
    seen.insert(p);
    list += (list.empty() ? "" : ",") + std::to_string(p);
  }
  return list;
}

std::vector<std::string> worker_argv(const Case& c, const std::string& barriers) {
  std::vector<std::string> a = {runfile("tests/host/conformance_worker"),
                                "--plugin=" + runfile("plugin/libmoe_ep.so"),
                                "--barrier_dir=" + barriers};
  if (c.ports > 0) a.push_back("--ports=" + distinct_ports(c.ports));
  a.insert(a.end(), c.args.begin(), c.args.end());
  return a;
}

class Conformance : public testing::TestWithParam<Case> {};

// Each case's bound on its ranks, a guard against a hang only: a whole
// shard of cases has taken at most about 200 s under ThreadSanitizer on two
// loaded cores, and a shard (900 s, size "large") with a hung case reaches
// this bound first, so the case fails with its ranks' logs instead of the
// shard being killed without them.
constexpr int kCaseDeadlineS = 300;

TEST_P(Conformance, MatchesOracleOnEveryRank) {
  const Case& c = GetParam();
  std::string why;
  const std::string barriers = barrier_dir(&why);
  ASSERT_FALSE(barriers.empty()) << "no folder for the ranks' barriers: " << why;
  std::vector<RankExit> exits = run_ranks(c.world, worker_argv(c, barriers), kCaseDeadlineS);
  for (int r = 0; r < c.world; r++) {
    ASSERT_EQ(exits[r].code, 0) << "rank " << r << " failed\n" << describe(exits);
  }
}

// Every matrix value of the issue appears at least once: ranks {2,4,8},
// top_k {1,2,8,9,32}, hidden {128, 384, 2048, 7168, and 1032, 2056, 2880
// that are not multiples of 128}, experts {8,64,256},
// max_tokens {1,128}, all generators (inside each run), bf16 and fp8 with
// f32 / ue8m0 / packed scales, two layers per group, hooks.
const Case kCases[] = {
    {"ll_r2_e8_bf16", 2, {"--experts=8", "--max_tokens=128", "--layers=7168:2,2048:1"}},
    {"ll_r2_e64_fp8", 2, {"--experts=64", "--max_tokens=128", "--dtype=fp8", "--layers=7168:8,384:9"}},
    {"ll_r4_e64_fp8_ue8m0", 4, {"--experts=64", "--max_tokens=128", "--dtype=fp8", "--scale=ue8m0", "--layers=2048:32,128:8"}},
    {"ll_r4_e256_fp8_packed", 4, {"--experts=256", "--max_tokens=1", "--dtype=fp8", "--scale=ue8m0_packed", "--layers=7168:9,2048:32"}},
    {"ll_r8_e256_bf16", 8, {"--experts=256", "--max_tokens=1", "--layers=7168:32,128:1"}},
    {"ll_r8_e64_bf16", 8, {"--experts=64", "--max_tokens=128", "--seeds=1", "--layers=2048:8,384:2"}},
    // Weights given to dispatch (all ranks, or even ranks only): combine
    // with NULL or the same weights tensor.
    {"ll_r2_e64_fp8_dispatch_weights", 2, {"--experts=64", "--max_tokens=128", "--dtype=fp8", "--layers=2048:8,384:9", "--dispatch_weights=1"}},
    {"ll_r4_e64_bf16_dispatch_weights_mixed", 4, {"--experts=64", "--max_tokens=16", "--layers=2048:8,128:2", "--dispatch_weights=mixed"}},
    {"ll_r8_e64_fp8_dispatch_weights", 8, {"--experts=64", "--max_tokens=16", "--dtype=fp8", "--seeds=1", "--layers=2048:8,384:3", "--dispatch_weights=1"}},
    // Hidden a multiple of 8 but not of 128 (2880: gpt-oss; 1032, 2056),
    // in both combine modes, bit-exact against the oracle.
    {"ll_r2_e64_bf16_h2880", 2, {"--experts=64", "--max_tokens=32", "--layers=2880:9,1032:4"}},
    {"ll_r2_e64_bf16_h2880_dispatch_weights", 2, {"--experts=64", "--max_tokens=32", "--layers=2880:9,1032:4", "--dispatch_weights=1"}},
    {"ll_r4_e64_bf16_h2880_dispatch_weights_mixed", 4, {"--experts=64", "--max_tokens=16", "--seeds=1", "--layers=2880:4,2056:8", "--dispatch_weights=mixed"}},
    {"ht_r2_e8", 2, {"--mode=ht", "--experts=8", "--max_tokens=128", "--layers=7168:2,2880:1"}},
    {"ht_r4_e64", 4, {"--mode=ht", "--experts=64", "--max_tokens=128", "--layers=2048:8,384:9"}},
    {"ht_r8_e256", 8, {"--mode=ht", "--experts=256", "--max_tokens=128", "--seeds=1", "--layers=7168:32,128:8"}},
    {"ht_r8_e8_m1", 8, {"--mode=ht", "--experts=8", "--max_tokens=1", "--layers=128:1,2048:2"}},
    // Pre-quantised fp8 HT input (0.3): rows and scales carried verbatim,
    // the group's scale format or the call's, then combine; every HT case
    // also dispatches twice on one handle (cached layout) before combining.
    {"ht_r2_fp8_f32", 2, {"--mode=ht", "--experts=8", "--max_tokens=32", "--dtype=fp8", "--scale=f32", "--layers=7168:4,384:2"}},
    {"ht_r2_fp8_ue8m0_per_call", 2, {"--mode=ht", "--per_call_format=1", "--experts=8", "--max_tokens=32", "--dtype=fp8", "--scale=ue8m0", "--layers=2048:8,640:3"}},
    {"ht_r4_fp8_packed", 4, {"--mode=ht", "--experts=16", "--max_tokens=16", "--dtype=fp8", "--scale=ue8m0_packed", "--seeds=1", "--layers=2048:8,640:3"}},
    {"ht_r4_fp8_packed_per_call", 4, {"--mode=ht", "--per_call_format=1", "--experts=16", "--max_tokens=16", "--dtype=fp8", "--scale=ue8m0_packed", "--seeds=1", "--layers=1152:4"}},
    // One f32 scale per row (0.5, MOE_EP_FORMAT_FP8_PER_TOKEN), a per-call
    // format only; at hidden 128 as many scale words as f32 groups.
    {"ht_r3_fp8_per_token", 3, {"--mode=ht", "--per_call_format=1", "--experts=12", "--max_tokens=24", "--dtype=fp8", "--scale=per_token", "--layers=2048:8,128:3"}},
    {"ht_r4_worst_case_fp8_per_token", 4, {"--mode=ht", "--worst_case=1", "--per_call_format=1", "--experts=16", "--max_tokens=16", "--dtype=fp8", "--scale=per_token", "--seeds=1", "--layers=640:4"}},
    // Worst-case sized HT outputs (MOE_EP_FLAG_WORST_CASE): rows past
    // N_recv name no expert; combine takes the fixed-size y.
    {"ht_r2_worst_case", 2, {"--mode=ht", "--worst_case=1", "--experts=8", "--max_tokens=32", "--layers=2048:4,2880:2"}},
    {"ht_r4_worst_case_fp8", 4, {"--mode=ht", "--worst_case=1", "--experts=16", "--max_tokens=16", "--dtype=fp8", "--scale=ue8m0", "--seeds=1", "--layers=1024:8"}},
    {"ht_bad_input_r2", 2, {"--scenario=htbad", "--mode=ht", "--experts=8", "--max_tokens=16", "--layers=256:2"}},
    {"ht_bad_input_r4_ue8m0_packed", 4, {"--scenario=htbad", "--mode=ht", "--experts=16", "--max_tokens=8", "--scale=ue8m0_packed", "--layers=640:4"}},
    // handle_layout (0.3): DeepEP's src_info / layout_range of LL handles
    // against the oracle, and its refusals.
    {"layout_r2", 2, {"--scenario=layout", "--experts=8", "--max_tokens=16", "--layers=256:2,128:1"}},
    {"layout_r4_fp8", 4, {"--scenario=layout", "--experts=16", "--max_tokens=8", "--dtype=fp8", "--layers=512:4"}},
    {"layout_r8", 8, {"--scenario=layout", "--experts=32", "--max_tokens=8", "--layers=256:8"}},
    {"bad_input_r2_fp8", 2, {"--scenario=badinput", "--experts=8", "--max_tokens=16", "--dtype=fp8", "--layers=256:2"}},
    // The last rank skips a dispatch and the others time out. kernel_ms
    // also bounds the wire-up and the round trip before it, which must
    // succeed however slowly loaded cores run sanitizer ranks.
    {"absent_peer_timeout_r2", 2, {"--scenario=skip", "--experts=8", "--max_tokens=8", "--layers=128:2", "--kernel_ms=10000"}},
    // At 4 ranks three wait on the absent last one: each names it.
    {"absent_peer_timeout_r4", 4, {"--scenario=skip", "--experts=16", "--max_tokens=8", "--layers=128:2", "--kernel_ms=10000"}},
    {"config_mismatch_r2", 2, {"--scenario=mismatch", "--max_tokens=16"}},
    {"config_mismatch_r8", 8, {"--scenario=mismatch", "--max_tokens=16"}},
    // ranks_per_node: disagreeing ranks are refused like any agreed key;
    // create-time rules against the world size refuse on every rank before
    // any bootstrap; values the rules allow form the group (HT over
    // gin / gin_emulated may split it into nodes; LL ignores the key).
    {"ranks_per_node_mismatch_r2", 2, {"--scenario=mismatch", "--differ=ranks_per_node", "--ranks_per_node=1", "--max_tokens=16"}},
    {"ranks_per_node_not_dividing_r2", 2, {"--scenario=refused", "--ranks_per_node=3", "--expect_status=MOE_EP_ERR_INVALID_ARGUMENT", "--expect_error=group_create on rank {rank}: ranks_per_node=3 does not divide world_size=2; ranks_per_node is the number of consecutive ranks on one node, so the group must be whole nodes (0 = unset)"}},
    {"ranks_per_node_not_dividing_ht_gin_r4", 4, {"--scenario=refused", "--mode=ht", "--transport=gin", "--ranks_per_node=3", "--expect_status=MOE_EP_ERR_INVALID_ARGUMENT", "--expect_error=group_create on rank {rank}: ranks_per_node=3 does not divide world_size=4"}},
    {"ranks_per_node_ht_lsa_r2", 2, {"--scenario=refused", "--mode=ht", "--transport=lsa", "--ranks_per_node=1", "--expect_status=MOE_EP_ERR_INVALID_ARGUMENT", "--expect_error=group_create on rank {rank}: ranks_per_node=1 with transport 'lsa' in mode 'high_throughput' must be 0 or world_size=2; over transport lsa or auto, HT has no network leg, so the group is one node (transport gin or gin_emulated splits it into nodes)"}},
    {"ranks_per_node_ht_auto_r4", 4, {"--scenario=refused", "--mode=ht", "--ranks_per_node=2", "--expect_status=MOE_EP_ERR_INVALID_ARGUMENT", "--expect_error=ranks_per_node=2 with transport 'auto' in mode 'high_throughput' must be 0 or world_size=4"}},
    {"ranks_per_node_ht_gin_emulated_r4", 4, {"--mode=ht", "--transport=gin_emulated", "--ranks_per_node=2", "--experts=8", "--max_tokens=16", "--seeds=1", "--layers=256:2"}},
    // Eight ranks as 2 nodes of 4 and as 4 nodes of 2.
    {"ranks_per_node_ht_gin_emulated_r8_n4", 8, {"--mode=ht", "--transport=gin_emulated", "--ranks_per_node=4", "--experts=32", "--max_tokens=16", "--seeds=1", "--layers=512:8"}},
    {"ranks_per_node_ht_gin_emulated_r8_n2", 8, {"--mode=ht", "--transport=gin_emulated", "--ranks_per_node=2", "--experts=16", "--max_tokens=8", "--seeds=1", "--layers=256:3"}},
    {"ranks_per_node_ht_auto_whole_group_r2", 2, {"--mode=ht", "--ranks_per_node=2", "--experts=8", "--max_tokens=16", "--seeds=1", "--layers=256:2"}},
    {"ranks_per_node_ll_lsa_r2", 2, {"--transport=lsa", "--ranks_per_node=1", "--experts=8", "--max_tokens=16", "--seeds=1", "--layers=256:2"}},
    {"bad_input_r4_bf16", 4, {"--scenario=badinput", "--experts=8", "--max_tokens=16", "--layers=128:2"}},
    // One buffer set: every operation, refused ones included, takes the
    // same set, so a refusal sits right after the operation it follows.
    {"bad_input_r4_single_set", 4, {"--scenario=badinput", "--double_buffer=0", "--experts=8", "--max_tokens=16", "--layers=128:2"}},
    {"bad_input_r8_fp8", 8, {"--scenario=badinput", "--experts=16", "--max_tokens=8", "--dtype=fp8", "--layers=256:2"}},
    // A bf16 group whose every dispatch names its own fp8 format
    // (params->format, as DeepEP's per-call use_fp8 / use_ue8m0).
    {"ll_r2_per_call_fp8_ue8m0", 2, {"--per_call_format=1", "--experts=8", "--max_tokens=16", "--dtype=fp8", "--scale=ue8m0", "--seeds=1", "--layers=512:4,128:2"}},
    {"ll_r4_per_call_fp8_packed", 4, {"--per_call_format=1", "--experts=16", "--max_tokens=8", "--dtype=fp8", "--scale=ue8m0_packed", "--seeds=1", "--layers=640:3", "--dispatch_weights=mixed"}},
    // Two-batch overlap with hooks run and handles freed on a second thread,
    // 200 rounds (also the ThreadSanitizer pass's workload).
    {"threads_overlap_r2", 2, {"--scenario=threads", "--iterations=200", "--experts=8", "--max_tokens=8", "--layers=256:2"}},
    {"threads_overlap_r4_fp8", 4, {"--scenario=threads", "--iterations=50", "--experts=16", "--max_tokens=4", "--dtype=fp8", "--layers=256:4", "--dispatch_weights=mixed"}},
    // +-inf and NaN in the tokens (moe_ep.h's rule), every scale format.
    {"ll_r2_fp8_non_finite", 2, {"--experts=8", "--max_tokens=16", "--dtype=fp8", "--seeds=1", "--non_finite=1", "--layers=512:4,128:2"}},
    {"ll_r2_fp8_ue8m0_non_finite", 2, {"--experts=8", "--max_tokens=16", "--dtype=fp8", "--scale=ue8m0", "--seeds=1", "--non_finite=1", "--layers=512:4"}},
    {"ll_r4_fp8_packed_non_finite", 4, {"--experts=16", "--max_tokens=8", "--dtype=fp8", "--scale=ue8m0_packed", "--seeds=1", "--non_finite=1", "--layers=640:3"}},
    // MOE_EP_FLAG_ROUND_SCALE with f32 scale storage: powers of two.
    {"ll_r2_fp8_round_scale", 2, {"--experts=8", "--max_tokens=16", "--dtype=fp8", "--seeds=1", "--round_scale=1", "--layers=512:4,128:2"}},
    // Params structs at the v1 minimum, and one byte below it.
    {"abi_sizes_r2_bf16", 2, {"--scenario=abi", "--experts=8", "--max_tokens=16", "--layers=256:2"}},
    {"abi_sizes_r2_fp8", 2, {"--scenario=abi", "--experts=8", "--max_tokens=16", "--dtype=fp8", "--layers=256:2"}},
    // set_logger: level and text delivered; NULL restores stderr; a logger
    // calling back in, and freeing objects of its own and another group.
    {"logger_r2", 2, {"--scenario=logger", "--experts=8", "--max_tokens=8", "--layers=128:2"}, 4},
    // Combine on a handle whose buffer set a later dispatch reused: refused.
    {"reuse_r2_double_buffer", 2, {"--scenario=reuse", "--experts=8", "--max_tokens=8", "--layers=384:4"}},
    {"reuse_r2_single_buffer", 2, {"--scenario=reuse", "--double_buffer=0", "--experts=8", "--max_tokens=8", "--layers=384:4"}},
    {"reuse_r4_single_buffer", 4, {"--scenario=reuse", "--double_buffer=0", "--experts=16", "--max_tokens=8", "--layers=384:4"}},
    // Ranks combining two layer calls in different orders: refused.
    {"combine_order_r2", 2, {"--scenario=combine_order", "--experts=8", "--max_tokens=8", "--layers=384:4"}},
    {"combine_order_r3", 3, {"--scenario=combine_order", "--experts=12", "--max_tokens=8", "--layers=384:4"}},
    // A dispatch reusing a set waits for a slow peer to read the last one.
    {"slow_reader_r2_single_buffer", 2, {"--scenario=slow_reader", "--double_buffer=0", "--experts=8", "--max_tokens=8", "--layers=384:4", "--kernel_ms=60000"}},
    {"slow_reader_r3_single_buffer", 3, {"--scenario=slow_reader", "--double_buffer=0", "--experts=12", "--max_tokens=8", "--layers=384:4", "--kernel_ms=60000"}},
    // Rank 0 one operation ahead: rank 1 is told so at once; rank 0 then
    // hears that rank 1 left (destroyed its group). Rank 0's wait ends when
    // the leaver gets to group_destroy, however late a loaded machine lets
    // it: the long kernel_ms keeps that from turning into a TIMEOUT, and
    // costs nothing when the leaver is prompt.
    {"ahead_r2_single_buffer", 2, {"--scenario=ahead", "--double_buffer=0", "--experts=8", "--max_tokens=8", "--layers=128:2", "--kernel_ms=120000"}},
    {"ahead_r4_single_buffer", 4, {"--scenario=ahead", "--double_buffer=0", "--experts=16", "--max_tokens=8", "--layers=128:2", "--kernel_ms=120000"}},
    // The peer busy outside moe-ep between its send half and its hook (a
    // barrier of the engine's own), 50 fresh groups, each run's first
    // operation, then a handle kept past its group's destroy; then two live groups whose deferred dispatches interleave
    // in opposite orders on the two ranks, 50 times. A backend that needs
    // the peer to call in times out (the busy peer leaves its barrier only
    // once the others' hooks have returned), whatever kernel_ms is; a long
    // one keeps a loaded machine from timing out a backend that does not.
    {"busy_peer_r2_50_runs", 2, {"--scenario=busypeer", "--runs=50", "--experts=8", "--max_tokens=8", "--layers=7168:8", "--kernel_ms=30000"}, 52},
    // A combine whose receiver is stopped (SIGSTOP) times out; its caller
    // frees y at once and resumes the receiver: no send may still read y.
    // kernel_ms also bounds the group's wire-up and the 32 MiB dispatch
    // before it, which must succeed on two sanitizer processes on loaded
    // cores: the expected timeout costs those 10 s.
    {"stopped_peer_combine_r2", 2, {"--scenario=stoppedpeer", "--experts=16", "--max_tokens=512", "--layers=4096:8", "--kernel_ms=10000"}},
    {"two_groups_r2_50_runs", 2, {"--scenario=twogroups", "--runs=50", "--experts=8", "--max_tokens=8", "--layers=7168:8", "--kernel_ms=30000"}, 100},
    // Two groups over the same ranks, each created, used (LL layers
    // against the oracle) and destroyed by its own thread, concurrently;
    // fresh groups each run (two ports per run).
    {"two_groups_threads_r2", 2, {"--scenario=twogroups_threads", "--runs=3", "--iterations=10", "--experts=8", "--max_tokens=16", "--layers=1024:4,256:2", "--kernel_ms=30000"}, 6},
    {"two_groups_threads_r4_fp8", 4, {"--scenario=twogroups_threads", "--runs=2", "--iterations=5", "--experts=16", "--max_tokens=16", "--dtype=fp8", "--layers=1024:4,256:2", "--dispatch_weights=mixed", "--kernel_ms=30000"}, 4},
};

INSTANTIATE_TEST_SUITE_P(Host, Conformance, testing::ValuesIn(kCases),
                         [](const testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

// A rank killed (the case's victim) in an LL dispatch or around an HT
// prepare: the survivors report PEER_FAILED naming it and exit 0.
struct FaultCase {
  const char* name;
  int world;
  int victim;
  std::vector<std::string> args;
};

class Fault : public testing::TestWithParam<FaultCase> {};

TEST_P(Fault, SurvivorsReportPeerFailed) {
  const FaultCase& f = GetParam();
  Case c{f.name, f.world, f.args};
  c.args.push_back("--victim=" + std::to_string(f.victim));
  std::string why;
  const std::string barriers = barrier_dir(&why);
  ASSERT_FALSE(barriers.empty())
      << "no folder for the ranks' barriers: " << why;
  std::vector<RankExit> exits =
      run_ranks(f.world, worker_argv(c, barriers), 120);
  EXPECT_EQ(exits[f.victim].signal, SIGKILL)
      << "victim rank " << f.victim << " was to die of SIGKILL\n"
      << describe(exits);
  for (int r = 0; r < f.world; r++) {
    if (r == f.victim) continue;
    EXPECT_EQ(exits[r].code, 0) << "survivor rank " << r << "\n"
                                << describe(exits);
  }
}

const std::vector<std::string> kLlFault = {"--scenario=fault", "--experts=8",
                                           "--max_tokens=8", "--layers=128:2",
                                           "--kernel_ms=60000"};

// The HT prepare's count exchange (host backend: the bootstrap's
// collectives through rank 0) with the victim dead before it, dying while
// the others wait in it, or dying inside its own prepare (worker_ht_fault.cc).
std::vector<std::string> ht_fault(const std::string& at) {
  std::vector<std::string> a = {"--scenario=htfault", "--mode=ht",
                                "--experts=8",        "--max_tokens=8",
                                "--layers=128:2",     "--kernel_ms=60000"};
  a.push_back("--fault_at=" + at);
  return a;
}

// Every name ends in its world size (_r2 .. _r8; "rank0" when rank 0 is
// the victim), so test.sh's -*_r8* leaves the 8-rank case out of the
// ThreadSanitizer pass as it does the others.
const FaultCase kFaults[] = {
    {"fault_r2", 2, 1, kLlFault},
    {"fault_r4", 4, 3, kLlFault},
    {"fault_r8", 8, 7, kLlFault},
    // Rank 0, which ran the bootstrap's gate and is its collectives' hub.
    {"fault_rank0_r2", 2, 0, kLlFault},
    {"fault_rank0_r4", 4, 0, kLlFault},
    {"ht_prepare_fault_before_r2", 2, 1, ht_fault("before")},
    {"ht_prepare_fault_before_rank0_r4", 4, 0, ht_fault("before")},
    {"ht_prepare_fault_waiting_r4", 4, 3, ht_fault("waiting")},
    {"ht_prepare_fault_waiting_rank0_r2", 2, 0, ht_fault("waiting")},
    // Inside: rank 0 (rank 1 when rank 0 is the victim) joins the exchange
    // only once the victim has died, so rank 0 may find the victim's part
    // already there beside its dead connection; at 4 ranks a middle rank.
    {"ht_prepare_fault_inside_r2", 2, 1, ht_fault("inside")},
    {"ht_prepare_fault_inside_r4", 4, 2, ht_fault("inside")},
    {"ht_prepare_fault_inside_rank0_r4", 4, 0, ht_fault("inside")},
};

INSTANTIATE_TEST_SUITE_P(Host, Fault, testing::ValuesIn(kFaults),
                         [](const testing::TestParamInfo<FaultCase>& i) {
                           return std::string(i.param.name);
                         });

}  // namespace
}  // namespace moe_ep_test
