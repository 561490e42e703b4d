// caller_context_gpu_test.cc: the calling thread's CUDA state is the
// engine's. Through the public API on the nccl backend (one rank, one GPU):
// group_create, prepare, dispatch, combine and group_destroy, each called
// from a thread that never chose a device, leave that thread without a
// current context (before, they left the group's device's context current:
// on a multi-GPU node, a thread with no device came back holding one, and
// a later restore of "device 0" made a context on GPU 0); called from a
// thread whose current context is one it created itself, they leave it
// current and still run the group's work where the group's memory is (the
// device's primary context; before, the work went to the thread's
// context). The combine's values are checked against the oracle, bit for
// bit.
#include <cuda.h>  // driver types only; the calls go through entry points
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <algorithm>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "moe_ep.h"
#include "tests/common/plugin_api.h"
#include "tests/gpu/one_rank_ll.h"
#include "tests/oracle/oracle.h"

namespace {

namespace oracle = moe_ep_oracle;

const char *g_argv0 = nullptr;
constexpr uint64_t kSeed = 5;
constexpr int kHidden = moe_ep_test::kOneHidden, kTopK = moe_ep_test::kOneTopK;

// A driver entry point through the runtime's query (no libcuda at link
// time); NULL when it cannot be had.
void *DriverEntry(const char *name, unsigned version = 12000) {
  void *fn = nullptr;
  enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(name, &fn, version, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess) {
    return nullptr;
  }
  return fn;
}

// The calling thread's current context (cuCtxGetCurrent); NULL when none.
void *CurrentContext() {
  using Get = int (*)(void **);
  static Get get = reinterpret_cast<Get>(DriverEntry("cuCtxGetCurrent"));
  void *ctx = nullptr;
  if (get == nullptr || get(&ctx) != 0) return nullptr;
  return ctx;
}

// One-rank group on GPU 0, created from the calling thread.
moe_ep_group_t *Create(const moe_ep_plugin_v1_t *api, const char *mode) {
  moe_ep_group_t *g = nullptr;
  const moe_ep_status_t st = moe_ep_test::one_rank_group(api, mode, &g);
  EXPECT_EQ(st, MOE_EP_OK) << "rank 0: " << api->last_error();
  return st == MOE_EP_OK ? g : nullptr;
}

// On a new thread (no context of its own): runs f, then reports the
// context the thread is left with.
template <typename F>
void *OnFreshThread(F f) {
  void *left = reinterpret_cast<void *>(1);
  std::thread t([&] {
    EXPECT_EQ(CurrentContext(), nullptr) << "a new thread already has a context";
    f();
    left = CurrentContext();
  });
  t.join();
  return left;
}

TEST(CallerContext, LowLatencyEntriesLeaveTheThreadsContextAsItWas) {
  ASSERT_NE(DriverEntry("cuCtxGetCurrent"), nullptr) << "cannot query the current context";
  const moe_ep_plugin_v1_t *api = moe_ep_test::load_plugin(moe_ep_test::plugin_path(g_argv0));
  moe_ep_group_t *g = nullptr;
  EXPECT_EQ(OnFreshThread([&] { g = Create(api, "low_latency"); }), nullptr)
      << "group_create left its thread with a current context";
  ASSERT_NE(g, nullptr);

  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  moe_ep_test::OneRankLayer L(kSeed);

  // One layer: prepare, dispatch, combine; the context after each entry.
  auto layer = [&](std::vector<void *> *after) {
    moe_ep_prepare_params_t pp = moe_ep_prepare_params_init();
    pp.topk_idx = L.t_topk->get();
    pp.num_tokens = L.T;
    pp.top_k = kTopK;
    moe_ep_handle_t *h = nullptr;
    ASSERT_EQ(api->prepare(g, &pp, &h), MOE_EP_OK) << "rank 0: " << api->last_error();
    after->push_back(CurrentContext());
    moe_ep_dispatch_params_t dp = moe_ep_dispatch_params_init();
    dp.hidden = kHidden;
    dp.x = L.t_x->get();
    dp.recv_x = L.t_rx->get();
    dp.recv_count = L.t_cnt->get();
    ASSERT_EQ(api->dispatch(g, h, &dp, nullptr), MOE_EP_OK) << "rank 0: " << api->last_error();
    after->push_back(CurrentContext());
    moe_ep_combine_params_t cp = moe_ep_combine_params_init();
    cp.hidden = kHidden;
    cp.y = L.t_y->get();
    cp.topk_weights = L.t_w->get();
    cp.out = L.t_out->get();
    ASSERT_EQ(api->combine(g, h, &cp, nullptr), MOE_EP_OK) << "rank 0: " << api->last_error();
    after->push_back(CurrentContext());
    api->handle_free(h);
  };
  const char *entry[] = {"prepare", "dispatch", "combine"};

  // On a new thread: `setup` gives it its context (and returns it), one
  // layer runs, `done` tears the context down. Every entry must leave that
  // context current, and the combine must give the oracle's values.
  auto on_thread = [&](const char *who, auto setup, auto done) {
    std::fill(L.out.begin(), L.out.end(), 0xffff);
    L.m_out.upload();
    std::vector<void *> after;
    void *mine = reinterpret_cast<void *>(1);
    std::thread t([&] {
      mine = setup();
      layer(&after);
      done(mine);
    });
    t.join();
    ASSERT_EQ(after.size(), 3u) << who;
    for (int i = 0; i < 3; i++) {
      EXPECT_EQ(after[i], mine) << entry[i] << " changed the context of a thread " << who;
    }
    L.m_out.download();
    EXPECT_EQ(oracle::compare_exact_u16("out", L.out.data(), L.want_out.data(),
                                        L.want_out.size(), kHidden), "")
        << "rank 0 seed " << kSeed << " (a thread " << who << ")";
  };
  auto nothing = [](void *) {};

  on_thread("with no context", [] {
    EXPECT_EQ(CurrentContext(), nullptr) << "a new thread already has a context";
    return static_cast<void *>(nullptr);
  }, nothing);

  // An engine thread after cudaSetDevice: the entries take their fast path.
  on_thread("on the device's primary context", [] {
    EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
    EXPECT_EQ(cudaFree(nullptr), cudaSuccess);
    void *primary = CurrentContext();
    EXPECT_NE(primary, nullptr);
    return primary;
  }, nothing);

  // A context of the thread's own (not the device's primary one, where the
  // group's memory lives): it stays current and the group's work still
  // runs in the primary context. cuCtxCreate as CUDA 13 declares it
  // (cuCtxCreate_v4: no affinity, no CIG parameters); an older driver
  // lacks it, and this case is skipped.
  using Create = CUresult (*)(CUcontext *, CUctxCreateParams *, unsigned, CUdevice);
  using Destroy = int (*)(void *);
  auto ctx_create = reinterpret_cast<Create>(DriverEntry("cuCtxCreate", 13000));
  auto ctx_destroy = reinterpret_cast<Destroy>(DriverEntry("cuCtxDestroy"));
  if (ctx_create == nullptr || ctx_destroy == nullptr) {
    std::printf("note: the driver has no CUDA 13 cuCtxCreate; the own-context case is skipped\n");
  } else {
    on_thread("with its own context", [&] {
      CUctxCreateParams none{};
      CUcontext made = nullptr;
      EXPECT_EQ(ctx_create(&made, &none, 0, 0), CUDA_SUCCESS) << "cuCtxCreate";
      EXPECT_NE(made, nullptr);
      EXPECT_EQ(CurrentContext(), static_cast<void *>(made));
      return static_cast<void *>(made);
    }, [&](void *made) { ctx_destroy(made); });
  }

  moe_ep_status_t destroyed = MOE_EP_ERR_INTERNAL;
  EXPECT_EQ(OnFreshThread([&] { destroyed = api->group_destroy(g); }), nullptr)
      << "group_destroy left its thread with a current context";
  EXPECT_EQ(destroyed, MOE_EP_OK) << "rank 0: " << api->last_error();
}

TEST(CallerContext, HighThroughputCreateAndDestroyLeaveNoContext) {
  ASSERT_NE(DriverEntry("cuCtxGetCurrent"), nullptr) << "cannot query the current context";
  const moe_ep_plugin_v1_t *api = moe_ep_test::load_plugin(moe_ep_test::plugin_path(g_argv0));
  moe_ep_group_t *g = nullptr;
  EXPECT_EQ(OnFreshThread([&] { g = Create(api, "high_throughput"); }), nullptr)
      << "group_create (high_throughput) left its thread with a current context";
  ASSERT_NE(g, nullptr);
  moe_ep_status_t destroyed = MOE_EP_ERR_INTERNAL;
  EXPECT_EQ(OnFreshThread([&] { destroyed = api->group_destroy(g); }), nullptr)
      << "group_destroy (high_throughput) left its thread with a current context";
  EXPECT_EQ(destroyed, MOE_EP_OK) << "rank 0: " << api->last_error();
}

}  // namespace

int main(int argc, char **argv) {
  g_argv0 = argv[0];
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
