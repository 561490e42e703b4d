// ll_combine_test.cc: the LL combine's documented summation order (the same
// wherever the weights were applied): the hand case worked out step by
// step, and small cases whose bits show each part of the rule (one rounding
// per product, a bf16 rounding per rank's partial, first-appearance order,
// the +0 start).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "tests/oracle/hand_case.h"
#include "tests/oracle/oracle.h"

namespace moe_ep_oracle {
namespace {

float round_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }
float expert_y(int e, float x) { return round_bf16(x * expert_gain(e)); }

TEST(LlCombine, HandCaseByHand) {
  Problem p = hand_problem();  // experts 0, 1 on rank 0; 2, 3 on rank 1
  std::vector<RankInputs> all = hand_inputs();
  std::vector<uint16_t> out0 = ll_combine_expected(p, all[0]);
  std::vector<uint16_t> out1 = ll_combine_expected(p, all[1]);
  for (int i = 0; i < 128; ++i) {
    auto x = [&](int s, int t) { return round_bf16(hand_x(s, t, i)); };
    // rank 0 t0 -> {1, 2}: rank 0's partial, then rank 1's.
    float acc = 0.0f;
    acc += round_bf16(std::fma(0.25f, expert_y(1, x(0, 0)), 0.0f));
    acc += round_bf16(std::fma(0.5f, expert_y(2, x(0, 0)), 0.0f));
    ASSERT_EQ(out0[i], float_to_bf16(acc)) << i;
    // rank 0 t2 -> {0, 1}: one partial of both slots, k ascending.
    const float p2 = std::fma(1.5f, expert_y(1, x(0, 2)), std::fma(1.25f, expert_y(0, x(0, 2)), 0.0f));
    ASSERT_EQ(out0[256 + i], float_to_bf16(0.0f + round_bf16(p2))) << i;
    // rank 1 t0 -> {2, 0}: rank 1 appears first, so its partial is added
    // first (weights of rank 1: 0.25 * (j + 1) + 1).
    acc = 0.0f;
    acc += round_bf16(std::fma(1.25f, expert_y(2, x(1, 0)), 0.0f));
    acc += round_bf16(std::fma(1.5f, expert_y(0, x(1, 0)), 0.0f));
    ASSERT_EQ(out1[i], float_to_bf16(acc)) << i;
    ASSERT_EQ(out1[128 + i], 0) << i;  // no expert: +0
  }
}

// One token of `p` with the given routing and weights; y(t, k) returns
// a row whose every channel holds ys[k].
struct OneToken {
  Problem p;
  RankInputs in;
  std::vector<std::vector<uint16_t>> rows;
  OneToken(int world, int experts, std::vector<int64_t> idx, std::vector<float> w,
           std::vector<float> ys) {
    p.world = world;
    p.num_experts = experts;
    p.hidden = 8;
    p.top_k = static_cast<int>(idx.size());
    p.max_tokens_per_rank = 1;
    in.num_tokens = 1;
    in.topk_idx = idx;
    in.topk_weights = w;
    in.x.assign(8, 0);
    for (float v : ys) rows.emplace_back(8, float_to_bf16(v));
  }
  uint16_t out() const {
    std::vector<uint16_t> o = ll_combine_reduce(p, in, [&](int, int k) { return rows[k].data(); });
    for (uint16_t v : o) EXPECT_EQ(v, o[0]);  // every channel alike
    return o[0];
  }
};

// w * y + acc is one rounding (fma): here the separately rounded product
// would lose 0.98 * 2^-24 and land on a bf16 tie (1.0), the fused one is
// just above it (1.0078125).
TEST(LlCombine, ProductsAreFused) {
  uint32_t wbits = 0x3F7F01FDu;  // 0.99612409f; w * 1.0078125 = 1 + 2^-8 + 0.98 * 2^-24
  float w;
  std::memcpy(&w, &wbits, sizeof w);
  OneToken c(2, 4, {0, 1}, {1.0f, w}, {std::ldexp(1.0f, -24), 1.0078125f});
  EXPECT_EQ(c.out(), 0x3F81);  // both on rank 0: one partial
}

// Each rank's partial is rounded to bf16 before the sum: 1 + 2^-8 rounds
// (to even) to 1 on rank 0, and 1 + 2^-8 again after rank 1's 2^-8; one
// f32 sum over the slots would keep 1 + 2^-7.
TEST(LlCombine, PartialsAreRoundedPerRank) {
  const float eps = std::ldexp(1.0f, -8);
  OneToken c(2, 4, {0, 2, 1}, {1.0f, 1.0f, 1.0f}, {1.0f, eps, eps});
  EXPECT_EQ(c.out(), float_to_bf16(1.0f));
  EXPECT_NE(c.out(), float_to_bf16(1.0f + 2 * eps));
}

// Partials are added in the order their ranks first appear in the token's
// top-k (here ranks 1, 2, 0, with a -1 slot between), not in rank order:
// 2^30 - 2^30 + 1 = 1, while 1 + 2^30 - 2^30 would be 0 in f32.
TEST(LlCombine, PartialsInFirstAppearanceOrder) {
  const float big = std::ldexp(1.0f, 30);
  OneToken c(3, 6, {2, -1, 4, 0}, {1.0f, 1.0f, 1.0f, 1.0f}, {big, 0.0f, -big, 1.0f});
  EXPECT_EQ(c.out(), float_to_bf16(1.0f));
  // A rank's later slots join its partial at its first appearance: experts
  // 2 and 3 are rank 1's, so rank 1's partial is big - big, then rank 0's 1.
  OneToken d(2, 4, {2, 0, 3}, {1.0f, 1.0f, 1.0f}, {big, 1.0f, -big});
  EXPECT_EQ(d.out(), float_to_bf16(1.0f));  // (big - big) + 1, not big + 1 - big = 0
}

// Sums start at +0: a -0 product (or none) gives +0, never -0.
TEST(LlCombine, SumsStartAtPositiveZero) {
  OneToken neg(2, 4, {0, -1}, {1.0f, 1.0f}, {-0.0f, 0.0f});
  EXPECT_EQ(neg.out(), 0x0000);
  OneToken none(2, 4, {-1, -1}, {1.0f, 1.0f}, {1.0f, 1.0f});
  EXPECT_EQ(none.out(), 0x0000);
}

}  // namespace
}  // namespace moe_ep_oracle
