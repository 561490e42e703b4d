// ht_test.cc: the HT receive on the hand case, count invariants against
// prepare, the partial and reduction by hand, and combine end to end.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>

#include <gtest/gtest.h>

#include "tests/oracle/hand_case.h"
#include "tests/oracle/oracle.h"

namespace moe_ep_oracle {
namespace {

TEST(HtDispatch, HandCase) {
  Problem p = hand_problem();
  std::vector<RankInputs> all = hand_inputs();
  HtDispatchExpected d0 = ht_dispatch_expected(p, all, 0);
  EXPECT_EQ(d0.num_recv, 4);
  EXPECT_EQ(d0.src_rank, (std::vector<int32_t>{0, 0, 1, 1}));
  EXPECT_EQ(d0.src_token, (std::vector<int32_t>{0, 2, 0, 2}));
  EXPECT_EQ(d0.recv_topk_idx, (std::vector<int32_t>{1, -1, 0, 1, -1, 0, 1, -1}));
  EXPECT_EQ(d0.recv_topk_weights, (std::vector<float>{0.25f, 0, 1.25f, 1.5f, 0, 1.5f, 2.25f, 0}));
  EXPECT_EQ(d0.num_recv_tokens_per_expert, (std::vector<int32_t>{2, 3}));
  HtDispatchExpected d1 = ht_dispatch_expected(p, all, 1);
  EXPECT_EQ(d1.num_recv, 4);
  EXPECT_EQ(d1.src_rank, (std::vector<int32_t>{0, 0, 1, 1}));
  EXPECT_EQ(d1.src_token, (std::vector<int32_t>{0, 1, 0, 2}));
  EXPECT_EQ(d1.recv_topk_idx, (std::vector<int32_t>{-1, 0, 1, -1, 0, -1, -1, 1}));
  EXPECT_EQ(d1.recv_topk_weights, (std::vector<float>{0, 0.5f, 0.75f, 0, 1.25f, 0, 0, 2.5f}));
  EXPECT_EQ(d1.num_recv_tokens_per_expert, (std::vector<int32_t>{2, 2}));
  for (int64_t n = 0; n < d1.num_recv; ++n)
    for (int i = 0; i < 128; ++i)
      ASSERT_EQ(d1.recv_x[n * 128 + i], float_to_bf16(hand_x(d1.src_rank[n], d1.src_token[n], i)));
}

TEST(HtCombine, PartialByHand) {
  Problem p = hand_problem();
  HtDispatchExpected d0 = ht_dispatch_expected(p, hand_inputs(), 0);
  std::vector<uint16_t> y = ht_partials(p, d0);
  auto ye = [](int e, float x) { return bf16_to_float(float_to_bf16(x * (1.0f + 0.01f * e))); };
  for (int i = 0; i < 128; ++i) {  // row 1 is (0, 2): experts 0 and 1, weights 1.25, 1.5
    float x = bf16_to_float(float_to_bf16(hand_x(0, 2, i)));
    float acc = 0.0f;
    acc += 1.25f * ye(0, x);
    acc += 1.5f * ye(1, x);
    ASSERT_EQ(y[128 + i], float_to_bf16(acc)) << i;
  }
}

TEST(HtCombine, IdentityPartialsCountReceivers) {
  // Each rank returns the rows it received: out[t] = (#ranks holding t) * x[t].
  Problem p = hand_problem();
  std::vector<RankInputs> all = hand_inputs();
  HtDispatchExpected d0 = ht_dispatch_expected(p, all, 0), d1 = ht_dispatch_expected(p, all, 1);
  const std::vector<int> times[2] = {{2, 1, 1}, {2, 0, 2}};
  for (int s = 0; s < 2; ++s) {
    std::vector<uint16_t> out = ht_combine_reduce(p, all, s, {d0.recv_x.data(), d1.recv_x.data()});
    for (int t = 0; t < 3; ++t)
      for (int i = 0; i < 128; ++i)
        ASSERT_EQ(bf16_to_float(out[t * 128 + i]),
                  times[s][t] * bf16_to_float(float_to_bf16(hand_x(s, t, i))))
            << "s " << s << " t " << t << " i " << i;
  }
}

// (generator, hidden): 2880 (gpt-oss) is a multiple of 8 but not of 128.
class HtGenerated : public ::testing::TestWithParam<std::tuple<Generator, int>> {};

TEST_P(HtGenerated, CountsAndEndToEndCombine) {
  Problem p;
  p.world = 4; p.num_experts = 32; p.hidden = std::get<1>(GetParam()); p.top_k = 5;
  p.max_tokens_per_rank = 50;
  p.generator = std::get<0>(GetParam());
  const int H = p.hidden, K = p.top_k, L = p.local_experts();
  std::vector<RankInputs> all = make_all_inputs(p, 99);
  std::vector<PrepareExpected> prep;
  for (const RankInputs& in : all) prep.push_back(prepare_expected(p, in));

  std::vector<HtDispatchExpected> d(p.world);
  std::vector<std::vector<uint16_t>> y(p.world);
  std::vector<const uint16_t*> yp(p.world);
  for (int r = 0; r < p.world; ++r) {
    d[r] = ht_dispatch_expected(p, all, r);
    int64_t want_n = 0;
    for (int s = 0; s < p.world; ++s) want_n += prep[s].num_tokens_per_rank[r];
    EXPECT_EQ(d[r].num_recv, want_n) << "rank " << r;
    for (int e = 0; e < L; ++e) {
      int32_t want = 0;
      for (int s = 0; s < p.world; ++s) want += prep[s].num_tokens_per_expert[r * L + e];
      EXPECT_EQ(d[r].num_recv_tokens_per_expert[e], want) << "rank " << r << " expert " << e;
    }
    for (int64_t n = 0; n < d[r].num_recv; ++n) {
      const int s = d[r].src_rank[n], t = d[r].src_token[n];
      if (n > 0) {
        ASSERT_LT(std::make_pair(d[r].src_rank[n - 1], d[r].src_token[n - 1]), std::make_pair(s, t));
      }
      ASSERT_EQ(prep[s].is_token_in_rank[t * p.world + r], 1);
      for (int k = 0; k < K; ++k) {
        int64_t e = all[s].topk_idx[t * K + k];
        bool here = e != -1 && p.rank_of_expert(e) == r;
        ASSERT_EQ(d[r].recv_topk_idx[n * K + k], here ? p.local_id(e) : -1);
        ASSERT_EQ(d[r].recv_topk_weights[n * K + k], here ? all[s].topk_weights[t * K + k] : 0.0f);
      }
    }
    y[r] = ht_partials(p, d[r]);
    yp[r] = y[r].data();
  }
  for (int s = 0; s < p.world; ++s) {
    std::vector<uint16_t> got = ht_combine_reduce(p, all, s, yp);
    std::vector<uint16_t> want = ht_combine_expected(p, all, s);
    EXPECT_EQ(compare_exact_u16("ht combine", got.data(), want.data(), want.size(), H), "") << "rank " << s;
  }
}

INSTANTIATE_TEST_SUITE_P(All, HtGenerated,
                         ::testing::Combine(::testing::Values(Generator::kUniform,
                                                              Generator::kSkewed,
                                                              Generator::kAllToOneRank,
                                                              Generator::kEmptyRanks,
                                                              Generator::kMasked),
                                            ::testing::Values(384, 2880)));

// Summing per node first: nodes of one rank and one node of every rank are
// the plain ascending sum, bit for bit; nodes of two give another order,
// which these inputs (y spanning several binades) show.
TEST(HtCombine, NodeSumsOnlyChangeMultiRankNodesAmongSeveral) {
  Problem p;
  p.world = 4; p.num_experts = 32; p.hidden = 384; p.top_k = 8;
  p.max_tokens_per_rank = 64;
  const std::vector<RankInputs> all = make_all_inputs(p, 5);
  std::vector<std::vector<uint16_t>> y(p.world);
  std::vector<const uint16_t*> yp(p.world);
  for (int r = 0; r < p.world; ++r) {
    y[r] = ht_wide_partials(ht_dispatch_expected(p, all, r).num_recv, p.hidden, 10 + r);
    yp[r] = y[r].data();
  }
  for (int s = 0; s < p.world; ++s) {
    const std::vector<uint16_t> flat = ht_combine_reduce(p, all, s, yp);
    for (int n : {1, 4}) {
      Problem q = p;
      q.node_ranks = n;
      const std::vector<uint16_t> got = ht_combine_reduce(q, all, s, yp);
      EXPECT_EQ(compare_exact_u16("ht combine", got.data(), flat.data(), flat.size(), p.hidden), "")
          << "rank " << s << ", nodes of " << n;
    }
  }
  Problem q = p;
  q.node_ranks = 2;
  int differ = 0;
  for (int s = 0; s < p.world; ++s) {
    const std::vector<uint16_t> flat = ht_combine_reduce(p, all, s, yp);
    const std::vector<uint16_t> nodes = ht_combine_reduce(q, all, s, yp);
    for (size_t i = 0; i < flat.size(); ++i) differ += flat[i] != nodes[i];
  }
  EXPECT_GT(differ, 0) << "nodes of 2 summed like one ascending sum: the test cannot tell them apart";
  q.node_ranks = 3;
  EXPECT_NE(problem_error(q).find("node_ranks must be 0 or divide world"), std::string::npos);
}

// Pre-quantised fp8 HT rows (every scale format): each received row is its
// source's quantised row and scales byte for byte, the partials see it
// dequantised, and combine end to end agrees with the per-token reference.
class HtFp8 : public ::testing::TestWithParam<ScaleFormat> {};

TEST_P(HtFp8, RowsVerbatimAndCombine) {
  Problem p;
  p.world = 3; p.num_experts = 12; p.hidden = 640; p.top_k = 4; p.max_tokens_per_rank = 20;
  p.generator = Generator::kMasked;
  p.dispatch_dtype = DispatchDtype::kFp8;
  p.scale_format = GetParam();
  const int H = p.hidden, G = p.scale_floats(), W = p.packed_scale_words();
  const bool packed = p.scale_format == ScaleFormat::kUe8m0Packed;
  std::vector<RankInputs> all = make_all_inputs(p, 23);
  std::vector<HtFp8Input> q;
  for (const RankInputs& in : all) q.push_back(ht_fp8_input(p, in));
  std::vector<std::vector<uint16_t>> y(p.world);
  std::vector<const uint16_t*> yp(p.world);
  for (int r = 0; r < p.world; ++r) {
    HtDispatchExpected d = ht_dispatch_expected(p, all, r);
    ASSERT_EQ(d.recv_x_fp8.size(), static_cast<size_t>(d.num_recv) * H);
    ASSERT_EQ(packed ? d.recv_scales_packed.size() : d.recv_scales.size(),
              static_cast<size_t>(d.num_recv) * (packed ? W : G));
    for (int64_t n = 0; n < d.num_recv; ++n) {
      const HtFp8Input& src = q[d.src_rank[n]];
      const size_t t = static_cast<size_t>(d.src_token[n]);
      ASSERT_EQ(compare_exact_u8("row", &d.recv_x_fp8[n * H], &src.x[t * H], H, H), "");
      for (int i = 0; i < (packed ? W : G); ++i) {
        if (packed) {
          ASSERT_EQ(d.recv_scales_packed[n * W + i], src.packed[t * W + i]);
        } else {
          ASSERT_EQ(d.recv_scales[n * G + i], src.scales[t * G + i]);
        }
      }
      // The partial is of the dequantised row, not of the bf16 source.
      std::vector<float> deq(H), want(H), scales(&src.scales[t * G], &src.scales[t * G] + G);
      if (p.scale_format == ScaleFormat::kPerToken) scales.assign(p.scale_groups(), scales[0]);
      dequantize_row(&src.x[t * H], scales.data(), H, deq.data());
      transported_row(p, &d.recv_x[n * H], want.data());
      ASSERT_EQ(std::memcmp(deq.data(), want.data(), H * sizeof(float)), 0) << "row " << n;
    }
    y[r] = ht_partials(p, d);
    yp[r] = y[r].data();
  }
  for (int s = 0; s < p.world; ++s) {
    std::vector<uint16_t> got = ht_combine_reduce(p, all, s, yp);
    std::vector<uint16_t> want = ht_combine_expected(p, all, s);
    EXPECT_EQ(compare_exact_u16("ht fp8 combine", got.data(), want.data(), want.size(), H), "")
        << "rank " << s;
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, HtFp8,
                         ::testing::Values(ScaleFormat::kF32, ScaleFormat::kUe8m0,
                                           ScaleFormat::kUe8m0Packed, ScaleFormat::kPerToken));

TEST(Compare, ExactMessages) {
  std::vector<uint16_t> a = {float_to_bf16(1.0f), float_to_bf16(2.0f), float_to_bf16(3.0f)};
  std::vector<uint16_t> b = {float_to_bf16(1.0f), float_to_bf16(2.5f), float_to_bf16(3.0f)};
  EXPECT_EQ(compare_exact_bf16("out", a.data(), a.data(), 3, 2), "");
  EXPECT_EQ(compare_exact_bf16("out", a.data(), b.data(), 3, 2),
            "out: 1 of 3 differ; first at [0, 1] (flat 1): got 0x4000 (2) want 0x4020 (2.5)");
}

}  // namespace
}  // namespace moe_ep_oracle
