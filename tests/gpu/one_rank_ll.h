// one_rank_ll.h: what the one-rank, one-GPU public-API tests share: the
// nccl group's YAML, the oracle's problem and inputs for one LL layer
// (bf16, weights at combine), device mirrors of every tensor, and the
// oracle's y (the expert function applied to what the dispatch delivers)
// and combined output.
#ifndef MEP_TESTS_GPU_ONE_RANK_LL_H_
#define MEP_TESTS_GPU_ONE_RANK_LL_H_

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "moe_ep.h"
#include "tests/common/mirror.h"
#include "tests/common/plugin_api.h"
#include "tests/oracle/oracle.h"

namespace moe_ep_test {

constexpr int kOneExperts = 8, kOneHidden = 256, kOneTopK = 4, kOneMaxTokens = 16;

// The group's config (one buffer set); moe_ep_run's MOE_EP_BOOTSTRAP_ADDRESS
// overrides the address when the test runs under it.
inline std::string one_rank_config(const char *mode) {
  char y[512];
  std::snprintf(y, sizeof y,
                "moe_ep:\n  backend: nccl\n  mode: %s\n  num_experts: %d\n  hidden: %d\n"
                "  top_k: %d\n  max_tokens_per_rank: %d\n  double_buffer: false\n"
                "  timeouts:\n    kernel_ms: 10000\n"
                "  bootstrap:\n    address: 127.0.0.1:%d\n    timeout_ms: 10000\n",
                mode, kOneExperts, kOneHidden, kOneTopK, kOneMaxTokens,
                20000 + (int)(getpid() % 20000));
  return y;
}

// Creates a one-rank group on GPU 0 from the calling thread.
inline moe_ep_status_t one_rank_group(const moe_ep_plugin_v1_t *api, const char *mode,
                                      moe_ep_group_t **g) {
  moe_ep_config_t *cfg = nullptr;
  moe_ep_status_t st = api->config_from_yaml(one_rank_config(mode).c_str(), &cfg);
  if (st != MOE_EP_OK) return st;
  moe_ep_group_params_t gp = moe_ep_group_params_init();
  gp.config = cfg;
  gp.rank = 0;
  gp.world_size = 1;
  gp.cuda_device = 0;
  st = api->group_create(&gp, g);
  api->config_free(cfg);
  return st;
}

// One LL layer on one rank: inputs, outputs (recv_x and out start as
// 0xffff), their device mirrors and tensors, and the oracle's answers.
struct OneRankLayer {
  moe_ep_oracle::Problem p;
  moe_ep_oracle::RankInputs in;
  moe_ep_oracle::LlDispatchExpected want;
  std::vector<uint16_t> want_out;
  int T = 0;
  std::vector<uint16_t> recv_x, y, out;
  std::vector<int32_t> count;
  Mirror m_topk, m_x, m_w, m_rx, m_cnt, m_y, m_out;
  std::unique_ptr<Tensor> t_topk, t_x, t_w, t_rx, t_cnt, t_y, t_out;

  explicit OneRankLayer(uint64_t seed) {
    p.world = 1;
    p.num_experts = kOneExperts;
    p.hidden = kOneHidden;
    p.top_k = kOneTopK;
    p.max_tokens_per_rank = kOneMaxTokens;
    moe_ep_oracle::check_problem(p);
    in = moe_ep_oracle::make_inputs(p, 0, seed);
    T = in.num_tokens;
    const int slots = kOneMaxTokens;  // world 1: R * max_tokens
    const int cuda = MOE_EP_DEVICE_CUDA;
    recv_x.assign((size_t)kOneExperts * slots * kOneHidden, 0xffff);
    y.assign(recv_x.size(), 0);
    out.assign((size_t)T * kOneHidden, 0xffff);
    count.assign(kOneExperts, -1);
    want = moe_ep_oracle::ll_dispatch_expected(p, {in}, 0);
    std::vector<float> row(kOneHidden);
    for (int e = 0; e < kOneExperts; e++) {
      for (int i = 0; i < want.recv_count[e]; i++) {
        moe_ep_oracle::ll_received_row(p, want, want.row(e, i), row.data());
        moe_ep_oracle::expert_fn_row(e, row.data(), kOneHidden,
                                     &y[want.full_row(e, i) * kOneHidden]);
      }
    }
    want_out = moe_ep_oracle::ll_combine_expected(p, in);
    m_topk.init(true, in.topk_idx.data(), in.topk_idx.size() * 8);
    m_x.init(true, in.x.data(), in.x.size() * 2);
    m_w.init(true, in.topk_weights.data(), in.topk_weights.size() * 4);
    m_rx.init(true, recv_x.data(), recv_x.size() * 2);
    m_cnt.init(true, count.data(), count.size() * 4);
    m_y.init(true, y.data(), y.size() * 2);
    m_out.init(true, out.data(), out.size() * 2);
    t_topk = std::make_unique<Tensor>(m_topk.ptr(), DT::kI64, std::vector<int64_t>{T, kOneTopK}, cuda);
    t_x = std::make_unique<Tensor>(m_x.ptr(), DT::kBf16, std::vector<int64_t>{T, kOneHidden}, cuda);
    t_w = std::make_unique<Tensor>(m_w.ptr(), DT::kF32, std::vector<int64_t>{T, kOneTopK}, cuda);
    t_rx = std::make_unique<Tensor>(m_rx.ptr(), DT::kBf16, std::vector<int64_t>{kOneExperts, slots, kOneHidden}, cuda);
    t_cnt = std::make_unique<Tensor>(m_cnt.ptr(), DT::kI32, std::vector<int64_t>{kOneExperts}, cuda);
    t_y = std::make_unique<Tensor>(m_y.ptr(), DT::kBf16, std::vector<int64_t>{kOneExperts, slots, kOneHidden}, cuda);
    t_out = std::make_unique<Tensor>(m_out.ptr(), DT::kBf16, std::vector<int64_t>{T, kOneHidden}, cuda);
  }
};

}  // namespace moe_ep_test

#endif  // MEP_TESTS_GPU_ONE_RANK_LL_H_
