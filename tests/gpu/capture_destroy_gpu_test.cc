// capture_destroy_gpu_test.cc: group_destroy while a CUDA graph capture
// that holds the group's kernels is still running (through the public API
// on the nccl backend, one rank, one GPU). The group is gone, and
// group_destroy says INVALID_ARGUMENT naming the capture, but its memory
// stays allocated: the capture ends cleanly, its graph launched afterwards
// still dispatches and combines to the oracle's values, bit for bit, and a
// new group made after it works too. (Before, group_destroy returned OK and
// handed the window, state and error records back to the process's pools,
// where the next group got them while the graph could still write them.)
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "moe_ep.h"
#include "tests/common/mirror.h"
#include "tests/common/plugin_api.h"
#include "tests/gpu/one_rank_ll.h"
#include "tests/oracle/oracle.h"

namespace {

namespace oracle = moe_ep_oracle;

const char *g_argv0 = nullptr;
constexpr uint64_t kSeed = 23;
constexpr int kExperts = moe_ep_test::kOneExperts, kHidden = moe_ep_test::kOneHidden;
constexpr int kTopK = moe_ep_test::kOneTopK;

// One layer (prepare, dispatch, combine) of L on `stream`; *h gets the handle.
moe_ep_status_t Layer(const moe_ep_plugin_v1_t *api, moe_ep_group_t *g,
                      moe_ep_test::OneRankLayer &L, void *stream, moe_ep_handle_t **h) {
  moe_ep_prepare_params_t pp = moe_ep_prepare_params_init();
  pp.topk_idx = L.t_topk->get();
  pp.num_tokens = L.T;
  pp.top_k = kTopK;
  pp.stream = stream;
  moe_ep_status_t st = api->prepare(g, &pp, h);
  if (st != MOE_EP_OK) return st;
  moe_ep_dispatch_params_t dp = moe_ep_dispatch_params_init();
  dp.hidden = kHidden;
  dp.x = L.t_x->get();
  dp.recv_x = L.t_rx->get();
  dp.recv_count = L.t_cnt->get();
  dp.stream = stream;
  st = api->dispatch(g, *h, &dp, nullptr);
  if (st != MOE_EP_OK) return st;
  moe_ep_combine_params_t cp = moe_ep_combine_params_init();
  cp.hidden = kHidden;
  cp.y = L.t_y->get();
  cp.topk_weights = L.t_w->get();
  cp.out = L.t_out->get();
  cp.stream = stream;
  return api->combine(g, *h, &cp, nullptr);
}

// recv_count and out against the oracle, after the layer ran.
void ExpectExact(moe_ep_test::OneRankLayer &L, const char *what) {
  L.m_cnt.download();
  L.m_out.download();
  EXPECT_EQ(oracle::compare_exact_i32("recv_count", L.count.data(), L.want.recv_count.data(),
                                      kExperts, kExperts), "")
      << "rank 0 seed " << kSeed << ": " << what;
  EXPECT_EQ(oracle::compare_exact_u16("out", L.out.data(), L.want_out.data(), L.want_out.size(),
                                      kHidden), "")
      << "rank 0 seed " << kSeed << ": " << what;
}

TEST(CaptureDestroy, DestroyDuringCaptureKeepsTheGroupsMemory) {
  const moe_ep_plugin_v1_t *api = moe_ep_test::load_plugin(moe_ep_test::plugin_path(g_argv0));
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  moe_ep_group_t *g = nullptr;
  ASSERT_EQ(moe_ep_test::one_rank_group(api, "low_latency", &g), MOE_EP_OK)
      << "rank 0: " << api->last_error();
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);

  moe_ep_test::OneRankLayer L(kSeed);
  L.m_y.upload();  // before the capture: the upload waits for the device
  moe_ep_handle_t *h = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const moe_ep_status_t captured = Layer(api, g, L, s, &h);
  const std::string capture_error = captured == MOE_EP_OK ? "" : api->last_error();
  const moe_ep_status_t destroyed = api->group_destroy(g);
  const std::string destroy_error = api->last_error();
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess)
      << "rank 0: the capture did not end cleanly after group_destroy";
  ASSERT_EQ(captured, MOE_EP_OK) << "rank 0: " << capture_error;
  EXPECT_EQ(destroyed, MOE_EP_ERR_INVALID_ARGUMENT) << "rank 0: " << destroy_error;
  EXPECT_NE(destroy_error.find("group_destroy on rank 0: stream "), std::string::npos)
      << destroy_error;
  EXPECT_NE(destroy_error.find("is still capturing a CUDA graph"), std::string::npos)
      << destroy_error;
  EXPECT_NE(destroy_error.find("stay allocated for the life of the process"), std::string::npos)
      << destroy_error;
  api->handle_free(h);

  // The graph still runs on the memory the group kept.
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  ExpectExact(L, "the graph captured before group_destroy, launched after it");

  // A new group on the same device works, eager, beside the live graph.
  moe_ep_test::OneRankLayer L2(kSeed);
  L2.m_y.upload();
  moe_ep_group_t *g2 = nullptr;
  ASSERT_EQ(moe_ep_test::one_rank_group(api, "low_latency", &g2), MOE_EP_OK)
      << "rank 0: " << api->last_error();
  moe_ep_handle_t *h2 = nullptr;
  ASSERT_EQ(Layer(api, g2, L2, s, &h2), MOE_EP_OK) << "rank 0: " << api->last_error();
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  ExpectExact(L2, "a new group after the kept one");
  std::fill(L.out.begin(), L.out.end(), 0xffff);  // so that the check sees this launch's values
  std::fill(L.count.begin(), L.count.end(), -1);
  L.m_out.upload();
  L.m_cnt.upload();
  ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);  // the old graph again, after the new group's work
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  ExpectExact(L, "the old graph launched again beside the new group");
  api->handle_free(h2);
  EXPECT_EQ(api->group_destroy(g2), MOE_EP_OK) << "rank 0: " << api->last_error();

  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}

}  // namespace

int main(int argc, char **argv) {
  g_argv0 = argv[0];
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
