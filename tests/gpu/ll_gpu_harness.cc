// ll_gpu_harness.cc: see ll_gpu_harness.h.
#include "tests/gpu/ll_gpu_harness.h"

#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "runtime/error.h"

extern char **environ;

namespace mep_ll_gpu {

int g_rank = 0, g_world = 1;

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
float unit(uint64_t h) { return (float)((h >> 40) & 0xffffff) / 16777216.0f; }
uint16_t f2bf(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
float bf2f(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

int tokens_of(const Case &c, int r) { return c.tokens[r % c.tokens.size()]; }

// bf16 +inf, -inf, NaN, -NaN (payload 1).
static const uint16_t kNonFinite[] = {0x7f80, 0xff80, 0x7fc0, 0xffc1};

// Non-finite cases: in every third token four channels of one group hold
// +inf, -inf, NaN, -NaN; in every seventh a whole group holds nothing finite.
static void add_non_finite(const Case &c, int r, int t, uint16_t *row) {
  const int groups = c.hidden / 128;
  const uint64_t h = mix(c.seed ^ ((uint64_t)r << 20) ^ (uint64_t)t);
  if ((t + r) % 3 == 0) {
    const int g = (int)(h % groups);
    for (int j = 0; j < 4; ++j) row[g * 128 + (h / 7 + 37 * j) % 128] = kNonFinite[j];
  }
  if ((t + r) % 7 == 1) {
    const int g = (int)((h / 3) % groups);
    for (int i = 0; i < 128; ++i) row[g * 128 + i] = kNonFinite[(h + i) % 4];
  }
}

Inputs make_inputs(const Case &c, int r) {
  Inputs in;
  const int T = tokens_of(c, r), H = c.hidden, K = c.top_k;
  in.x.resize((size_t)T * H);
  in.topk.resize((size_t)T * K);
  in.w.resize((size_t)T * K);
  for (int t = 0; t < T; ++t) {
    const float amp = 0.01f + 4.0f * unit(mix(c.seed ^ (r * 131 + t)));
    for (int h = 0; h < H; ++h)
      in.x[(size_t)t * H + h] =
          f2bf(amp * (2.0f * unit(mix(c.seed * 7 + ((uint64_t)r << 40) + (uint64_t)t * H + h)) - 1.0f));
    if (c.non_finite) add_non_finite(c, r, t, &in.x[(size_t)t * H]);
    std::vector<int> chosen;
    for (int k = 0; k < K; ++k) {
      const uint64_t h = mix(c.seed * 13 + ((uint64_t)r << 32) + (uint64_t)t * 64 + k);
      int e = -1;
      if (h % 9 != 0) {  // ~1/9 of slots are -1
        e = (int)((h >> 8) % c.experts);
        while (std::find(chosen.begin(), chosen.end(), e) != chosen.end()) e = (e + 1) % c.experts;
        chosen.push_back(e);
      }
      if (c.hot) e = k;
      in.topk[(size_t)t * K + k] = e;
      in.w[(size_t)t * K + k] = 0.1f + unit(h * 3);
    }
  }
  return in;
}

// The NCCL unique id through a file: rank 0 writes it, the others poll for
// it (bounded: 60 s).
static moe_ep_status_t file_exchange(void *user, int32_t rank, int32_t world, void *uid, size_t n) {
  (void)world;
  const std::string dir = (const char *)user;
  const std::string path = dir + "/nccl_uid", tmp = path + ".tmp";
  if (rank == 0) {
    FILE *f = fopen(tmp.c_str(), "wb");
    if (!f || fwrite(uid, 1, n, f) != n) return mep_error(MOE_EP_ERR_BOOTSTRAP, "cannot write %s", tmp.c_str());
    fclose(f);
    rename(tmp.c_str(), path.c_str());
    return MOE_EP_OK;
  }
  for (int i = 0; i < 6000; ++i) {
    FILE *f = fopen(path.c_str(), "rb");
    if (f) {
      size_t got = fread(uid, 1, n, f);
      fclose(f);
      if (got == n) return MOE_EP_OK;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return mep_error(MOE_EP_ERR_BOOTSTRAP, "no unique id at %s after 60 s", path.c_str());
}

static bool group_buffers(Group *g) {
  const mep_ll_dims_t &dims = g->ctx.dims;
  const size_t slots = (size_t)dims.local_experts * g_world * kMaxTokens;
  g->slots = slots;
  const uint64_t sb = mep_ll_state_bytes(&dims);
  bool ok = cudaMalloc(&g->ctx.state, sb) == cudaSuccess &&
            cudaMemset(g->ctx.state, 0, sb) == cudaSuccess &&
            cudaStreamSynchronize(cudaStreamLegacy) == cudaSuccess &&
            cudaHostAlloc((void **)&g->rec, sizeof *g->rec, cudaHostAllocMapped) == cudaSuccess;
  if (ok) memset((void *)g->rec, 0, sizeof *g->rec);
  ok = ok && cudaHostGetDevicePointer((void **)&g->ctx.error_dev, g->rec, 0) == cudaSuccess;
  ok = ok && cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking) == cudaSuccess &&
       cudaMalloc(&g->x, (size_t)kMaxTokens * kMaxHidden * 2) == cudaSuccess &&
       cudaMalloc(&g->topk, (size_t)kMaxTokens * kMaxTopK * 8) == cudaSuccess &&
       cudaMalloc(&g->w, (size_t)kMaxTokens * kMaxTopK * 4) == cudaSuccess &&
       cudaMalloc(&g->recv_x, slots * kMaxHidden * 2) == cudaSuccess &&
       cudaMalloc(&g->scales, slots * (kMaxHidden / 128) * 4) == cudaSuccess &&
       cudaMalloc(&g->y, slots * kMaxHidden * 2) == cudaSuccess &&
       cudaMalloc(&g->out, (size_t)kMaxTokens * kMaxHidden * 2) == cudaSuccess &&
       cudaMalloc((void **)&g->recv_count, dims.local_experts * 4) == cudaSuccess &&
       cudaMalloc((void **)&g->slot_src, slots * 4) == cudaSuccess &&
       cudaMalloc((void **)&g->src_count, dims.local_experts * g_world * 4) == cudaSuccess &&
       cudaMalloc((void **)&g->route, (size_t)g_world * kMaxTokens * kMaxTopK *
                                          sizeof(mep_ll_route_t)) == cudaSuccess &&
       cudaMalloc((void **)&g->src_tokens, g_world * 4) == cudaSuccess;
  if (!ok)
    fprintf(stderr, "rank %d: CUDA allocation failed: %s\n", g_rank,
            cudaGetErrorString(cudaGetLastError()));
  return ok;
}

Group *group_create(const Group *adopt) {
  Group *g = new Group();
  const char *dir = getenv("MOE_EP_UID_DIR");
  mep_nccl_params_t p = {};
  p.rank = g_rank;
  p.world = g_world;
  p.cuda_device = g_rank;
  p.timeout_ms = 30000;
  p.transport = MOE_EP_TRANSPORT_LSA;
  mep_ll_dims_t dims = {kMaxExperts / g_world, g_world, kMaxTokens, kMaxHidden, kMaxTopK, 0, 2, 0};
  // Sized for every transport (lsa_only 0): the tests switch the
  // context's transport on one window.
  p.window_bytes = mep_ll_buffer_bytes(&dims);
  p.gin_signal_count = (int32_t)(2 * mep_ll_set_layout(&dims).num_signals);
  if (adopt != nullptr) {
    p.adopt_comm = mep_nccl_comm(adopt->nccl);
  } else {
    p.exchange = file_exchange;
    p.exchange_user = (void *)(dir ? dir : "/tmp");
  }
  if (mep_nccl_create(&p, &g->nccl) != MOE_EP_OK) {
    fprintf(stderr, "rank %d: nccl setup failed: %s\n", g_rank, mep_last_error());
    delete g;
    return nullptr;
  }
  int32_t tr[64];
  mep_nccl_peer_transports(g->nccl, tr, 64);
  printf("rank %d: NCCL up%s, lsa size %d, window %llu bytes, peer transports:", g_rank,
         adopt ? " (second window)" : "", mep_nccl_lsa_size(g->nccl),
         (unsigned long long)mep_nccl_bytes_allocated(g->nccl));
  for (int i = 0; i < g_world && i < 64; ++i) printf(" %d", tr[i]);
  printf("\n");
  mep_ll_ctx_t &c = g->ctx;
  c.dev_comm = mep_nccl_dev_comm(g->nccl);
  c.window = mep_nccl_window(g->nccl);
  c.window_local = mep_nccl_window_local(g->nccl);
  c.window_bytes = mep_nccl_bytes_allocated(g->nccl);
  c.dims = dims;
  c.rank = g_rank;
  c.transport = MEP_LL_TRANSPORT_LSA;
  if (mep_ll_resolve_lsa(&c) != MEP_KSTATUS_OK) {
    fprintf(stderr, "rank %d: %s\n", g_rank, mep_kernels_last_error());
    group_free(g);
    return nullptr;
  }
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, g_rank);
  const char *env_sms = getenv("MOE_EP_TEST_SMS");
  c.num_sms = env_sms ? atoi(env_sms) : sms;
  if (mep_ll_timeout_cycles(g_rank, 10000, &c.timeout_cycles) != MEP_KSTATUS_OK || !group_buffers(g)) {
    group_free(g);
    return nullptr;
  }
  return g;
}

void group_free(Group *g) {
  if (g == nullptr) return;
  if (g->stream) cudaStreamSynchronize(g->stream);
  for (void *d : {g->x, g->topk, g->w, g->recv_x, g->scales, g->y, g->out, (void *)g->recv_count,
                  (void *)g->slot_src, (void *)g->src_count, (void *)g->route,
                  (void *)g->src_tokens, g->ctx.state})
    cudaFree(d);
  if (g->rec) cudaFreeHost(g->rec);
  if (g->stream) cudaStreamDestroy(g->stream);
  mep_nccl_destroy(g->nccl, 0);  // collective; every wait before it is bounded
  delete g;
}

bool upload(const Case &c, const Inputs &in, void *x, void *topk, void *w) {
  if (tokens_of(c, g_rank) == 0) return true;
  if (cudaMemcpy(x, in.x.data(), in.x.size() * 2, cudaMemcpyHostToDevice) != cudaSuccess)
    return false;
  if (c.idx_bytes == 8) {
    if (cudaMemcpy(topk, in.topk.data(), in.topk.size() * 8, cudaMemcpyHostToDevice) != cudaSuccess)
      return false;
  } else {
    std::vector<int32_t> t32(in.topk.begin(), in.topk.end());
    if (cudaMemcpy(topk, t32.data(), t32.size() * 4, cudaMemcpyHostToDevice) != cudaSuccess)
      return false;
  }
  // A copy from pageable memory may return before its DMA has landed, and
  // the kernels run on a non-blocking stream that does not wait for it.
  return cudaMemcpy(w, in.w.data(), in.w.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess &&
         cudaStreamSynchronize(cudaStreamLegacy) == cudaSuccess;
}

// The fields dispatch and combine arguments share: routing, shape, buffer
// set and the handle's device arrays.
template <typename Args>
static void shared_args(const Case &c, const Group &g, int set, void *topk, Args *a) {
  a->topk_idx = topk;
  a->topk_idx_bytes = c.idx_bytes;
  a->num_tokens = tokens_of(c, g_rank);
  a->hidden = c.hidden;
  a->top_k = c.top_k;
  a->num_experts = c.experts;
  a->buffer_set = set;
  a->recv_count = g.recv_count;
  a->slot_src = g.slot_src;
  a->src_count = g.src_count;
  a->route = g.route;
  a->src_tokens = g.src_tokens;
}

mep_ll_dispatch_args_t dispatch_args(const Case &c, const Group &g, int set, void *x, void *topk,
                                     void *w, int weighted) {
  mep_ll_dispatch_args_t a = {};
  shared_args(c, g, set, topk, &a);
  a.x = x;
  a.fp8 = c.fp8;
  a.scale_mode = c.scale_mode;
  a.recv_x = g.recv_x;
  a.recv_scales = g.scales;
  a.weighted = weighted;
  a.topk_weights = weighted ? (const float *)w : nullptr;
  return a;
}

mep_ll_combine_args_t combine_args(const Case &c, const Group &g, int set, void *topk, void *w,
                                   int weighted) {
  mep_ll_combine_args_t a = {};
  shared_args(c, g, set, topk, &a);
  a.y = g.y;
  // Weighted: the source side must not need its weights any more.
  a.topk_weights = weighted ? nullptr : (const float *)w;
  a.out = g.out;
  a.partials = weighted;
  return a;
}

int spawn_ranks(char **argv, const char *what) {
  int world = 0;
  if (const char *w = getenv("MOE_EP_TEST_WORLD")) world = atoi(w);
  if (world <= 0 && cudaGetDeviceCount(&world) != cudaSuccess) world = 0;
  if (world <= 0) {
    fprintf(stderr, "no CUDA device\n");
    return 2;
  }
  char dir[] = "/tmp/moe_ep_gpu_XXXXXX";
  if (!mkdtemp(dir)) return 2;
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> env;
    for (char **e = environ; *e; ++e) env.push_back(*e);
    env.push_back("MOE_EP_RANK=" + std::to_string(r));
    env.push_back("MOE_EP_WORLD_SIZE=" + std::to_string(world));
    env.push_back(std::string("MOE_EP_UID_DIR=") + dir);
    std::vector<char *> envp;
    for (auto &s : env) envp.push_back(&s[0]);
    envp.push_back(nullptr);
    pid_t pid;
    if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp.data()) != 0) return 2;
    pids.push_back(pid);
  }
  // A rank that fails makes the others time out; give them 30 s, then end
  // them so the run never hangs.
  int rc = 0, left = world;
  auto deadline = std::chrono::steady_clock::time_point::max();
  while (left > 0) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      --left;
      const int rank = (int)(std::find(pids.begin(), pids.end(), pid) - pids.begin());
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        rc = 1;
        fprintf(stderr, "rank %d: %s %d\n", rank, WIFEXITED(status) ? "exit code" : "killed by signal",
                WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
        if (deadline == std::chrono::steady_clock::time_point::max())
          deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      }
      continue;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      for (pid_t q : pids) kill(q, SIGKILL);
      deadline = std::chrono::steady_clock::time_point::max();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  printf("moe_ep %s: %d ranks, %s\n", what, world, rc ? "FAILED" : "PASSED");
  return rc;
}

}  // namespace mep_ll_gpu
