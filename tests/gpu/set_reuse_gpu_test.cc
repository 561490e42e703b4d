// set_reuse_gpu_test.cc: through the public API on the nccl backend (one
// rank, one GPU, one buffer set): a zero-token layer whose topk_idx and x
// carry NULL data (an empty torch tensor's data_ptr() is 0) dispatches and
// combines; its dispatch replaces the set's layout, so combining the older
// handle A is refused with a sentence saying so, and the group stays usable:
// A's inputs dispatched again combine to the oracle's values. (That a
// dispatch the launcher refuses leaves the older layout in place is
// tested on the CPU: tests/runtime/layout_book_test.cc.)
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "moe_ep.h"
#include "tests/common/mirror.h"
#include "tests/common/plugin_api.h"
#include "tests/gpu/one_rank_ll.h"
#include "tests/oracle/oracle.h"

namespace {

using moe_ep_test::DT;
using moe_ep_test::Mirror;
using moe_ep_test::Tensor;
namespace oracle = moe_ep_oracle;

const char *g_argv0 = nullptr;
constexpr uint64_t kSeed = 11;
constexpr int kExperts = moe_ep_test::kOneExperts, kHidden = moe_ep_test::kOneHidden;
constexpr int kTopK = moe_ep_test::kOneTopK, kCuda = MOE_EP_DEVICE_CUDA;

TEST(SetReuse, ZeroTokenNullDispatchReplacesTheLayout) {
  const moe_ep_plugin_v1_t *api = moe_ep_test::load_plugin(moe_ep_test::plugin_path(g_argv0));
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  moe_ep_group_t *g = nullptr;
  ASSERT_EQ(moe_ep_test::one_rank_group(api, "low_latency", &g), MOE_EP_OK)
      << "rank 0: " << api->last_error();

  moe_ep_test::OneRankLayer L(kSeed);
  const int T = L.T;
  std::vector<uint16_t> &recv_x = L.recv_x, &out = L.out;
  std::vector<int32_t> &count = L.count;
  Mirror &m_rx = L.m_rx, &m_cnt = L.m_cnt, &m_y = L.m_y, &m_out = L.m_out;
  Tensor &t_topk = *L.t_topk, &t_x = *L.t_x, &t_w = *L.t_w, &t_rx = *L.t_rx;
  Tensor &t_cnt = *L.t_cnt, &t_y = *L.t_y, &t_out = *L.t_out;

  // Handle A: prepare and dispatch (buffer set 0), checked exactly.
  moe_ep_prepare_params_t pp = moe_ep_prepare_params_init();
  pp.topk_idx = t_topk.get();
  pp.num_tokens = T;
  pp.top_k = kTopK;
  moe_ep_handle_t *a = nullptr;
  ASSERT_EQ(api->prepare(g, &pp, &a), MOE_EP_OK) << "rank 0: " << api->last_error();
  moe_ep_dispatch_params_t dp = moe_ep_dispatch_params_init();
  dp.hidden = kHidden;
  dp.x = t_x.get();
  dp.recv_x = t_rx.get();
  dp.recv_count = t_cnt.get();
  ASSERT_EQ(api->dispatch(g, a, &dp, nullptr), MOE_EP_OK) << "rank 0: " << api->last_error();
  m_cnt.download();
  m_rx.download();
  const oracle::LlDispatchExpected &want = L.want;
  ASSERT_EQ(oracle::compare_exact_i32("recv_count", count.data(), want.recv_count.data(),
                                      kExperts, kExperts), "")
      << "rank 0 seed " << kSeed;
  for (int e = 0; e < kExperts; e++) {
    for (int i = 0; i < count[e]; i++) {
      ASSERT_EQ(oracle::compare_exact_u16("recv_x", &recv_x[want.full_row(e, i) * kHidden],
                                          &want.x_bf16[want.row(e, i) * kHidden], kHidden,
                                          kHidden), "")
          << "rank 0 seed " << kSeed << " expert " << e << " row " << i;
    }
  }

  // Handle B: zero tokens, NULL data, on the same (only) set.
  Tensor t_topk0(nullptr, DT::kI64, {0, kTopK}, kCuda), t_x0(nullptr, DT::kBf16, {0, kHidden}, kCuda);
  Tensor t_w0(nullptr, DT::kF32, {0, kTopK}, kCuda), t_out0(nullptr, DT::kBf16, {0, kHidden}, kCuda);
  pp.topk_idx = t_topk0.get();
  pp.num_tokens = 0;
  moe_ep_handle_t *b = nullptr;
  ASSERT_EQ(api->prepare(g, &pp, &b), MOE_EP_OK) << "rank 0: " << api->last_error();
  dp.x = t_x0.get();
  ASSERT_EQ(api->dispatch(g, b, &dp, nullptr), MOE_EP_OK) << "rank 0: " << api->last_error();
  m_cnt.download();
  for (int e = 0; e < kExperts; e++) EXPECT_EQ(count[e], 0) << "rank 0: expert " << e;

  // y for A's slots (the oracle's, from what A's dispatch delivered).
  m_y.upload();
  moe_ep_combine_params_t cp = moe_ep_combine_params_init();
  cp.hidden = kHidden;
  cp.y = t_y.get();
  cp.topk_weights = t_w0.get();
  cp.out = t_out0.get();
  ASSERT_EQ(api->combine(g, b, &cp, nullptr), MOE_EP_OK) << "rank 0: " << api->last_error();

  // A's layout was replaced by B's dispatch on the same set.
  cp.topk_weights = t_w.get();
  cp.out = t_out.get();
  const moe_ep_status_t refused = api->combine(g, a, &cp, nullptr);
  EXPECT_EQ(refused, MOE_EP_ERR_INVALID_ARGUMENT) << "rank 0: " << api->last_error();
  EXPECT_NE(std::string(api->last_error()).find("overwritten"), std::string::npos)
      << "rank 0: " << api->last_error();
  EXPECT_EQ(api->group_poll_error(g), MOE_EP_OK) << "rank 0: " << api->last_error();

  // The group is usable: A's inputs again, dispatched and combined.
  api->handle_free(a);
  a = nullptr;
  pp.topk_idx = t_topk.get();
  pp.num_tokens = T;
  ASSERT_EQ(api->prepare(g, &pp, &a), MOE_EP_OK) << "rank 0: " << api->last_error();
  dp.x = t_x.get();
  ASSERT_EQ(api->dispatch(g, a, &dp, nullptr), MOE_EP_OK) << "rank 0: " << api->last_error();
  ASSERT_EQ(api->combine(g, a, &cp, nullptr), MOE_EP_OK) << "rank 0: " << api->last_error();
  m_out.download();
  const std::vector<uint16_t> &want_out = L.want_out;
  EXPECT_EQ(oracle::compare_exact_u16("out", out.data(), want_out.data(), want_out.size(),
                                      kHidden), "")
      << "rank 0 seed " << kSeed;

  api->handle_free(b);
  api->handle_free(a);
  EXPECT_EQ(api->group_destroy(g), MOE_EP_OK) << "rank 0: " << api->last_error();
}

}  // namespace

int main(int argc, char **argv) {
  g_argv0 = argv[0];
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
