// moe_ep_bench: the project's benchmark (docs/DESIGN.md, Performance method).
//
// One process per GPU, started by the launcher:
//   moe_ep_run -n 2 -- moe_ep_bench --plugin=libmoe_ep.so [flags]
// For every (dispatch dtype, hidden, tokens) it times, with CUDA events on
// one stream, LL dispatch and combine of libmoe_ep.so (backend nccl, loaded
// through moe_ep_loader.h): whole operations, and send / receive halves
// (MOE_EP_FLAG_DEFER_RECV + hook_run). In the same run, on the same routing
// and byte counts, two references: NCCL's host-initiated all-to-all
// (ncclGroupStart + ncclSend/ncclRecv on a communicator of its own) and the
// peer-copy ceiling (cudaMemcpyPeerAsync to the next GPU, all ranks at once).
// Per-rank medians / p99s are gathered to rank 0 over that NCCL
// communicator; rank 0 prints the tables (and writes --json).
#include <cuda_runtime.h>
#include <errno.h>
#include <fcntl.h>
#include <nccl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "moe_ep.h"
#include "moe_ep_loader.h"

ABSL_FLAG(std::string, plugin, "libmoe_ep.so", "path of libmoe_ep.so");
ABSL_FLAG(std::vector<std::string>, tokens, std::vector<std::string>({"1", "8", "32", "128", "256"}),
          "tokens per rank, comma list; the largest is the group's max_tokens_per_rank");
ABSL_FLAG(std::vector<std::string>, hidden, std::vector<std::string>({"7168"}),
          "hidden sizes, comma list (e.g. 7168,4096); the largest is the group's hidden");
ABSL_FLAG(int32_t, top_k, 8, "experts per token");
ABSL_FLAG(int32_t, experts, 256, "global expert count (a multiple of the rank count)");
ABSL_FLAG(std::string, dtype, "all", "dispatch dtype: fp8, bf16 or all");
ABSL_FLAG(int32_t, iters, 1000, "timed iterations per measurement");
ABSL_FLAG(int32_t, warmup, 100, "untimed iterations before each measurement (>= 1)");
ABSL_FLAG(std::string, transport, "auto", "auto, lsa or gin_emulated");
ABSL_FLAG(std::string, json, "", "also write the results as JSON to this path (rank 0)");
ABSL_FLAG(uint64_t, seed, 1, "seed of routing and inputs");
ABSL_FLAG(bool, sync_each_iter, false,
          "synchronize the stream after every iteration (diagnosis; times then include launch "
          "latency)");
ABSL_FLAG(bool, graph, false,
          "time the iterations as one CUDA graph (captured once, replayed) instead of eager "
          "launches: what a decode step under CUDA graphs sees, without the host's per-launch "
          "cost; the references are captured the same way");
ABSL_FLAG(bool, adopt_comm, false,
          "create the moe-ep groups on the bench's own NCCL communicator (group params "
          "nccl_comm: the engine-provided communicator path) instead of letting moe-ep make "
          "one; the references keep using it after each group is destroyed");
ABSL_FLAG(bool, dispatch_weights, true,
          "pass topk_weights to dispatch (combine then pre-reduces on the expert side and "
          "returns one row per (token, rank)); false: weights at combine only, one row back "
          "per (token, expert)");
ABSL_FLAG(int32_t, num_sms, 0,
          "SMs the moe-ep kernels may use (set_num_sms; 0: the group's default, every SM): "
          "what an engine that overlaps compute gives the communication kernels");
ABSL_FLAG(int32_t, id_wait_s, 120, "how long ranks > 0 wait for rank 0's NCCL id file");

namespace {

int g_rank = -1;

[[noreturn]] void Die(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void Die(const char* fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  fprintf(stderr, "moe_ep_bench rank %d: %s\n", g_rank, buf);
  fflush(stderr);
  fflush(stdout);
  _exit(1);  // no teardown: NCCL / plugin threads may be mid-operation
}

#define CUDA_CHECK(call)                                                                   \
  do {                                                                                     \
    cudaError_t e_ = (call);                                                               \
    if (e_ != cudaSuccess) Die("%s failed: %s (%s:%d)", #call, cudaGetErrorString(e_),     \
                               __FILE__, __LINE__);                                        \
  } while (0)

#define NCCL_CHECK(call)                                                                   \
  do {                                                                                     \
    ncclResult_t r_ = (call);                                                              \
    if (r_ != ncclSuccess) Die("%s failed: %s (%s:%d)", #call, ncclGetErrorString(r_),     \
                               __FILE__, __LINE__);                                        \
  } while (0)

const moe_ep_plugin_v1_t* g_ep = nullptr;

#define EP_CHECK(call)                                                                     \
  do {                                                                                     \
    moe_ep_status_t s_ = (call);                                                           \
    if (s_ != MOE_EP_OK) Die("%s failed: %s: %s", #call, g_ep->status_string(s_),          \
                             g_ep->last_error());                                          \
  } while (0)

int EnvInt(const char* name, int def) {
  const char* v = getenv(name);
  if (v == nullptr || *v == '\0') return def;
  char* end = nullptr;
  long x = strtol(v, &end, 10);
  if (*end != '\0' || x < 0 || x > 1 << 20) Die("environment %s='%s' is not a valid number", name, v);
  return static_cast<int>(x);
}

std::vector<int> IntList(const std::vector<std::string>& in, const char* flag, int lo, int hi) {
  std::vector<int> out;
  for (const std::string& s : in) {
    char* end = nullptr;
    long v = strtol(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0' || v < lo || v > hi) {
      Die("--%s: '%s' is not an integer in [%d, %d]", flag, s.c_str(), lo, hi);
    }
    out.push_back(static_cast<int>(v));
  }
  if (out.empty()) Die("--%s is empty", flag);
  return out;
}

double NowS() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// ---- deterministic random numbers (splitmix64: same on every machine) ----

struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed) {}
  uint64_t Next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double Uniform() { return static_cast<double>(Next() >> 11) / 9007199254740992.0; }
  uint32_t Below(uint32_t n) { return static_cast<uint32_t>(Uniform() * n); }
};

uint64_t Mix(uint64_t a, uint64_t b, uint64_t c) {
  Rng r(a * 0x2545F4914F6CDD1Dull ^ b * 0x9E3779B97F4A7C15ull ^ c * 0xD1B54A32D192ED03ull);
  r.Next();
  return r.Next();
}

uint16_t ToBf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// Uniform top-k distinct experts per token, for rank `rank`.
std::vector<int64_t> Routing(uint64_t seed, int rank, int tokens, int top_k, int experts) {
  Rng r(Mix(seed, 1000003ull + rank, tokens));
  std::vector<int64_t> idx(static_cast<size_t>(tokens) * top_k);
  for (int t = 0; t < tokens; t++) {
    int64_t* row = &idx[static_cast<size_t>(t) * top_k];
    for (int k = 0; k < top_k; k++) {
      int64_t e;
      do {
        e = r.Below(static_cast<uint32_t>(experts));
      } while (std::find(row, row + k, e) != row + k);
      row[k] = e;
    }
  }
  return idx;
}

// ---- statistics --------------------------------------------------------

struct Pct {
  double p50 = 0, p99 = 0;
};

Pct Percentiles(std::vector<float> v) {  // nearest rank, in microseconds
  Pct p;
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  size_t i50 = (n + 1) / 2 - 1;
  size_t i99 = static_cast<size_t>((99 * n + 99) / 100) - 1;
  p.p50 = v[i50] * 1e3;
  p.p99 = v[std::min(i99, n - 1)] * 1e3;
  return p;
}

// Per-rank numbers of one (dtype, hidden, tokens) case, gathered to rank 0.
enum Stat {
  kDisp, kComb, kDSend, kDRecv, kCSend, kCRecv, kA2aD, kA2aC, kPeer, kA2aDedup,  // p50, p99
  kTimes = 10,
  kBytesDisp = 2 * kTimes, kBytesDispDedup, kBytesComb, kBytesCombDedup, kBytesPeer,
  kHostUsFull, kHostUsHalves,
  kNumStats
};
const char* const kTimeNames[kTimes] = {"dispatch", "combine", "dispatch_send", "dispatch_recv",
                                        "combine_send", "combine_recv", "nccl_a2a_dispatch",
                                        "nccl_a2a_combine", "peer_copy",
                                        "nccl_a2a_dispatch_dedup"};

struct Case {
  int fp8, hidden, tokens;
  std::vector<double> all;  // [world][kNumStats]
};

// ---- the reference NCCL communicator -----------------------------------

// Rank 0's ncclUniqueId travels through a file named after the bootstrap
// port; the job token inside it tells this job's file from a stale one.
ncclUniqueId ShareNcclId(int rank, int world) {
  ncclUniqueId id;
  if (world == 1) {
    NCCL_CHECK(ncclGetUniqueId(&id));
    return id;
  }
  const char* addr = getenv("MOE_EP_BOOTSTRAP_ADDRESS");
  if (addr == nullptr || strchr(addr, ':') == nullptr) {
    Die("MOE_EP_BOOTSTRAP_ADDRESS is unset or has no ':port' (start the bench with moe_ep_run)");
  }
  const char* port = strrchr(addr, ':') + 1;
  for (const char* c = port; *c; c++) {
    if (*c < '0' || *c > '9') Die("MOE_EP_BOOTSTRAP_ADDRESS='%s': port is not a number", addr);
  }
  const char* tok = getenv("MOE_EP_JOB_TOKEN");
  std::string token = tok ? tok : "";
  if (token.size() > 200) token.resize(200);
  std::string path = std::string("/tmp/moe_ep_bench_ncclid_") + port;
  size_t bytes = token.size() + 1 + sizeof(id.internal);
  if (rank == 0) {
    NCCL_CHECK(ncclGetUniqueId(&id));
    std::string tmp = path + ".tmp." + std::to_string(getpid());
    int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) Die("cannot create %s: %s", tmp.c_str(), strerror(errno));
    std::string buf = token + "\n" + std::string(id.internal, sizeof(id.internal));
    if (write(fd, buf.data(), buf.size()) != static_cast<ssize_t>(buf.size()) || fsync(fd) != 0) {
      Die("cannot write %s: %s", tmp.c_str(), strerror(errno));
    }
    if (close(fd) != 0) Die("cannot close %s: %s", tmp.c_str(), strerror(errno));
    if (rename(tmp.c_str(), path.c_str()) != 0) {
      Die("cannot rename %s to %s: %s", tmp.c_str(), path.c_str(), strerror(errno));
    }
    return id;
  }
  double deadline = NowS() + absl::GetFlag(FLAGS_id_wait_s);
  for (;;) {
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      std::string buf(bytes + 1, '\0');
      ssize_t n = read(fd, &buf[0], buf.size());
      close(fd);
      if (n == static_cast<ssize_t>(bytes) && buf.compare(0, token.size() + 1, token + "\n") == 0) {
        memcpy(id.internal, buf.data() + token.size() + 1, sizeof(id.internal));
        return id;
      }
    }
    if (NowS() > deadline) {
      Die("no NCCL id from rank 0 in %s after %d s (--id_wait_s)", path.c_str(),
          absl::GetFlag(FLAGS_id_wait_s));
    }
    usleep(10000);
  }
}

struct Ref {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  int* barrier_buf = nullptr;
  double* gather_buf = nullptr;  // [world][kNumStats]
  int world = 1;

  void Barrier() {
    NCCL_CHECK(ncclAllReduce(barrier_buf, barrier_buf, 1, ncclInt32, ncclSum, comm, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  std::vector<double> Gather(const std::vector<double>& mine) {
    CUDA_CHECK(cudaMemcpyAsync(gather_buf + static_cast<size_t>(g_rank) * kNumStats, mine.data(),
                               kNumStats * sizeof(double), cudaMemcpyHostToDevice, stream));
    NCCL_CHECK(ncclAllGather(gather_buf + static_cast<size_t>(g_rank) * kNumStats, gather_buf,
                             kNumStats, ncclFloat64, comm, stream));
    std::vector<double> all(static_cast<size_t>(world) * kNumStats);
    CUDA_CHECK(cudaMemcpyAsync(all.data(), gather_buf, all.size() * sizeof(double),
                               cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    return all;
  }
  std::vector<std::string> GatherText(const std::string& mine) {
    const size_t kLen = 256;
    char* buf = nullptr;
    CUDA_CHECK(cudaMalloc(&buf, kLen * world));
    std::string padded = mine.substr(0, kLen - 1);
    padded.resize(kLen, '\0');
    CUDA_CHECK(cudaMemcpyAsync(buf + kLen * g_rank, padded.data(), kLen, cudaMemcpyHostToDevice,
                               stream));
    NCCL_CHECK(ncclAllGather(buf + kLen * g_rank, buf, kLen, ncclInt8, comm, stream));
    std::vector<char> host(kLen * world);
    CUDA_CHECK(cudaMemcpyAsync(host.data(), buf, host.size(), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    CUDA_CHECK(cudaFree(buf));
    std::vector<std::string> out;
    for (int r = 0; r < world; r++) out.emplace_back(host.data() + kLen * r);
    return out;
  }
};

// ---- tensors -----------------------------------------------------------

struct Desc {
  int64_t shape[3];
  moe_ep_tensor_t t;
  void Set(void* data, int code, int bits, int dev, std::vector<int64_t> dims) {
    memset(&t, 0, sizeof t);
    for (size_t i = 0; i < dims.size(); i++) shape[i] = dims[i];
    t.data = data;
    t.device = {MOE_EP_DEVICE_CUDA, dev};
    t.ndim = static_cast<int32_t>(dims.size());
    t.dtype = {static_cast<uint8_t>(code), static_cast<uint8_t>(bits), 1};
    t.shape = shape;
    t.strides = nullptr;
  }
};

template <typename T>
T* DevAlloc(size_t count) {
  T* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T)));
  CUDA_CHECK(cudaMemset(p, 0, std::max<size_t>(count, 1) * sizeof(T)));
  return p;
}

// ---- timing loops ------------------------------------------------------

// Runs `warmup` untimed then `iters` timed iterations of body(i, rec), where
// rec(j) records event j of the iteration; returns per-segment times (ms)
// between consecutive events, [segments][iters], and the host seconds the
// timed loop took to enqueue and finish.
struct Timer {
  cudaStream_t stream;
  std::vector<cudaEvent_t> ev;  // iters * kMaxPoints
  static const int kMaxPoints = 5;
  int iters, warmup;
  bool sync_each, graph;
  Ref* ref;

  void Init(cudaStream_t s, int it, int wu, Ref* r) {
    stream = s;
    iters = it;
    warmup = wu;
    ref = r;
    sync_each = absl::GetFlag(FLAGS_sync_each_iter);
    graph = absl::GetFlag(FLAGS_graph);
    ev.resize(static_cast<size_t>(iters) * kMaxPoints);
    for (cudaEvent_t& e : ev) CUDA_CHECK(cudaEventCreate(&e));
  }
  std::vector<std::vector<float>> Run(int points, const std::function<void(int, const std::function<void(int)>&)>& body,
                                      const std::function<void()>& after_warmup, double* host_s,
                                      bool allow_graph = true) {
    auto none = [](int) {};
    ref->Barrier();
    for (int i = 0; i < warmup; i++) {
      body(i, none);
      if (sync_each) CUDA_CHECK(cudaStreamSynchronize(stream));
    }
    CUDA_CHECK(cudaStreamSynchronize(stream));
    if (after_warmup) after_warmup();
    double t0 = 0;
    if (graph && allow_graph) {
      // Every timed iteration goes into one graph; events become record
      // nodes (External: a plain record in a capture is only a dependency).
      cudaGraph_t g = nullptr;
      cudaGraphExec_t ge = nullptr;
      CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      for (int i = 0; i < iters; i++) {
        cudaEvent_t* e = &ev[static_cast<size_t>(i) * kMaxPoints];
        body(i, [&](int j) { CUDA_CHECK(cudaEventRecordWithFlags(e[j], stream, cudaEventRecordExternal)); });
      }
      CUDA_CHECK(cudaStreamEndCapture(stream, &g));
      CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
      ref->Barrier();
      CUDA_CHECK(cudaGraphLaunch(ge, stream));  // a warm replay, untimed
      CUDA_CHECK(cudaStreamSynchronize(stream));
      ref->Barrier();
      t0 = NowS();
      CUDA_CHECK(cudaGraphLaunch(ge, stream));
      CUDA_CHECK(cudaStreamSynchronize(stream));
      CUDA_CHECK(cudaGraphExecDestroy(ge));
      CUDA_CHECK(cudaGraphDestroy(g));
    } else {
      ref->Barrier();
      t0 = NowS();
      for (int i = 0; i < iters; i++) {
        cudaEvent_t* e = &ev[static_cast<size_t>(i) * kMaxPoints];
        body(i, [&](int j) { CUDA_CHECK(cudaEventRecord(e[j], stream)); });
        if (sync_each) CUDA_CHECK(cudaStreamSynchronize(stream));
      }
      CUDA_CHECK(cudaStreamSynchronize(stream));
    }
    if (host_s) *host_s = NowS() - t0;
    std::vector<std::vector<float>> seg(points - 1, std::vector<float>(iters));
    for (int i = 0; i < iters; i++) {
      cudaEvent_t* e = &ev[static_cast<size_t>(i) * kMaxPoints];
      for (int j = 0; j + 1 < points; j++) CUDA_CHECK(cudaEventElapsedTime(&seg[j][i], e[j], e[j + 1]));
    }
    return seg;
  }
};

std::string Fmt(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string Fmt(const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

const char* TransportName(int t) {
  static const char* const n[] = {"auto", "lsa", "gin", "gin_emulated", "ucx_host"};
  return t >= 0 && t < 5 ? n[t] : "?";
}

std::string JsonEscape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\', o += c;
    else if (static_cast<unsigned char>(c) < 0x20) o += Fmt("\\u%04x", c);
    else o += c;
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  // NVLink multicast stays off (README.md, GPUs); before any NCCL call.
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  std::string cmdline;
  for (int i = 0; i < argc; i++) cmdline += (i ? " " : "") + std::string(argv[i]);
  absl::SetProgramUsageMessage("moe_ep_run -n N -- moe_ep_bench --plugin=PATH [flags]");
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) Die("unexpected argument '%s'", rest[1]);

  const int rank = EnvInt("MOE_EP_RANK", 0);
  const int world = EnvInt("MOE_EP_WORLD_SIZE", 1);
  const int local_rank = EnvInt("MOE_EP_LOCAL_RANK", rank);
  g_rank = rank;
  if (world < 1 || rank >= world) Die("MOE_EP_RANK=%d / MOE_EP_WORLD_SIZE=%d are inconsistent", rank, world);

  const std::vector<int> tokens_list = IntList(absl::GetFlag(FLAGS_tokens), "tokens", 1, 1024);
  const std::vector<int> hidden_list = IntList(absl::GetFlag(FLAGS_hidden), "hidden", 128, 65536);
  const int top_k = absl::GetFlag(FLAGS_top_k), experts = absl::GetFlag(FLAGS_experts);
  const int iters = absl::GetFlag(FLAGS_iters), warmup = absl::GetFlag(FLAGS_warmup);
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  const std::string transport = absl::GetFlag(FLAGS_transport), dtype = absl::GetFlag(FLAGS_dtype);
  if (top_k < 1 || top_k > 32) Die("--top_k=%d must be in [1, 32]", top_k);
  if (experts < top_k || experts % world != 0) {
    Die("--experts=%d must be >= top_k=%d and a multiple of the rank count %d", experts, top_k, world);
  }
  if (iters < 1 || iters > 1000000) Die("--iters=%d must be in [1, 1000000]", iters);
  // >= 1: recv_count is checked against the routing after the warmup.
  if (warmup < 1) Die("--warmup=%d must be >= 1", warmup);
  if (transport != "auto" && transport != "lsa" && transport != "gin_emulated") {
    Die("--transport=%s: allowed auto, lsa, gin_emulated", transport.c_str());
  }
  std::vector<int> dtypes;  // 1 = fp8
  if (dtype == "fp8" || dtype == "all") dtypes.push_back(1);
  if (dtype == "bf16" || dtype == "all") dtypes.push_back(0);
  if (dtypes.empty()) Die("--dtype=%s: allowed fp8, bf16, all", dtype.c_str());
  for (int h : hidden_list) {
    if (h % 128 != 0) Die("--hidden=%d must be a multiple of 128 (fp8 scales cover 128 channels)", h);
  }
  const int max_tokens = *std::max_element(tokens_list.begin(), tokens_list.end());
  const int max_hidden = *std::max_element(hidden_list.begin(), hidden_list.end());
  const int el = experts / world;

  // ---- devices -----------------------------------------------------------
  int ndev = 0;
  CUDA_CHECK(cudaGetDeviceCount(&ndev));
  if (local_rank >= ndev) Die("MOE_EP_LOCAL_RANK=%d but only %d CUDA devices are visible", local_rank, ndev);
  const int dev = local_rank;
  const int peer_dev = world > 1 ? (local_rank + 1) % world : -1;
  if (peer_dev >= ndev) Die("peer GPU %d (for the peer-copy ceiling) is not visible: %d devices", peer_dev, ndev);
  CUDA_CHECK(cudaSetDevice(dev));
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  // ---- plugin ------------------------------------------------------------
  char err[512];
  const std::string plugin = absl::GetFlag(FLAGS_plugin);
  void* lib = moe_ep_load(plugin.c_str(), &g_ep, err, sizeof err);
  if (lib == nullptr) Die("%s", err);
  int vmaj = 0, vmin = 0, vpat = 0;
  EP_CHECK(g_ep->get_version(&vmaj, &vmin, &vpat));

  // ---- reference communicator -------------------------------------------
  Ref ref;
  ref.world = world;
  ref.stream = stream;
  ncclUniqueId id = ShareNcclId(rank, world);
  NCCL_CHECK(ncclCommInitRank(&ref.comm, world, id, rank));
  if (rank == 0 && world > 1) {
    // Every rank has joined, so every rank has read the id file.
    const char* addr = getenv("MOE_EP_BOOTSTRAP_ADDRESS");
    unlink((std::string("/tmp/moe_ep_bench_ncclid_") + (strrchr(addr, ':') + 1)).c_str());
  }
  ref.barrier_buf = DevAlloc<int>(1);
  ref.gather_buf = DevAlloc<double>(static_cast<size_t>(world) * kNumStats);
  int nccl_version = 0;
  NCCL_CHECK(ncclGetVersion(&nccl_version));

  std::string me = Fmt("rank %d: GPU %d %s (sm_%d%d, %d SMs, %.0f GiB), peer-copy target GPU %s",
                       rank, dev, prop.name, prop.major, prop.minor, prop.multiProcessorCount,
                       prop.totalGlobalMem / 1073741824.0,
                       peer_dev >= 0 ? std::to_string(peer_dev).c_str() : "none (1 rank)");

  // ---- peer-copy target --------------------------------------------------
  const size_t max_row = static_cast<size_t>(max_hidden) * 2;
  const size_t max_copy = static_cast<size_t>(max_tokens) * top_k * max_row;
  uint8_t* copy_src = DevAlloc<uint8_t>(max_copy);
  uint8_t* copy_dst = nullptr;
  std::string peer_note;
  if (peer_dev >= 0) {
    int can = 0;
    CUDA_CHECK(cudaDeviceCanAccessPeer(&can, dev, peer_dev));
    if (can) {
      cudaError_t e = cudaDeviceEnablePeerAccess(peer_dev, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) {
        (void)cudaGetLastError();
      } else {
        CUDA_CHECK(e);
      }
    } else {
      peer_note = " (no peer access: staged copies, not a ceiling)";
    }
    CUDA_CHECK(cudaSetDevice(peer_dev));
    CUDA_CHECK(cudaMalloc(&copy_dst, max_copy));
    CUDA_CHECK(cudaSetDevice(dev));
  }
  me += peer_note;
  std::vector<std::string> devices = ref.GatherText(me);

  // ---- buffers (sized for the maxima) -----------------------------------
  const int64_t slots = static_cast<int64_t>(world) * max_tokens;
  int64_t* d_topk = DevAlloc<int64_t>(static_cast<size_t>(max_tokens) * top_k);
  uint16_t* d_x = DevAlloc<uint16_t>(static_cast<size_t>(max_tokens) * max_hidden);
  float* d_w = DevAlloc<float>(static_cast<size_t>(max_tokens) * top_k);
  uint16_t* d_out = DevAlloc<uint16_t>(static_cast<size_t>(max_tokens) * max_hidden);
  uint8_t* d_recv_x = DevAlloc<uint8_t>(static_cast<size_t>(el) * slots * max_hidden * 2);
  float* d_recv_scales = DevAlloc<float>(static_cast<size_t>(el) * slots * (max_hidden / 128));
  int32_t* d_recv_count = DevAlloc<int32_t>(el);
  uint16_t* d_y = DevAlloc<uint16_t>(static_cast<size_t>(el) * slots * max_hidden);
  // y: bf16 0x3F3F (about 0.75) everywhere; its value does not change the timing.
  CUDA_CHECK(cudaMemset(d_y, 0x3F, static_cast<size_t>(el) * slots * max_hidden * 2));
  const size_t a2a_max = static_cast<size_t>(world) * max_tokens * top_k * max_row;
  int8_t* d_a2a_send = DevAlloc<int8_t>(a2a_max);
  int8_t* d_a2a_recv = DevAlloc<int8_t>(a2a_max);

  Timer timer;
  timer.Init(stream, iters, warmup, &ref);

  if (rank == 0) {
    printf("moe_ep_bench: moe_ep_run -n %d -- %s\n", world, cmdline.c_str());
    for (const std::string& d : devices) printf("  %s\n", d.c_str());
    printf("  plugin %s (moe_ep %d.%d.%d), NCCL %d (reference communicator), NCCL_NVLS_ENABLE=%s\n",
           plugin.c_str(), vmaj, vmin, vpat, nccl_version, getenv("NCCL_NVLS_ENABLE"));
    printf("  experts %d (%d per rank), top_k %d, tokens %s, hidden %s, transport %s, seed %llu, "
           "%d timed iterations after %d warmup, CUDA events on one stream; times in us\n",
           experts, el, top_k, [&] {
             std::string s;
             for (int t : tokens_list) s += (s.empty() ? "" : ",") + std::to_string(t);
             return s;
           }().c_str(),
           [&] {
             std::string s;
             for (int h : hidden_list) s += (s.empty() ? "" : ",") + std::to_string(h);
             return s;
           }().c_str(),
           transport.c_str(), static_cast<unsigned long long>(seed), iters, warmup);
    if (iters < 1000) printf("  note: fewer than 1000 timed iterations, p99 is rough\n");
    if (absl::GetFlag(FLAGS_adopt_comm))
      printf("  moe-ep groups adopt the reference communicator (--adopt_comm)\n");
    fflush(stdout);
  }

  std::vector<Case> cases;
  std::vector<std::string> group_lines;
  bool header_printed = false;

  // Each group gets its own bootstrap port (the launcher's, then +1, ...):
  // a port a destroyed group just used can sit in TCP TIME_WAIT for a
  // minute, and UCX's listener does not set SO_REUSEADDR.
  const std::string base_address = [] {
    const char* a = getenv("MOE_EP_BOOTSTRAP_ADDRESS");
    return std::string(a != nullptr ? a : "127.0.0.1:29500");
  }();
  int group_index = 0;
  for (int fp8 : dtypes) {
    // One group per dispatch dtype (a group-level config key), created for
    // the maxima; every (tokens, hidden) below runs on it.
    {
      const size_t colon = base_address.rfind(':');
      if (colon == std::string::npos) Die("MOE_EP_BOOTSTRAP_ADDRESS \"%s\" has no port", base_address.c_str());
      const int port = atoi(base_address.c_str() + colon + 1) + group_index++;
      setenv("MOE_EP_BOOTSTRAP_ADDRESS", Fmt("%s:%d", base_address.substr(0, colon).c_str(), port).c_str(), 1);
    }
    std::string yaml = Fmt(
        "moe_ep:\n"
        "  backend: nccl\n"
        "  mode: low_latency\n"
        "  num_experts: %d\n"
        "  hidden: %d\n"
        "  top_k: %d\n"
        "  max_tokens_per_rank: %d\n"
        "  dispatch_dtype: %s\n"
        "  transport: %s\n"
        "  timeouts:\n"
        "    kernel_ms: 10000\n",
        experts, max_hidden, top_k, max_tokens, fp8 ? "fp8_e4m3" : "bf16", transport.c_str());
    moe_ep_config_t* cfg = nullptr;
    EP_CHECK(g_ep->config_from_yaml(yaml.c_str(), &cfg));
    moe_ep_group_params_t gp = MOE_EP_INIT(moe_ep_group_params_t);
    gp.config = cfg;
    gp.rank = rank;
    gp.world_size = world;
    gp.cuda_device = dev;
    if (absl::GetFlag(FLAGS_adopt_comm)) gp.nccl_comm = ref.comm;
    moe_ep_group_t* group = nullptr;
    EP_CHECK(g_ep->group_create(&gp, &group));
    if (absl::GetFlag(FLAGS_num_sms) > 0) EP_CHECK(g_ep->set_num_sms(group, absl::GetFlag(FLAGS_num_sms)));
    CUDA_CHECK(cudaSetDevice(dev));
    std::vector<int32_t> peer_t(world, -1);
    moe_ep_group_info_t info = MOE_EP_INIT(moe_ep_group_info_t);
    info.peer_transports = peer_t.data();
    info.peer_transports_len = world;
    EP_CHECK(g_ep->group_info(group, &info));
    if (info.num_local_experts != el) Die("group reports %d local experts, expected %d", info.num_local_experts, el);
    {
      std::string pt;
      for (int p = 0; p < world; p++) pt += (p ? "," : "") + std::string(TransportName(peer_t[p]));
      group_lines.push_back(Fmt("%s group: %d SMs, %.1f MiB of buffers, peer transports [%s]",
                                fp8 ? "fp8 " : "bf16", info.num_sms,
                                info.bytes_allocated / 1048576.0, pt.c_str()));
      if (rank == 0) {
        printf("  rank 0 %s\n", group_lines.back().c_str());
        fflush(stdout);
      }
    }

    for (int H : hidden_list) {
      for (int T : tokens_list) {
        const int R = world;
        const size_t row_disp = fp8 ? static_cast<size_t>(H) + H / 128 * 4 : static_cast<size_t>(H) * 2;
        const size_t row_comb = static_cast<size_t>(H) * 2;
        // Routing of every rank (deterministic from the seed), so each rank
        // knows what it receives from each peer.
        std::vector<std::vector<int64_t>> routes(R);
        for (int q = 0; q < R; q++) routes[q] = Routing(seed, q, T, top_k, experts);
        // pairs[q][p]: (token, k) pairs rank q sends to rank p; dedup: tokens.
        std::vector<std::vector<int64_t>> pairs(R, std::vector<int64_t>(R, 0)), toks = pairs;
        for (int q = 0; q < R; q++) {
          for (int t = 0; t < T; t++) {
            std::set<int> dst;
            for (int k = 0; k < top_k; k++) {
              int p = static_cast<int>(routes[q][static_cast<size_t>(t) * top_k + k] / el);
              pairs[q][p]++;
              dst.insert(p);
            }
            for (int p : dst) toks[q][p]++;
          }
        }
        std::vector<double> st(kNumStats, 0.0);
        for (int p = 0; p < R; p++) {
          if (p == rank) continue;
          st[kBytesDisp] += pairs[rank][p] * static_cast<double>(row_disp);
          st[kBytesDispDedup] += toks[rank][p] * static_cast<double>(row_disp);
          st[kBytesComb] += pairs[rank][p] * static_cast<double>(row_comb);
          st[kBytesCombDedup] += toks[rank][p] * static_cast<double>(row_comb);
        }
        st[kBytesPeer] = st[kBytesDisp];
        std::vector<int32_t> want_count(el, 0);
        for (int q = 0; q < R; q++) {
          for (int64_t e : routes[q]) {
            if (e / el == rank) want_count[e % el]++;
          }
        }

        // Inputs on the device.
        {
          Rng r(Mix(seed, 2000003ull + rank, static_cast<uint64_t>(T) << 20 | H));
          std::vector<uint16_t> x(static_cast<size_t>(T) * H);
          for (uint16_t& v : x) v = ToBf16(static_cast<float>(r.Uniform() * 4.0 - 2.0));
          std::vector<float> w(static_cast<size_t>(T) * top_k);
          for (int t = 0; t < T; t++) {
            double sum = 0;
            for (int k = 0; k < top_k; k++) sum += (w[t * top_k + k] = static_cast<float>(0.05 + r.Uniform()));
            for (int k = 0; k < top_k; k++) w[t * top_k + k] = static_cast<float>(w[t * top_k + k] / sum);
          }
          CUDA_CHECK(cudaMemcpy(d_x, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
          CUDA_CHECK(cudaMemcpy(d_w, w.data(), w.size() * 4, cudaMemcpyHostToDevice));
          CUDA_CHECK(cudaMemcpy(d_topk, routes[rank].data(), routes[rank].size() * 8, cudaMemcpyHostToDevice));
          // Pageable copies may still be in flight; the bench stream does not wait for them.
          CUDA_CHECK(cudaDeviceSynchronize());
        }
        Desc t_topk, t_x, t_w, t_out, t_rx, t_rs, t_rc, t_y;
        t_topk.Set(d_topk, MOE_EP_DTYPE_INT, 64, dev, {T, top_k});
        t_x.Set(d_x, MOE_EP_DTYPE_BFLOAT, 16, dev, {T, H});
        t_w.Set(d_w, MOE_EP_DTYPE_FLOAT, 32, dev, {T, top_k});
        t_out.Set(d_out, MOE_EP_DTYPE_BFLOAT, 16, dev, {T, H});
        t_rx.Set(d_recv_x, fp8 ? MOE_EP_DTYPE_FLOAT8_E4M3FN : MOE_EP_DTYPE_BFLOAT, fp8 ? 8 : 16, dev,
                 {el, slots, H});
        t_rs.Set(d_recv_scales, MOE_EP_DTYPE_FLOAT, 32, dev, {el, slots, H / 128});
        t_rc.Set(d_recv_count, MOE_EP_DTYPE_INT, 32, dev, {el});
        t_y.Set(d_y, MOE_EP_DTYPE_BFLOAT, 16, dev, {el, slots, H});

        moe_ep_prepare_params_t pp = MOE_EP_INIT(moe_ep_prepare_params_t);
        pp.topk_idx = &t_topk.t;
        pp.num_tokens = T;
        pp.top_k = top_k;
        pp.stream = stream;
        moe_ep_dispatch_params_t dp = MOE_EP_INIT(moe_ep_dispatch_params_t);
        dp.hidden = H;
        dp.x = &t_x.t;
        dp.stream = stream;
        dp.recv_x = &t_rx.t;
        dp.recv_scales = fp8 ? &t_rs.t : nullptr;
        dp.recv_count = &t_rc.t;
        if (absl::GetFlag(FLAGS_dispatch_weights)) dp.topk_weights = &t_w.t;
        moe_ep_combine_params_t cp = MOE_EP_INIT(moe_ep_combine_params_t);
        cp.hidden = H;
        cp.y = &t_y.t;
        cp.topk_weights = &t_w.t;
        cp.out = &t_out.t;
        cp.stream = stream;

        // (a, b) whole dispatch (prepare + dispatch) and whole combine.
        auto full = [&](int, const std::function<void(int)>& rec) {
          moe_ep_handle_t* h = nullptr;
          moe_ep_hook_t* hook = nullptr;
          rec(0);
          EP_CHECK(g_ep->prepare(group, &pp, &h));
          dp.flags = 0;
          EP_CHECK(g_ep->dispatch(group, h, &dp, &hook));
          rec(1);
          cp.flags = 0;
          EP_CHECK(g_ep->combine(group, h, &cp, &hook));
          rec(2);
          g_ep->handle_free(h);
        };
        auto check_counts = [&] {
          std::vector<int32_t> got(el);
          CUDA_CHECK(cudaMemcpy(got.data(), d_recv_count, el * 4, cudaMemcpyDeviceToHost));
          for (int e = 0; e < el; e++) {
            if (got[e] != want_count[e]) {
              Die("%s H=%d T=%d: recv_count[%d]=%d after dispatch, the routing sends %d rows: the "
                  "benchmark would time a wrong result",
                  fp8 ? "fp8" : "bf16", H, T, e, got[e], want_count[e]);
            }
          }
          EP_CHECK(g_ep->group_poll_error(group));
        };
        double host_s = 0;
        auto seg = timer.Run(3, full, check_counts, &host_s);
        st[kHostUsFull] = host_s / iters * 1e6;
        Pct p;
        p = Percentiles(seg[0]); st[2 * kDisp] = p.p50; st[2 * kDisp + 1] = p.p99;
        p = Percentiles(seg[1]); st[2 * kComb] = p.p50; st[2 * kComb + 1] = p.p99;

        // (c) send and receive halves through hooks.
        auto halves = [&](int, const std::function<void(int)>& rec) {
          moe_ep_handle_t* h = nullptr;
          moe_ep_hook_t* hook = nullptr;
          rec(0);
          EP_CHECK(g_ep->prepare(group, &pp, &h));
          dp.flags = MOE_EP_FLAG_DEFER_RECV;
          EP_CHECK(g_ep->dispatch(group, h, &dp, &hook));
          if (hook == nullptr) Die("dispatch with MOE_EP_FLAG_DEFER_RECV returned no hook");
          rec(1);
          EP_CHECK(g_ep->hook_run(hook, stream));
          g_ep->hook_free(hook);
          rec(2);
          hook = nullptr;
          cp.flags = MOE_EP_FLAG_DEFER_RECV;
          EP_CHECK(g_ep->combine(group, h, &cp, &hook));
          if (hook == nullptr) Die("combine with MOE_EP_FLAG_DEFER_RECV returned no hook");
          rec(3);
          EP_CHECK(g_ep->hook_run(hook, stream));
          g_ep->hook_free(hook);
          rec(4);
          g_ep->handle_free(h);
        };
        seg = timer.Run(5, halves, check_counts, &host_s);
        st[kHostUsHalves] = host_s / iters * 1e6;
        for (int j = 0; j < 4; j++) {
          p = Percentiles(seg[j]);
          st[2 * (kDSend + j)] = p.p50;
          st[2 * (kDSend + j) + 1] = p.p99;
        }
        EP_CHECK(g_ep->group_poll_error(group));

        // Reference 1: NCCL all-to-all of the dispatch (and the combine)
        // bytes per peer, one row per (token, expert): what a plain
        // all-to-all dispatch moves; int8 counts. which == 2: the dispatch
        // rows once per (token, destination rank), the bytes moe-ep's
        // dispatch moves since it deduplicates.
        for (int which = 0; which < 3; which++) {
          const size_t row = which == 1 ? row_comb : row_disp;
          const std::vector<std::vector<int64_t>>& n = which == 2 ? toks : pairs;
          std::vector<size_t> sc(R), rc(R), so(R + 1, 0), ro(R + 1, 0);
          for (int p2 = 0; p2 < R; p2++) {
            // dispatch: I send my rows to p2, receive p2's rows for me;
            // combine: the reverse direction of the same pairs.
            int64_t out_pairs = which != 1 ? n[rank][p2] : n[p2][rank];
            int64_t in_pairs = which != 1 ? n[p2][rank] : n[rank][p2];
            sc[p2] = p2 == rank ? 0 : out_pairs * row;
            rc[p2] = p2 == rank ? 0 : in_pairs * row;
            so[p2 + 1] = so[p2] + sc[p2];
            ro[p2 + 1] = ro[p2] + rc[p2];
          }
          if (so[R] > a2a_max || ro[R] > a2a_max) Die("internal: all-to-all buffers too small");
          auto a2a = [&](int, const std::function<void(int)>& rec) {
            rec(0);
            NCCL_CHECK(ncclGroupStart());
            for (int p2 = 0; p2 < R; p2++) {
              if (sc[p2]) NCCL_CHECK(ncclSend(d_a2a_send + so[p2], sc[p2], ncclInt8, p2, ref.comm, stream));
              if (rc[p2]) NCCL_CHECK(ncclRecv(d_a2a_recv + ro[p2], rc[p2], ncclInt8, p2, ref.comm, stream));
            }
            NCCL_CHECK(ncclGroupEnd());
            rec(1);
          };
          seg = timer.Run(2, a2a, nullptr, nullptr);
          p = Percentiles(seg[0]);
          int s = which == 0 ? kA2aD : which == 1 ? kA2aC : kA2aDedup;
          st[2 * s] = p.p50;
          st[2 * s + 1] = p.p99;
        }

        // Reference 2: peer-copy ceiling, this rank's dispatch bytes to the
        // next GPU, every rank at once.
        if (peer_dev >= 0 && st[kBytesPeer] > 0) {
          const size_t n = static_cast<size_t>(st[kBytesPeer]);
          auto copy = [&](int, const std::function<void(int)>& rec) {
            rec(0);
            CUDA_CHECK(cudaMemcpyPeerAsync(copy_dst, peer_dev, copy_src, dev, n, stream));
            rec(1);
          };
          // Peer copies to another process's memory cannot be captured:
          // the ceiling is always timed with eager launches.
          seg = timer.Run(2, copy, nullptr, nullptr, false);
          p = Percentiles(seg[0]);
          st[2 * kPeer] = p.p50;
          st[2 * kPeer + 1] = p.p99;
        }

        Case c{fp8, H, T, ref.Gather(st)};
        cases.push_back(c);
        if (rank == 0) {
          if (!header_printed) {
            printf("\nlatency (us, per rank; %s; dispatch = prepare + dispatch; send/recv = "
                   "halves through DEFER_RECV + hook_run)\n",
                   absl::GetFlag(FLAGS_graph)
                       ? "all iterations in one CUDA graph; the peer-copy ceiling eager"
                       : "eager launches");
            printf("combine: %s\n", absl::GetFlag(FLAGS_dispatch_weights)
                                         ? "weights given to dispatch: expert-side partials, "
                                           "one row back per (token, rank)"
                                         : "weights at combine only: one row back per "
                                           "(token, expert)");
            printf("%-5s %6s %6s %4s | %15s | %15s | %15s | %15s | %15s | %15s | %15s | %8s | "
                   "%15s | %8s | %15s | %8s\n",
                   "dtype", "hidden", "tokens", "rank", "dispatch p50/99", "combine p50/99",
                   "d.send p50/99", "d.recv p50/99", "c.send p50/99", "c.recv p50/99",
                   "nccl a2a p50/99", "vs nccl", "a2a dedup p50/99", "vs dedup",
                   "nccl comb p50/99", "c vs nccl");
            header_printed = true;
          }
          for (int r = 0; r < R; r++) {
            const double* v = &c.all[static_cast<size_t>(r) * kNumStats];
            std::string cols;
            for (int s2 : {kDisp, kComb, kDSend, kDRecv, kCSend, kCRecv, kA2aD}) {
              cols += Fmt("%7.1f/%7.1f | ", v[2 * s2], v[2 * s2 + 1]);
            }
            std::string ratio = v[kBytesDisp] > 0 && v[2 * kDisp] > 0
                                    ? Fmt("%6.2fx", v[2 * kA2aD] / v[2 * kDisp])
                                    : std::string("   n/a");
            ratio += Fmt(" | %7.1f/%7.1f | ", v[2 * kA2aDedup], v[2 * kA2aDedup + 1]);
            ratio += v[kBytesDisp] > 0 && v[2 * kDisp] > 0
                         ? Fmt("%6.2fx", v[2 * kA2aDedup] / v[2 * kDisp])
                         : std::string("   n/a");
            ratio += Fmt(" | %7.1f/%7.1f | ", v[2 * kA2aC], v[2 * kA2aC + 1]);
            ratio += v[kBytesComb] > 0 && v[2 * kComb] > 0
                         ? Fmt("%6.2fx", v[2 * kA2aC] / v[2 * kComb])
                         : std::string("   n/a");
            printf("%-5s %6d %6d %4d | %s%s\n", fp8 ? "fp8" : "bf16", H, T, r, cols.c_str(),
                   ratio.c_str());
          }
          fflush(stdout);
        } else {
          fprintf(stderr, "rank %d: done %s hidden %d tokens %d\n", rank, fp8 ? "fp8" : "bf16", H, T);
        }
      }
    }
    EP_CHECK(g_ep->group_poll_error(group));
    EP_CHECK(g_ep->group_destroy(group));
    g_ep->config_free(cfg);
    CUDA_CHECK(cudaSetDevice(dev));
  }

  if (rank == 0) {
    printf("\nbandwidth (per rank; KB = bytes leaving this rank over NVLink per call; GB/s = "
           "bytes / median; ceiling = cudaMemcpyPeerAsync of the dispatch bytes to the next GPU, "
           "all ranks at once)\n");
    printf("%-5s %6s %6s %4s | %9s %9s %6s | %9s %8s | %9s %9s %8s | %9s %8s | %7s %7s | %8s\n", "dtype",
           "hidden", "tokens", "rank", "disp KB", "dedup KB", "dedup", "disp GB/s", "nccl GB/s",
           "comb KB", "dedup KB", "comb GB/s", "copy us", "ceil GB/s", "disp %", "comb %",
           "vs nccl");
    for (const Case& c : cases) {
      for (int r = 0; r < world; r++) {
        const double* v = &c.all[static_cast<size_t>(r) * kNumStats];
        auto gbs = [](double bytes, double us) { return us > 0 ? bytes / us / 1e3 : 0.0; };
        double disp_bw = gbs(v[kBytesDisp], v[2 * kDisp]);
        double comb_bw = gbs(v[kBytesComb], v[2 * kComb]);
        double ceil_bw = gbs(v[kBytesPeer], v[2 * kPeer]);
        std::string ceil_cols = ceil_bw > 0 ? Fmt("%9.1f %8.1f | %6.1f%% %6.1f%%", v[2 * kPeer], ceil_bw,
                                                  100 * disp_bw / ceil_bw, 100 * comb_bw / ceil_bw)
                                            : Fmt("%9s %8s | %7s %7s", "n/a", "n/a", "n/a", "n/a");
        printf("%-5s %6d %6d %4d | %9.1f %9.1f %5.2fx | %9.1f %8.1f | %9.1f %9.1f %8.1f | %s | %7.2fx\n",
               c.fp8 ? "fp8" : "bf16", c.hidden, c.tokens, r, v[kBytesDisp] / 1e3,
               v[kBytesDispDedup] / 1e3, v[kBytesDispDedup] > 0 ? v[kBytesDisp] / v[kBytesDispDedup] : 0.0,
               disp_bw, gbs(v[kBytesDisp], v[2 * kA2aD]), v[kBytesComb] / 1e3, v[kBytesCombDedup] / 1e3,
               comb_bw, ceil_cols.c_str(), v[kBytesDisp] > 0 && v[2 * kDisp] > 0 ? v[2 * kA2aD] / v[2 * kDisp] : 0.0);
      }
    }
    printf("\n'disp KB' = algorithmic dispatch bytes, one row per (token, expert on a peer); "
           "'dedup KB' = one row per (token, peer rank), what moe-ep's dispatch actually moves; "
           "'dedup' = their ratio; 'vs nccl' = NCCL all-to-all of the algorithmic bytes / moe_ep "
           "dispatch median (>1: moe_ep faster); 'vs dedup' = the same against an all-to-all of "
           "the dedup bytes; 'c vs nccl' = NCCL all-to-all of the algorithmic combine bytes "
           "(one bf16 row per (token, expert)) / moe_ep combine median; "
           "'disp %%' / 'comb %%' = algorithmic bandwidth as a share of the "
           "peer-copy ceiling bandwidth (can pass 100%% for dispatch: fewer bytes move than "
           "are counted).\n");
    fflush(stdout);

    const std::string json = absl::GetFlag(FLAGS_json);
    if (!json.empty()) {
      FILE* f = fopen(json.c_str(), "w");
      if (f == nullptr) Die("cannot write --json=%s: %s", json.c_str(), strerror(errno));
      fprintf(f, "{\n  \"command\": \"%s\",\n  \"world\": %d,\n  \"nccl_version\": %d,\n",
              JsonEscape("moe_ep_run -n " + std::to_string(world) + " -- " + cmdline).c_str(), world,
              nccl_version);
      fprintf(f, "  \"plugin_version\": \"%d.%d.%d\",\n  \"devices\": [", vmaj, vmin, vpat);
      for (int r = 0; r < world; r++) fprintf(f, "%s\"%s\"", r ? ", " : "", JsonEscape(devices[r]).c_str());
      fprintf(f, "],\n  \"groups_rank0\": [");
      for (size_t i = 0; i < group_lines.size(); i++) {
        fprintf(f, "%s\"%s\"", i ? ", " : "", JsonEscape(group_lines[i]).c_str());
      }
      fprintf(f, "],\n  \"experts\": %d, \"top_k\": %d, \"iters\": %d, \"warmup\": %d, "
                 "\"transport\": \"%s\", \"seed\": %llu, \"dispatch_weights\": %s,\n"
                 "  \"results\": [\n",
              experts, top_k, iters, warmup, JsonEscape(transport).c_str(),
              static_cast<unsigned long long>(seed),
              absl::GetFlag(FLAGS_dispatch_weights) ? "true" : "false");
      bool first = true;
      for (const Case& c : cases) {
        for (int r = 0; r < world; r++) {
          const double* v = &c.all[static_cast<size_t>(r) * kNumStats];
          fprintf(f, "%s    {\"dtype\": \"%s\", \"hidden\": %d, \"tokens\": %d, \"rank\": %d", first ? "" : ",\n",
                  c.fp8 ? "fp8" : "bf16", c.hidden, c.tokens, r);
          first = false;
          for (int s2 = 0; s2 < kTimes; s2++) {
            fprintf(f, ", \"%s_us_p50\": %.3f, \"%s_us_p99\": %.3f", kTimeNames[s2], v[2 * s2],
                    kTimeNames[s2], v[2 * s2 + 1]);
          }
          fprintf(f, ", \"dispatch_bytes\": %.0f, \"dispatch_bytes_dedup\": %.0f, \"combine_bytes\": %.0f, "
                     "\"combine_bytes_dedup\": %.0f, \"peer_copy_bytes\": %.0f, \"host_us_per_iter_full\": %.3f, "
                     "\"host_us_per_iter_halves\": %.3f}",
                  v[kBytesDisp], v[kBytesDispDedup], v[kBytesComb], v[kBytesCombDedup], v[kBytesPeer],
                  v[kHostUsFull], v[kHostUsHalves]);
        }
      }
      fprintf(f, "\n  ]\n}\n");
      if (fclose(f) != 0) Die("cannot write --json=%s: %s", json.c_str(), strerror(errno));
      printf("wrote %s\n", json.c_str());
    }
  }

  ref.Barrier();
  NCCL_CHECK(ncclCommDestroy(ref.comm));
  for (cudaEvent_t e : timer.ev) CUDA_CHECK(cudaEventDestroy(e));
  for (void* ptr : {static_cast<void*>(d_topk), static_cast<void*>(d_x), static_cast<void*>(d_w),
                    static_cast<void*>(d_out), static_cast<void*>(d_recv_x),
                    static_cast<void*>(d_recv_scales), static_cast<void*>(d_recv_count),
                    static_cast<void*>(d_y), static_cast<void*>(d_a2a_send),
                    static_cast<void*>(d_a2a_recv), static_cast<void*>(copy_src),
                    static_cast<void*>(ref.barrier_buf), static_cast<void*>(ref.gather_buf)}) {
    CUDA_CHECK(cudaFree(ptr));
  }
  if (copy_dst != nullptr) {
    CUDA_CHECK(cudaSetDevice(peer_dev));
    CUDA_CHECK(cudaFree(copy_dst));
    CUDA_CHECK(cudaSetDevice(dev));
  }
  CUDA_CHECK(cudaStreamDestroy(stream));
  moe_ep_unload(lib);
  return 0;
}
