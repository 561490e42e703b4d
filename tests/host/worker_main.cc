// worker_main.cc: one rank of a conformance run. Started N times (by the
// driver or tools/launcher/moe_ep_run) with MOE_EP_RANK / WORLD_SIZE /
// BOOTSTRAP_ADDRESS in the environment; loads libmoe_ep.so through the
// public loader, forms the group, runs a scenario, exits 0 only if every
// check passed.
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "tests/common/mirror.h"
#include "tests/common/plugin_api.h"
#include "tests/host/worker_common.h"

namespace moe_ep_test {

// A GPU-only scenario asked of the host backend is a wrong command line,
// not a pass: it fails, so no run reports checks it never made.
bool runs_on_nccl(Ctx& c, const char* scenario) {
  if (c.opt.backend == "nccl") return true;
  fail(c, 0, scenario, "this scenario runs on --backend=nccl only");
  return false;
}

void fail(Ctx& c, uint64_t seed, const std::string& what, const std::string& detail) {
  c.failures++;
  std::fprintf(stderr, "FAIL rank=%d seed=%llu %s: %s\n", c.rank,
               static_cast<unsigned long long>(seed), what.c_str(), detail.c_str());
}

void expect_same(Ctx& c, uint64_t seed, const std::string& what, const std::string& diff) {
  c.checks++;
  if (!diff.empty()) fail(c, seed, what, diff);
}

bool expect_status(Ctx& c, uint64_t seed, const std::string& what, moe_ep_status_t got,
                   moe_ep_status_t want, const char* must_contain) {
  c.checks++;
  const char* msg = c.api->last_error();
  if (got != want) {
    fail(c, seed, what,
         std::string("status ") + c.api->status_string(got) + ", expected " +
             c.api->status_string(want) + " (last_error: " + msg + ")");
    return false;
  }
  if (must_contain != nullptr && std::strstr(msg, must_contain) == nullptr) {
    fail(c, seed, what,
         std::string("last_error \"") + msg + "\" does not mention \"" + must_contain + "\"");
    return false;
  }
  return true;
}

moe_ep_oracle::Problem problem_for(const Ctx& c, int hidden, int top_k,
                                   moe_ep_oracle::Generator gen) {
  moe_ep_oracle::Problem p;
  p.world = c.world;
  p.num_experts = c.opt.num_experts;
  p.hidden = hidden;
  p.top_k = top_k;
  p.max_tokens_per_rank = c.opt.max_tokens;
  p.generator = gen;
  p.dispatch_dtype = c.opt.dtype == "fp8" ? moe_ep_oracle::DispatchDtype::kFp8
                                          : moe_ep_oracle::DispatchDtype::kBf16;
  // ROUND_SCALE with f32 storage: the UE8M0 scale values, stored as f32.
  p.scale_format = c.opt.scale == "ue8m0" || c.opt.round_scale
                       ? moe_ep_oracle::ScaleFormat::kUe8m0
                   : c.opt.scale == "ue8m0_packed" ? moe_ep_oracle::ScaleFormat::kUe8m0Packed
                   : c.opt.scale == "per_token"    ? moe_ep_oracle::ScaleFormat::kPerToken
                                                   : moe_ep_oracle::ScaleFormat::kF32;
  // HT combine sums per node of ranks_per_node first when it is set.
  p.node_ranks = c.opt.ranks_per_node;
  return p;
}

std::string config_yaml(const Options& o) {
  int hidden = 0, top_k = 0;
  for (auto& l : o.layers) {
    hidden = std::max(hidden, l.first);
    top_k = std::max(top_k, l.second);
  }
  std::ostringstream y;
  y << "engine:\n  name: conformance\n"
    << "moe_ep:\n"
    << "  backend: " << o.backend << "\n"
    << "  mode: " << (o.ht ? "high_throughput" : "low_latency") << "\n"
    << "  num_experts: " << o.num_experts << "\n"
    << "  hidden: " << hidden << "\n"
    << "  top_k: " << top_k << "\n"
    << "  max_tokens_per_rank: " << o.max_tokens << "\n"
    << "  dispatch_dtype: " << (o.dtype == "fp8" && !o.per_call_format ? "fp8_e4m3" : "bf16") << "\n"
    << "  fp8_scale: " << (o.per_call_format ? "f32" : o.scale) << "\n"
    << "  transport: " << o.transport << "\n"
    << "  ranks_per_node: " << o.ranks_per_node << "\n"
    << "  double_buffer: " << (o.double_buffer ? "true" : "false") << "\n"
    << "  log_level: " << o.log_level << "\n"
    << "  timeouts:\n    kernel_ms: " << o.kernel_ms << "\n"
    << "  bootstrap:\n    timeout_ms: " << o.boot_ms << "\n";
  return y.str();
}

static bool parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    size_t eq = a.find('=');
    if (a.rfind("--", 0) != 0 || eq == std::string::npos) return false;
    std::string k = a.substr(2, eq - 2), v = a.substr(eq + 1);
    if (k == "plugin") o->plugin = v;
    else if (k == "scenario") o->scenario = v;
    else if (k == "backend") o->backend = v;
    else if (k == "mode") o->ht = v == "ht";
    else if (k == "experts") o->num_experts = std::atoi(v.c_str());
    else if (k == "max_tokens") o->max_tokens = std::atoi(v.c_str());
    else if (k == "dtype") o->dtype = v;
    else if (k == "scale") o->scale = v;
    else if (k == "seeds") o->seeds = std::atoi(v.c_str());
    else if (k == "hooks") o->hooks = v == "1";
    else if (k == "kernel_ms") o->kernel_ms = std::atoi(v.c_str());
    else if (k == "boot_ms") o->boot_ms = std::atoi(v.c_str());
    else if (k == "hold_ms") o->hold_ms = std::atoi(v.c_str());
    else if (k == "hold_stream" && (v == "legacy" || v == "nonblocking")) o->hold_stream = v;
    else if (k == "adopt_comm") o->adopt_comm = v == "1";
    else if (k == "transport") o->transport = v;
    else if (k == "ranks_per_node") o->ranks_per_node = std::atoi(v.c_str());
    else if (k == "differ") o->differ = v;
    else if (k == "expect_status") o->expect_status = v;
    else if (k == "expect_error") o->expect_error = v;
    else if (k == "dispatch_weights") o->dispatch_weights = v;
    else if (k == "double_buffer") o->double_buffer = v == "1";
    else if (k == "runs") o->runs = std::atoi(v.c_str());
    else if (k == "barrier_dir") o->barrier_dir = v;
    else if (k == "ports") {  // "40001,40002"
      std::stringstream ss(v);
      std::string item;
      while (std::getline(ss, item, ',')) o->ports.push_back(std::atoi(item.c_str()));
    }
    else if (k == "iterations") o->iterations = std::atoi(v.c_str());
    else if (k == "per_call_format") o->per_call_format = v == "1";
    else if (k == "round_scale") o->round_scale = v == "1";
    else if (k == "non_finite") o->non_finite = v == "1";
    else if (k == "worst_case") o->worst_case = v == "1";
    else if (k == "log_level") o->log_level = v;
    else if (k == "victim")
      o->victim = std::atoi(v.c_str());
    else if (k == "fault_at")
      o->fault_at = v;
    else if (k == "layers") {  // "7168:8,2048:1"
      o->layers.clear();
      std::stringstream ss(v);
      std::string item;
      while (std::getline(ss, item, ',')) {
        size_t colon = item.find(':');
        if (colon == std::string::npos) return false;
        o->layers.push_back({std::atoi(item.substr(0, colon).c_str()),
                             std::atoi(item.substr(colon + 1).c_str())});
      }
    } else {
      return false;
    }
  }
  // Per-token scales are a per-call format of HT rows only: no group's
  // fp8_scale names them.
  if (o->scale == "per_token" && !(o->ht && o->per_call_format)) {
    std::fprintf(stderr, "--scale=per_token needs --mode=ht and --per_call_format=1\n");
    return false;
  }
  return true;
}

static void run_scenario(Ctx& c) {
  if (c.opt.scenario == "badinput") {
    run_bad_input(c);
  } else if (c.opt.scenario == "fault") {
    run_fault(c);
  } else if (c.opt.scenario == "htfault") {
    run_ht_prepare_fault(c);
  } else if (c.opt.scenario == "twogroups_threads") {
    run_two_groups_threads(c);
  } else if (c.opt.scenario == "skip") {
    run_skip(c);
  } else if (c.opt.scenario == "routing") {
    run_routing(c);
  } else if (c.opt.scenario == "graph") {
    run_graph(c);
  } else if (c.opt.scenario == "threads") {
    run_threads(c);
  } else if (c.opt.scenario == "streams") {
    run_streams(c);
  } else if (c.opt.scenario == "abi") {
    run_abi_sizes(c);
  } else if (c.opt.scenario == "logger") {
    run_logger(c);
  } else if (c.opt.scenario == "busypeer") {
    run_busy_peer(c);
  } else if (c.opt.scenario == "twogroups") {
    run_two_groups(c);
  } else if (c.opt.scenario == "ahead") {
    run_ahead(c);
  } else if (c.opt.scenario == "reuse") {
    run_reuse(c);
  } else if (c.opt.scenario == "combine_order") {
    run_combine_order(c);
  } else if (c.opt.scenario == "slow_reader") {
    run_slow_reader(c);
  } else if (c.opt.scenario == "htbad") {
    run_ht_bad_input(c);
  } else if (c.opt.scenario == "layout") {
    run_layout(c);
  } else if (c.opt.scenario == "stoppedpeer") {
    run_stopped_peer(c);
  } else if (c.opt.scenario == "destroy_behind") {
    run_destroy_behind(c);
  } else if (c.opt.scenario == "ht_count_behind") {
    run_ht_count_behind(c);
  } else if (c.opt.scenario == "first_launch_held") {
    run_first_launch_held(c);
  } else if (c.opt.ht) {
    run_ht_conformance(c);
  } else {
    run_ll_conformance(c);
  }
}

// Scenarios "mismatch" and "refused": group_create must have failed with
// `want` (a status name), returned no group and said `must` in `msg`.
static int expect_refused(Ctx& c, moe_ep_status_t st, const std::string& msg,
                          const std::string& want, const std::string& must) {
  bool ok = want == c.api->status_string(st) && c.group == nullptr &&
            msg.find(must) != std::string::npos;
  const char* rank = std::getenv("MOE_EP_RANK");
  std::fprintf(stderr, "%s rank=%s %s: %s: %s\n", ok ? "PASSED" : "FAIL", rank ? rank : "?",
               c.opt.scenario.c_str(), c.api->status_string(st), msg.c_str());
  if (c.group != nullptr) c.api->group_destroy(c.group);
  if (!ok) {
    std::fprintf(stderr, "  expected %s, no group, and a sentence holding \"%s\"\n", want.c_str(),
                 must.c_str());
  }
  return ok ? 0 : 1;
}

}  // namespace moe_ep_test

int main(int argc, char** argv) {
  using namespace moe_ep_test;
  Ctx c;
  if (!parse(argc, argv, &c.opt)) {
    std::fprintf(stderr, "usage: %s --plugin=PATH --scenario=... (see worker_main.cc)\n",
                 argv[0]);
    return 2;
  }
  if (c.opt.plugin.empty()) c.opt.plugin = plugin_path(argv[0]);
  c.api = load_plugin(c.opt.plugin);
  // "mismatch": the last rank differs in one agreed key (--differ); every
  // rank's group_create must fail naming that key and both values (no
  // hang). "refused": group_create must fail as --expect_status /
  // --expect_error say (rules between the config and the world size).
  bool mismatch = c.opt.scenario == "mismatch";
  bool refused = mismatch || c.opt.scenario == "refused";
  const char* env_rank = std::getenv("MOE_EP_RANK");
  const char* env_world = std::getenv("MOE_EP_WORLD_SIZE");
  // Until group_info says, this process's rank is the launcher's word for it.
  const char* rank_s = env_rank ? env_rank : "?";
  std::string want_status = c.opt.expect_status, want_error = c.opt.expect_error;
  if (mismatch) {
    int& key = c.opt.differ == "ranks_per_node" ? c.opt.ranks_per_node : c.opt.max_tokens;
    want_status = "MOE_EP_ERR_MISMATCH";
    // Every rank names itself, and rank 0 against the first that differs.
    want_error = "group_create on rank {rank}: ranks disagree on the config: rank 0 vs rank " +
                 std::string(env_world ? std::to_string(std::atoi(env_world) - 1) : "?") + ": " +
                 c.opt.differ + ": " + std::to_string(key) + " vs " + std::to_string(key + 1);
    if (env_rank && env_world && std::atoi(env_rank) == std::atoi(env_world) - 1) key += 1;
  }
  size_t at = want_error.find("{rank}");
  if (at != std::string::npos) want_error.replace(at, 6, env_rank ? env_rank : "?");
  if (c.opt.scenario == "logger") install_test_logger(c);  // before the config: it sets log_level
  moe_ep_config_t* cfg = nullptr;
  std::string yaml = config_yaml(c.opt);
  if (c.api->config_from_yaml(yaml.c_str(), &cfg) != MOE_EP_OK) {
    std::fprintf(stderr, "FAIL rank=%s config: %s\n", rank_s, c.api->last_error());
    return 1;
  }
  moe_ep_group_params_t gp = MOE_EP_INIT(moe_ep_group_params_t);
  gp.config = cfg;
  gp.rank = -1;
  gp.world_size = -1;
  gp.cuda_device = -1;
  if (c.opt.backend == "nccl") {  // one GPU per local rank
    const char* lr = std::getenv("MOE_EP_LOCAL_RANK");
    gp.cuda_device = lr ? std::atoi(lr) : 0;
    c.gpu = gp.cuda_device;
    cuda_check(cudaSetDevice(gp.cuda_device), "cudaSetDevice");
  }
  void* comm = nullptr;
  if (c.opt.adopt_comm) {
    if (c.opt.backend != "nccl") {
      std::fprintf(stderr, "FAIL rank=%s adopt_comm: --adopt_comm=1 needs --backend=nccl\n",
                   rank_s);
      return 1;
    }
    comm = adopt_comm_create(c);
    if (comm == nullptr) {
      std::fprintf(stderr, "FAILED rank=%d checks=%d failures=%d\n", c.rank, c.checks, c.failures);
      return 1;
    }
    gp.nccl_comm = comm;
  }
  const bool hold_calls = c.opt.hold_ms > 0 && c.opt.scenario != "destroy_behind" &&
                          c.opt.scenario != "ht_count_behind" &&
                          c.opt.scenario != "first_launch_held";
  StreamHold* hold = hold_calls ? start_hold(c, "group_create") : nullptr;
  if (std::getenv("MOE_EP_TEST_TRACE")) std::fprintf(stderr, "trace group_create\n");
  const auto create_start = std::chrono::steady_clock::now();
  moe_ep_status_t st = c.api->group_create(&gp, &c.group);
  const double create_ms = std::chrono::duration<double, std::milli>(
                               std::chrono::steady_clock::now() - create_start)
                               .count();
  if (std::getenv("MOE_EP_TEST_TRACE")) std::fprintf(stderr, "trace group_create done\n");
  std::string create_error = c.api->last_error();
  if (hold != nullptr) end_hold(c, hold, create_ms, "group_create");
  uint64_t hint = 0;
  const char* ws = std::getenv("MOE_EP_WORLD_SIZE");
  moe_ep_status_t hint_st = c.api->buffer_size_hint(cfg, ws ? std::atoi(ws) : 1, &hint);
  c.api->config_free(cfg);
  if (refused) return expect_refused(c, st, create_error, want_status, want_error);
  if (c.opt.scenario == "setup_stall") return expect_setup_stall(c, st, create_error, create_ms);
  if (st != MOE_EP_OK) {
    std::fprintf(stderr, "FAIL rank=%s group_create: %s: %s\n", rank_s,
                 c.api->status_string(st), create_error.c_str());
    return 1;
  }
  moe_ep_group_info_t info = MOE_EP_INIT(moe_ep_group_info_t);
  c.api->group_info(c.group, &info);
  c.rank = info.rank;
  c.world = info.world_size;
  // buffer_size_hint is exact: it is what the group allocated.
  c.checks++;
  if (hint_st != MOE_EP_OK || hint != info.bytes_allocated) {
    fail(c, 0, "buffer_size_hint", "hint " + std::to_string(hint) + " (status " +
                                       std::to_string(hint_st) + ") but group_info reports " +
                                       std::to_string(info.bytes_allocated) + " bytes");
  }
  if (c.opt.backend == "nccl") {
    std::vector<int32_t> tr(info.world_size, -1);
    moe_ep_group_info_t ti = MOE_EP_INIT(moe_ep_group_info_t);
    ti.peer_transports = tr.data();
    ti.peer_transports_len = info.world_size;
    c.api->group_info(c.group, &ti);
    // LL's gin_emulated takes every peer through the emulated network; HT's
    // only the peers on other nodes (every rank a node when unset). LL's
    // auto takes it too when told the LSA team is on PCIe.
    const int node = c.opt.ranks_per_node > 0 ? c.opt.ranks_per_node : 1;
    const char* link = std::getenv("MOE_EP_LSA_LINK");
    const bool emulated = c.opt.transport == "gin_emulated" ||
                          (c.opt.transport == "auto" && !c.opt.ht && link != nullptr &&
                           std::string(link) == "pcie");
    for (int p = 0; p < info.world_size; p++) {
      const bool far = !c.opt.ht || p / node != info.rank / node;
      const int want = emulated && far ? MOE_EP_TRANSPORT_GIN_EMULATED : MOE_EP_TRANSPORT_LSA;
      c.checks++;
      if (p != info.rank && tr[p] != want) {
        fail(c, 0, "group_info peer_transports",
             "peer " + std::to_string(p) + " uses " + std::to_string(tr[p]) + ", expected " +
                 std::to_string(want));
      }
    }
    std::fprintf(stderr, "rank %d: nccl group, %llu buffer bytes, transport %s, ranks_per_node %d\n",
                 info.rank, static_cast<unsigned long long>(info.bytes_allocated),
                 c.opt.transport.c_str(), c.opt.ranks_per_node);
  }
  // A shape the oracle refuses is this rank's FAIL line, not an abort: the
  // group is still destroyed and the verdict still printed.
  try {
    run_scenario(c);
  } catch (const moe_ep_oracle::OracleError& e) {
    fail(c, 0, "oracle", e.what());
  }
  hold = hold_calls && c.group != nullptr ? start_hold(c, "group_destroy") : nullptr;
  const auto destroy_start = std::chrono::steady_clock::now();
  st = c.api->group_destroy(c.group);
  const double destroy_ms = std::chrono::duration<double, std::milli>(
                                std::chrono::steady_clock::now() - destroy_start)
                                .count();
  if (st != MOE_EP_OK) fail(c, 0, "group_destroy", c.api->last_error());
  if (hold != nullptr) end_hold(c, hold, destroy_ms, "group_destroy");
  adopt_comm_destroy(c, comm);  // after the group that borrowed it
  if (c.checks == 0) fail(c, 0, "worker", "ran no checks at all");
  std::fprintf(stderr, "%s rank=%d checks=%d failures=%d\n",
               c.failures ? "FAILED" : "PASSED", c.rank, c.checks, c.failures);
  return c.failures ? 1 : 0;
}
