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
#include "tests/oracle/oracle.h"

namespace {

using moe_ep_test::DT;
using moe_ep_test::Mirror;
using moe_ep_test::Tensor;
namespace oracle = moe_ep_oracle;

const char *g_argv0 = nullptr;
constexpr uint64_t kSeed = 11;
constexpr int kExperts = 8, kHidden = 256, kTopK = 4, kMaxTokens = 16;
constexpr int kCuda = MOE_EP_DEVICE_CUDA;

// The group's config; moe_ep_run's MOE_EP_BOOTSTRAP_ADDRESS overrides the
// address when the test runs under it.
std::string config_text() {
  char y[512];
  std::snprintf(y, sizeof y,
                "moe_ep:\n  backend: nccl\n  num_experts: %d\n  hidden: %d\n  top_k: %d\n"
                "  max_tokens_per_rank: %d\n  double_buffer: false\n"
                "  timeouts:\n    kernel_ms: 10000\n"
                "  bootstrap:\n    address: 127.0.0.1:%d\n    timeout_ms: 10000\n",
                kExperts, kHidden, kTopK, kMaxTokens, 20000 + (int)(getpid() % 20000));
  return y;
}

TEST(SetReuse, ZeroTokenNullDispatchReplacesTheLayout) {
  const moe_ep_plugin_v1_t *api = moe_ep_test::load_plugin(moe_ep_test::plugin_path(g_argv0));
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  moe_ep_config_t *cfg = nullptr;
  ASSERT_EQ(api->config_from_yaml(config_text().c_str(), &cfg), MOE_EP_OK) << api->last_error();
  moe_ep_group_params_t gp = moe_ep_group_params_init();
  gp.config = cfg;
  gp.rank = 0;
  gp.world_size = 1;
  gp.cuda_device = 0;
  moe_ep_group_t *g = nullptr;
  const moe_ep_status_t created = api->group_create(&gp, &g);
  api->config_free(cfg);
  ASSERT_EQ(created, MOE_EP_OK) << "rank 0: " << api->last_error();

  oracle::Problem p;
  p.world = 1;
  p.num_experts = kExperts;
  p.hidden = kHidden;
  p.top_k = kTopK;
  p.max_tokens_per_rank = kMaxTokens;
  oracle::check_problem(p);
  oracle::RankInputs in = oracle::make_inputs(p, 0, kSeed);
  const int T = in.num_tokens, slots = kMaxTokens;  // world 1: R * max_tokens
  std::vector<uint16_t> recv_x((size_t)kExperts * slots * kHidden, 0xffff);
  std::vector<uint16_t> y(recv_x.size(), 0), out((size_t)T * kHidden, 0xffff);
  std::vector<int32_t> count(kExperts, -1);
  Mirror m_topk, m_x, m_w, m_rx, m_cnt, m_y, m_out;
  m_topk.init(true, in.topk_idx.data(), in.topk_idx.size() * 8);
  m_x.init(true, in.x.data(), in.x.size() * 2);
  m_w.init(true, in.topk_weights.data(), in.topk_weights.size() * 4);
  m_rx.init(true, recv_x.data(), recv_x.size() * 2);
  m_cnt.init(true, count.data(), count.size() * 4);
  m_y.init(true, y.data(), y.size() * 2);
  m_out.init(true, out.data(), out.size() * 2);
  Tensor t_topk(m_topk.ptr(), DT::kI64, {T, kTopK}, kCuda), t_x(m_x.ptr(), DT::kBf16, {T, kHidden}, kCuda);
  Tensor t_w(m_w.ptr(), DT::kF32, {T, kTopK}, kCuda);
  Tensor t_rx(m_rx.ptr(), DT::kBf16, {kExperts, slots, kHidden}, kCuda);
  Tensor t_cnt(m_cnt.ptr(), DT::kI32, {kExperts}, kCuda);
  Tensor t_y(m_y.ptr(), DT::kBf16, {kExperts, slots, kHidden}, kCuda);
  Tensor t_out(m_out.ptr(), DT::kBf16, {T, kHidden}, kCuda);

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
  const oracle::LlDispatchExpected want = oracle::ll_dispatch_expected(p, {in}, 0);
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

  // y for A's slots, from the oracle's view of what A's dispatch delivered.
  std::vector<float> row(kHidden);
  for (int e = 0; e < kExperts; e++) {
    for (int i = 0; i < want.recv_count[e]; i++) {
      oracle::ll_received_row(p, want, want.row(e, i), row.data());
      oracle::expert_fn_row(e, row.data(), kHidden, &y[want.full_row(e, i) * kHidden]);
    }
  }
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
  const std::vector<uint16_t> want_out = oracle::ll_combine_expected(p, in);
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
