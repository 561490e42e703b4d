// moe_ep_bench: the project's benchmark (docs/DESIGN.md, Performance method).
//
// One process per GPU, started by the launcher:
//   moe_ep_run -n 2 -- moe_ep_bench --plugin=libmoe_ep.so [flags]
// For every (dispatch dtype, hidden, tokens) it times, with CUDA events on
// one stream, dispatch and combine of libmoe_ep.so (backend nccl, loaded
// through moe_ep_loader.h) in one mode (--mode): low-latency, whole
// operations and send / receive halves (MOE_EP_FLAG_DEFER_RECV +
// hook_run); or high-throughput (prefill), whole operations. In the same
// run, on the same routing and byte counts, two references: NCCL's
// host-initiated all-to-all (ncclGroupStart + ncclSend/ncclRecv on a
// communicator of its own) and the peer-copy ceiling (cudaMemcpyPeerAsync
// to the next GPU, all ranks at once). Per-rank medians / p99s are gathered
// to rank 0 over that NCCL communicator; rank 0 prints the tables (and
// writes --json).
//
// This file sets the run up and walks the cases; the measurement of moe-ep
// is in bench_measure.cc (LL) and bench_ht.cc (HT), the references in
// bench_references.cc, the tables and JSON in bench_report.cc.
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "moe_ep.h"
#include "moe_ep_loader.h"
#include "tools/bench/bench_case.h"
#include "tools/bench/bench_flags.h"
#include "tools/bench/bench_ht.h"
#include "tools/bench/bench_measure.h"
#include "tools/bench/bench_references.h"
#include "tools/bench/bench_report.h"
#include "tools/bench/bench_setup.h"
#include "tools/bench/bench_util.h"

namespace mep_bench {
namespace {

// Each group gets its own bootstrap port (the launcher's, then +1, ...):
// a port a destroyed group just used can sit in TCP TIME_WAIT for a
// minute, and UCX's listener does not set SO_REUSEADDR.
void UseGroupPort(const std::string& base_address, int group_index) {
  const size_t colon = base_address.rfind(':');
  if (colon == std::string::npos) Die("MOE_EP_BOOTSTRAP_ADDRESS \"%s\" has no port", base_address.c_str());
  const int port = atoi(base_address.c_str() + colon + 1) + group_index;
  setenv("MOE_EP_BOOTSTRAP_ADDRESS", Fmt("%s:%d", base_address.substr(0, colon).c_str(), port).c_str(), 1);
}

// One group per dispatch dtype (a group-level config key) in the plan's
// mode, created for the maxima; every (tokens, hidden) runs on it. Returns
// rank 0's description.
moe_ep_group_t* CreateGroup(const Setup& s, const Plan& p, int fp8, moe_ep_config_t** cfg_out,
                            std::string* line) {
  std::string yaml = Fmt(
      "moe_ep:\n"
      "  backend: nccl\n"
      "  mode: %s\n"
      "  num_experts: %d\n"
      "  hidden: %d\n"
      "  top_k: %d\n"
      "  max_tokens_per_rank: %d\n"
      "  dispatch_dtype: %s\n"
      "  transport: %s\n"
      "  timeouts:\n"
      "    kernel_ms: 10000\n",
      p.ht ? "high_throughput" : "low_latency", p.experts, p.max_hidden, p.top_k, p.max_tokens,
      fp8 ? "fp8_e4m3" : "bf16",
      p.transport.c_str());
  moe_ep_config_t* cfg = nullptr;
  EP_CHECK(g_ep->config_from_yaml(yaml.c_str(), &cfg));
  moe_ep_group_params_t gp = MOE_EP_INIT(moe_ep_group_params_t);
  gp.config = cfg;
  gp.rank = s.rank;
  gp.world_size = s.world;
  gp.cuda_device = s.dev;
  if (absl::GetFlag(FLAGS_adopt_comm)) gp.nccl_comm = s.ref->comm;
  moe_ep_group_t* group = nullptr;
  EP_CHECK(g_ep->group_create(&gp, &group));
  if (absl::GetFlag(FLAGS_num_sms) > 0) EP_CHECK(g_ep->set_num_sms(group, absl::GetFlag(FLAGS_num_sms)));
  CUDA_CHECK(cudaSetDevice(s.dev));
  std::vector<int32_t> peer_t(s.world, -1);
  moe_ep_group_info_t info = MOE_EP_INIT(moe_ep_group_info_t);
  info.peer_transports = peer_t.data();
  info.peer_transports_len = s.world;
  EP_CHECK(g_ep->group_info(group, &info));
  if (info.num_local_experts != s.el) Die("group reports %d local experts, expected %d", info.num_local_experts, s.el);
  std::string pt;
  for (int q = 0; q < s.world; q++) pt += (q ? "," : "") + std::string(TransportName(peer_t[q]));
  *line = Fmt("%s %s group: %d SMs, %.1f MiB of buffers, peer transports [%s]", fp8 ? "fp8 " : "bf16",
              p.ht ? "HT" : "LL", info.num_sms, info.bytes_allocated / 1048576.0, pt.c_str());
  *cfg_out = cfg;
  return group;
}

int Main(int argc, char** argv) {
  // NVLink multicast stays off (README.md, GPUs); before any NCCL call.
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  RunInfo run;
  for (int i = 0; i < argc; i++) run.cmdline += (i ? " " : "") + std::string(argv[i]);
  absl::SetProgramUsageMessage(
      "moe_ep_run -n N -- moe_ep_bench --plugin=PATH [flags]\n"
      "  LL (decode):  moe_ep_run -n 2 -- moe_ep_bench --plugin=libmoe_ep.so --json=bench.json\n"
      "  HT (prefill): moe_ep_run -n 2 -- moe_ep_bench --plugin=libmoe_ep.so --mode=ht "
      "--dtype=bf16 --tokens=512,1024,2048,4096,8192 --num_sms=24");
  // --help lists the flags of the bench's own files (they live in
  // bench_flags.cc, not next to main, where Abseil looks by default).
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view path) {
    return path.find("tools/bench/") != absl::string_view::npos;
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  absl::SetFlagsUsageConfig(usage);
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) Die("unexpected argument '%s'", rest[1]);

  Setup s;
  s.rank = EnvInt("MOE_EP_RANK", 0);
  s.world = EnvInt("MOE_EP_WORLD_SIZE", 1);
  const int local_rank = EnvInt("MOE_EP_LOCAL_RANK", s.rank);
  g_rank = s.rank;
  if (s.world < 1 || s.rank >= s.world) Die("MOE_EP_RANK=%d / MOE_EP_WORLD_SIZE=%d are inconsistent", s.rank, s.world);
  const Plan p = ParseFlags(s.world);
  const int rank = s.rank, world = s.world;
  s.el = p.experts / world;
  s.top_k = p.top_k;
  s.seed = p.seed;
  s.iters = p.iters;
  s.slots = static_cast<int64_t>(world) * p.max_tokens;

  // ---- plugin (before any GPU call: a plan it cannot run stops here) -----
  char err[512];
  run.plugin = absl::GetFlag(FLAGS_plugin);
  void* lib = moe_ep_load(run.plugin.c_str(), &g_ep, err, sizeof err);
  if (lib == nullptr) Die("%s", err);
  EP_CHECK(g_ep->get_version(&run.vmaj, &run.vmin, &run.vpat));
  run.ht = p.ht;
  s.worst_case = p.ht && HtWorstCase(p, run.vmaj, run.vmin, &run.ht_dispatch);
  run.ht_worst_case = s.worst_case;

  // ---- devices -----------------------------------------------------------
  int ndev = 0;
  CUDA_CHECK(cudaGetDeviceCount(&ndev));
  if (local_rank >= ndev) Die("MOE_EP_LOCAL_RANK=%d but only %d CUDA devices are visible", local_rank, ndev);
  s.dev = local_rank;
  // The peer-copy ceiling copies to the next GPU of this node's ranks (one
  // GPU per local rank): never a GPU of another node, never one outside
  // the group when the node shows more GPUs than the group uses.
  const int node_gpus = world < ndev ? world : ndev;
  s.peer_dev = node_gpus > 1 ? (local_rank + 1) % node_gpus : -1;
  if (s.peer_dev >= ndev) Die("peer GPU %d (for the peer-copy ceiling) is not visible: %d devices", s.peer_dev, ndev);
  CUDA_CHECK(cudaSetDevice(s.dev));
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, s.dev));
  CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));

  // ---- reference communicator -------------------------------------------
  Ref ref;
  ref.world = world;
  ref.stream = s.stream;
  s.ref = &ref;
  ncclUniqueId id = ShareNcclId(rank, world);
  NCCL_CHECK(ncclCommInitRank(&ref.comm, world, id, rank));
  if (rank == 0 && world > 1) unlink(NcclIdPath().c_str());  // every rank has read it
  ref.barrier_buf = DevAlloc<int>(1);
  ref.gather_buf = DevAlloc<double>(static_cast<size_t>(world) * kNumStats);
  NCCL_CHECK(ncclGetVersion(&run.nccl_version));

  std::string me = Fmt("rank %d: GPU %d %s (sm_%d%d, %d SMs, %.0f GiB), peer-copy target GPU %s",
                       rank, s.dev, prop.name, prop.major, prop.minor, prop.multiProcessorCount,
                       prop.totalGlobalMem / 1073741824.0,
                       s.peer_dev >= 0 ? std::to_string(s.peer_dev).c_str() : "none (1 rank)");
  Buffers b;
  me += AllocBuffers(s, p, &b);
  run.devices = ref.GatherText(me);

  Timer timer;
  timer.Init(s.stream, p.iters, p.warmup, &ref);
  s.timer = &timer;

  run.world = world;
  run.experts = p.experts;
  run.el = s.el;
  run.top_k = p.top_k;
  run.tokens = p.tokens;
  run.hidden = p.hidden;
  run.transport = p.transport;
  run.seed = p.seed;
  run.routing_skew = p.routing_skew;
  run.iters = p.iters;
  run.warmup = p.warmup;
  if (rank == 0) PrintPreamble(run);

  std::vector<Case> cases;
  bool header_printed = false;
  const std::string base_address = [] {
    const char* a = getenv("MOE_EP_BOOTSTRAP_ADDRESS");
    return std::string(a != nullptr ? a : "127.0.0.1:29500");
  }();
  int group_index = 0;
  for (int fp8 : p.dtypes) {
    UseGroupPort(base_address, group_index++);
    moe_ep_config_t* cfg = nullptr;
    std::string line;
    moe_ep_group_t* group = CreateGroup(s, p, fp8, &cfg, &line);
    run.group_lines.push_back(line);
    if (rank == 0) PrintGroupLine(line);

    for (int H : p.hidden) {
      for (int T : p.tokens) {
        const Traffic tr =
            MakeTraffic(p.seed, rank, world, T, H, p.top_k, p.experts, fp8, p.routing_skew);
        std::vector<double> st(kNumStats, 0.0);
        if (p.ht) {
          MeasureHtCase(s, b, group, tr, fp8, H, T, &st);
        } else {
          MeasureLlCase(s, b, group, tr, fp8, H, T, &st);
        }
        Case c{fp8, H, T, ref.Gather(st)};
        cases.push_back(c);
        if (rank == 0) {
          if (!header_printed) {
            if (p.ht) {
              PrintHtHeader(run);
            } else {
              PrintLatencyHeader();
            }
            header_printed = true;
          }
          if (p.ht) {
            PrintHtRows(c, world);
          } else {
            PrintLatencyRows(c, world);
          }
        } else {
          fprintf(stderr, "rank %d: done %s hidden %d tokens %d\n", rank, RowsName(fp8), H, T);
        }
      }
    }
    EP_CHECK(g_ep->group_poll_error(group));
    EP_CHECK(g_ep->group_destroy(group));
    g_ep->config_free(cfg);
    CUDA_CHECK(cudaSetDevice(s.dev));
  }

  if (rank == 0) {
    if (p.ht) {
      PrintHtLegend();
    } else {
      PrintBandwidth(cases, world);
    }
    const std::string json = absl::GetFlag(FLAGS_json);
    if (!json.empty()) WriteJson(json, run, cases);
  }

  ref.Barrier();
  NCCL_CHECK(ncclCommDestroy(ref.comm));
  for (cudaEvent_t e : timer.ev) CUDA_CHECK(cudaEventDestroy(e));
  FreeBuffers(s, b);
  CUDA_CHECK(cudaFree(ref.barrier_buf));
  CUDA_CHECK(cudaFree(ref.gather_buf));
  CUDA_CHECK(cudaStreamDestroy(s.stream));
  moe_ep_unload(lib);
  return 0;
}

}  // namespace
}  // namespace mep_bench

int main(int argc, char** argv) { return mep_bench::Main(argc, argv); }
