// graph_destroy_gpu_test.cc: group_destroy and the CUDA graphs that hold a
// group's calls, through the public API on the nccl backend (one rank, one
// GPU). moe_ep.h lets such graphs outlive the group as long as they are
// never launched again; group_destroy frees the group and returns OK either
// way, and says at WARN (the engine's logger) how many are still alive: one
// per capture, whatever its number of calls, not counting graphs destroyed
// before the call. Graphs destroyed before it leave no such line.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "moe_ep.h"
#include "moe_ep_loader.h"
#include "tests/common/mirror.h"
#include "tests/common/plugin_api.h"
#include "tests/gpu/cuda_ok.h"
#include "tests/gpu/one_rank_ll.h"
#include "tests/oracle/oracle.h"

namespace {

namespace oracle = moe_ep_oracle;

const char *g_argv0 = nullptr;

// The library's WARN lines, from its logger.
std::mutex g_lines_lock;
std::vector<std::string> g_warnings;

void record(void *, int level, const char *message) {
  if (level != MOE_EP_LOG_WARN) return;
  std::lock_guard<std::mutex> hold(g_lines_lock);
  g_warnings.emplace_back(message);
}

// The recorded lines that contain `text`.
int warnings_with(const std::string &text) {
  std::lock_guard<std::mutex> hold(g_lines_lock);
  int n = 0;
  for (const std::string &line : g_warnings) n += line.find(text) != std::string::npos;
  return n;
}

const char kAlive[] = "holding this group's calls";
constexpr int kHidden = moe_ep_test::kOneHidden, kTopK = moe_ep_test::kOneTopK;

// One LL layer (prepare, dispatch, combine) captured on `stream` into an
// executable graph; the handle is freed after the capture (the graph keeps
// what it captured).
struct CapturedLayer {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
};

std::string capture_layer(const moe_ep_plugin_v1_t *api, moe_ep_group_t *g,
                          moe_ep_test::OneRankLayer &L, cudaStream_t stream,
                          CapturedLayer *out) {
  if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess)
    return "cudaStreamBeginCapture failed";
  moe_ep_prepare_params_t pp = moe_ep_prepare_params_init();
  pp.topk_idx = L.t_topk->get();
  pp.num_tokens = L.T;
  pp.top_k = kTopK;
  pp.stream = stream;
  moe_ep_handle_t *h = nullptr;
  std::string err;
  if (api->prepare(g, &pp, &h) != MOE_EP_OK) err = std::string("prepare: ") + api->last_error();
  moe_ep_dispatch_params_t dp = moe_ep_dispatch_params_init();
  dp.hidden = kHidden;
  dp.x = L.t_x->get();
  dp.recv_x = L.t_rx->get();
  dp.recv_count = L.t_cnt->get();
  dp.stream = stream;
  if (err.empty() && api->dispatch(g, h, &dp, nullptr) != MOE_EP_OK)
    err = std::string("dispatch: ") + api->last_error();
  moe_ep_combine_params_t cp = moe_ep_combine_params_init();
  cp.hidden = kHidden;
  cp.y = L.t_y->get();
  cp.topk_weights = L.t_w->get();
  cp.out = L.t_out->get();
  cp.stream = stream;
  if (err.empty() && api->combine(g, h, &cp, nullptr) != MOE_EP_OK)
    err = std::string("combine: ") + api->last_error();
  const cudaError_t ended = cudaStreamEndCapture(stream, &out->graph);
  api->handle_free(h);
  if (!err.empty()) return err;
  if (ended != cudaSuccess) return std::string("cudaStreamEndCapture: ") + cudaGetErrorString(ended);
  const cudaError_t made = cudaGraphInstantiate(&out->exec, out->graph, 0);
  return made == cudaSuccess ? "" : std::string("cudaGraphInstantiate: ") + cudaGetErrorString(made);
}

// Launches the layer's graph with out reset to 0xffff and checks out
// against the oracle, bit-exact.
std::string launch_and_check(moe_ep_test::OneRankLayer &L, const CapturedLayer &c,
                             cudaStream_t stream) {
  std::fill(L.out.begin(), L.out.end(), 0xffff);
  L.m_out.upload();
  cudaError_t e = cudaGraphLaunch(c.exec, stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess) return std::string("graph launch: ") + cudaGetErrorString(e);
  L.m_out.download();
  return oracle::compare_exact_u16("out", L.out.data(), L.want_out.data(), L.want_out.size(),
                                   kHidden);
}

// A one-rank LL group with the logger recording, a stream, and the graphs
// of `layers` captures of one layer (each launched once and checked).
class GraphDestroy : public ::testing::Test {
 protected:
  void SetUp() override {
    api = moe_ep_test::load_plugin(moe_ep_test::plugin_path(g_argv0));
    ASSERT_EQ(api->set_logger(record, nullptr), MOE_EP_OK);
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(moe_ep_test::one_rank_group(api, "low_latency", &g), MOE_EP_OK)
        << "rank 0: " << api->last_error();
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  }
  void TearDown() override {
    for (CapturedLayer &c : graphs) forget(&c);
    if (g != nullptr) api->group_destroy(g);
    if (stream != nullptr) cudaStreamDestroy(stream);
    api->set_logger(nullptr, nullptr);
  }
  void capture(int layers, uint64_t seed) {
    L = std::make_unique<moe_ep_test::OneRankLayer>(seed);
    L->m_y.upload();
    graphs.resize(layers);
    for (CapturedLayer &c : graphs) {
      ASSERT_EQ(capture_layer(api, g, *L, stream, &c), "") << "rank 0 seed " << seed;
      ASSERT_EQ(launch_and_check(*L, c, stream), "") << "rank 0 seed " << seed;
    }
  }
  // Destroys a graph and its executable graph (never launched again).
  static void forget(CapturedLayer *c) {
    if (c->exec != nullptr) {
      EXPECT_EQ(cudaGraphExecDestroy(c->exec), cudaSuccess);
    }
    if (c->graph != nullptr) {
      EXPECT_EQ(cudaGraphDestroy(c->graph), cudaSuccess);
    }
    *c = CapturedLayer{};
  }
  moe_ep_status_t destroy_group() {
    moe_ep_group_t *gone = g;
    g = nullptr;
    return api->group_destroy(gone);
  }

  const moe_ep_plugin_v1_t *api = nullptr;
  moe_ep_group_t *g = nullptr;
  cudaStream_t stream = nullptr;
  std::unique_ptr<moe_ep_test::OneRankLayer> L;
  std::vector<CapturedLayer> graphs;
};

TEST_F(GraphDestroy, LiveGraphsAreCountedAndSaid) {
  // Three captures of the layer's three calls; the first graph and its
  // executable graph are destroyed before group_destroy, two live on.
  capture(3, 21);
  forget(&graphs[0]);
  EXPECT_EQ(destroy_group(), MOE_EP_OK) << "rank 0: " << api->last_error();
  EXPECT_EQ(warnings_with("rank 0: group_destroy: 2 CUDA graphs (or graph captures) holding "
                          "this group's calls are still alive"), 1);
  EXPECT_EQ(warnings_with("must never be launched again"), 1);
}

TEST_F(GraphDestroy, GraphsDestroyedFirstAreNotSaid) {
  const int before = warnings_with(kAlive);
  capture(2, 22);
  for (CapturedLayer &c : graphs) forget(&c);
  EXPECT_EQ(destroy_group(), MOE_EP_OK) << "rank 0: " << api->last_error();
  EXPECT_EQ(warnings_with(kAlive), before);
}

// moe_ep.h lets a graph outlive its group; CUDA calls the library when it
// releases such a graph, so an engine's moe_ep_unload before that must
// leave the library mapped. Meaningful run alone (--gtest_filter=*Unload*):
// then this test's load is the library's only one.
TEST(GraphDestroyUnload, GraphReleasedAfterTheLibraryIsUnloaded) {
  const moe_ep_plugin_v1_t *api = nullptr;
  char err[512];
  void *lib = moe_ep_load(moe_ep_test::plugin_path(g_argv0).c_str(), &api, err, sizeof err);
  ASSERT_NE(lib, nullptr) << err;
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  moe_ep_group_t *g = nullptr;
  ASSERT_EQ(moe_ep_test::one_rank_group(api, "low_latency", &g), MOE_EP_OK)
      << "rank 0: " << api->last_error();
  moe_ep_test::OneRankLayer L(23);
  L.m_y.upload();
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CapturedLayer c;
  ASSERT_EQ(capture_layer(api, g, L, stream, &c), "") << "rank 0 seed 23";
  EXPECT_EQ(api->group_destroy(g), MOE_EP_OK) << "rank 0: " << api->last_error();
  moe_ep_unload(lib);
  // The graph goes after the library was unloaded: CUDA runs the
  // library's release on a thread of its own, shortly after.
  CUDA_OK(cudaGraphExecDestroy(c.exec));
  CUDA_OK(cudaGraphDestroy(c.graph));
  CUDA_OK(cudaStreamDestroy(stream));
  CUDA_OK(cudaDeviceSynchronize());
  usleep(200000);
  std::printf("rank 0: alive after the graph's release\n");
}

}  // namespace

int main(int argc, char **argv) {
  g_argv0 = argv[0];
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
