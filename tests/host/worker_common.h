// worker_common.h: what every conformance worker process shares: its
// options, its group, and the FAIL reporting (rank, seed, first bad index,
// expected, got) the driver greps for.
#ifndef MOE_EP_TESTS_HOST_WORKER_COMMON_H_
#define MOE_EP_TESTS_HOST_WORKER_COMMON_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "moe_ep.h"
#include "tests/oracle/oracle.h"

namespace moe_ep_test {

struct Options {
  std::string plugin;
  std::string scenario = "conformance";  // conformance | badinput | fault
  std::string backend = "host";
  bool ht = false;
  int num_experts = 8;
  int max_tokens = 8;
  std::string dtype = "bf16";
  std::string scale = "f32";
  std::vector<std::pair<int, int>> layers = {{128, 1}};  // (hidden, top_k)
  int seeds = 2;
  bool hooks = true;
  int kernel_ms = 20000;
  int boot_ms = 30000;  // bootstrap.timeout_ms (also the NCCL setup steps' bound)
  // > 0: group_create runs while a host function holds a stream for up to
  // this long (worker_hold.cc): the legacy default stream ("legacy") or a
  // nonblocking one ("nonblocking").
  int hold_ms = 0;
  std::string hold_stream = "legacy";
  // nccl backend: group_create adopts a communicator this process made
  // (worker_adopt.cc) instead of making its own.
  bool adopt_comm = false;
  std::string transport = "auto";
  int ranks_per_node = 0;  // the config key; 0 = unset
  // Scenario "mismatch": the agreed key the last rank changes
  // (max_tokens_per_rank or ranks_per_node, each one higher there).
  std::string differ = "max_tokens_per_rank";
  // Scenario "refused": the status group_create must return and a piece of
  // its sentence ("{rank}" stands for this rank's number).
  std::string expect_status;
  std::string expect_error;
  // LL: pass topk_weights to dispatch ("1"), never ("0"), or on even ranks
  // only ("mixed"): the nccl backend then pre-reduces on the expert side
  // for the sources that sent weights.
  std::string dispatch_weights = "0";
  bool double_buffer = true;
  // Scenarios that form groups of their own: how many rounds, and a free
  // bootstrap port for each group (a port cannot be reused at once: TCP
  // TIME_WAIT).
  int runs = 1;
  std::vector<int> ports;
  // Where ranks meet in a barrier outside moe-ep (files), as an engine's
  // own collectives would make them wait.
  std::string barrier_dir;
  int iterations = 200;  // scenario "threads": overlap rounds
  // LL: the group is configured bf16 and every dispatch names its own
  // format (dtype / scale above) in params->format.
  bool per_call_format = false;
  // fp8 LL: dispatch with MOE_EP_FLAG_ROUND_SCALE (power-of-two scales
  // even with fp8_scale f32).
  bool round_scale = false;
  // LL: +-inf and NaN written into the tokens (ll_call.cc, add_non_finite).
  bool non_finite = false;
  // HT: dispatch with MOE_EP_FLAG_WORST_CASE (outputs of world *
  // max_tokens rows).
  bool worst_case = false;
  std::string log_level = "warn";
  // Fault scenarios: the rank that dies (-1: the last), and when, for the
  // HT prepare fault (worker_ht_fault.cc): before, waiting or inside.
  int victim = -1;
  std::string fault_at = "before";
};

struct Ctx {
  const moe_ep_plugin_v1_t* api = nullptr;
  moe_ep_group_t* group = nullptr;
  Options opt;
  int rank = 0;
  int world = 1;
  int gpu = 0;  // CUDA device of the group (nccl backend): tensors' device_id
  int failures = 0;
  int checks = 0;
};

// Records a failure line "FAIL rank=R seed=S <what>: <detail>" on stderr.
void fail(Ctx& c, uint64_t seed, const std::string& what, const std::string& detail);
// Checks an empty "" comparison result from compare.h.
void expect_same(Ctx& c, uint64_t seed, const std::string& what, const std::string& diff);
// Checks a plugin status; on mismatch prints the plugin's last_error.
bool expect_status(Ctx& c, uint64_t seed, const std::string& what, moe_ep_status_t got,
                   moe_ep_status_t want, const char* must_contain = nullptr);

moe_ep_oracle::Problem problem_for(const Ctx& c, int hidden, int top_k,
                                   moe_ep_oracle::Generator gen);
// Scenarios that need the GPU backend: true on --backend=nccl; otherwise a
// FAIL line (a wrong command line is not a pass) and false.
bool runs_on_nccl(Ctx& c, const char* scenario);
std::string config_yaml(const Options& o);

// Scenarios (worker_ll.cc, worker_ht.cc, worker_bad.cc).
void run_ll_conformance(Ctx& c);
void run_ht_conformance(Ctx& c);
void run_bad_input(Ctx& c);
void run_fault(Ctx& c);
// worker_fault.cc: the rank --victim names (the last one when unset), or
// -1 and a FAIL line when it is not a rank of this group; whether `msg`
// names `rank` as the one that died or failed.
int fault_victim(Ctx& c);
bool names_dead_rank(const std::string& msg, int rank);
void run_ht_prepare_fault(Ctx& c);    // worker_ht_fault.cc
void run_two_groups_threads(Ctx& c);  // worker_two_groups_threads.cc
void run_skip(Ctx& c);
void run_graph(Ctx& c);
void run_routing(Ctx& c);
void run_busy_peer(Ctx& c);    // worker_busy.cc
void run_two_groups(Ctx& c);   // worker_busy.cc
void run_ahead(Ctx& c);        // worker_blame.cc
void run_reuse(Ctx& c);        // worker_reuse.cc
void run_slow_reader(Ctx& c);  // worker_reuse.cc
void run_combine_order(Ctx& c);  // worker_combine_order.cc
void run_ht_bad_input(Ctx& c); // worker_ht_bad.cc
void run_layout(Ctx& c);       // worker_layout.cc
class LlCall;
// worker_layout.cc: handle_layout of call's handle, on `stream`, against
// the oracle's slot layout. before_call runs once the outputs exist (making
// them synchronizes the device), right before the call; before_download
// right after it, before its outputs are read (where a test holds a stream
// and releases it).
void check_layout(Ctx& c, LlCall& call, const moe_ep_oracle::Problem& p, const std::string& what,
                  bool with_src, bool with_range, void* stream = nullptr,
                  const std::function<void()>& before_call = {},
                  const std::function<void()>& before_download = {});
void run_streams(Ctx& c);      // worker_streams.cc
// worker_stall.cc: group_create's verdict when one rank stalls in NCCL
// setup (MEP_STALL); `ms` is how long group_create took. 0 if as expected.
int expect_setup_stall(Ctx& c, moe_ep_status_t st, const std::string& msg, double ms);

// worker_hold.cc: a stream held across group_create or group_destroy
// (`what`; opt.hold_ms, opt.hold_stream); end_hold releases it and checks
// the call returned while it was still held. run_destroy_behind,
// run_ht_count_behind and run_first_launch_held: the scenarios of those
// names.
struct StreamHold;
StreamHold* start_hold(Ctx& c, const char* what);
void end_hold(Ctx& c, StreamHold* h, double call_ms, const char* what);
void run_destroy_behind(Ctx& c);
void run_ht_count_behind(Ctx& c);
void run_first_launch_held(Ctx& c);

// worker_adopt.cc: the engine's NCCL communicator for --adopt_comm=1
// (nullptr and a FAIL line when it cannot be made); destroyed after the
// group that borrowed it.
void* adopt_comm_create(Ctx& c);
void adopt_comm_destroy(Ctx& c, void* comm);

// worker_outside.cc: what an engine does outside moe-ep.
// All ranks meet at `name` (files under barrier_dir; polls with sleeps, so
// it never calls into moe-ep). False (and a FAIL line) after 120 s.
bool outside_barrier(Ctx& c, const std::string& name);
// Ranks 0 .. ranks-1 meet at `name` (same bound): the survivors when the
// ranks from `ranks` on are dead.
bool outside_barrier_first(Ctx& c, const std::string& name, int ranks);
// Arrives at `name` and waits for `rank` alone to arrive there (same bound).
bool outside_wait_for(Ctx& c, const std::string& name, int rank);
// Arrives at `name` and waits for `ranks` (same bound).
bool outside_barrier_among(Ctx& c, const std::string& name, const std::vector<int>& ranks);
// Every rank but `absent` meets at `name` (same bound): the survivors when
// `absent` is dead, whichever rank it was.
bool outside_barrier_without(Ctx& c, const std::string& name, int absent);
// A rank about to die leaves its process id at `name`; another waits until
// that process has ended (its sockets closed), not merely until it said it
// would (same bound).
void outside_announce_pid(Ctx& c, const std::string& name);
bool outside_wait_ended(Ctx& c, const std::string& name, int rank);
// Forms a group of the same config on 127.0.0.1:port (nullptr and a FAIL
// line on error); the caller destroys it.
moe_ep_group_t* create_group_on_port(Ctx& c, int port);
void run_threads(Ctx& c);
void run_stopped_peer(Ctx& c);
void run_abi_sizes(Ctx& c);
// The logger scenario: installed before group_create, checked after.
void install_test_logger(Ctx& c);
void run_logger(Ctx& c);
// worker_logger_groups.cc: two threads' loggers each freeing the other
// thread's group's objects from inside an entry (needs two --ports).
void check_logger_across_groups(Ctx& c);

// One LL layer call (prepare, dispatch, check, expert, combine, check);
// `defer` exercises the hook path run from another thread.
void ll_roundtrip(Ctx& c, const moe_ep_oracle::Problem& p, uint64_t seed, bool defer);

}  // namespace moe_ep_test

#endif  // MOE_EP_TESTS_HOST_WORKER_COMMON_H_
