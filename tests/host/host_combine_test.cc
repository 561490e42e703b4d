// host_combine_test.cc: the host backend's combine reductions
// (kernels/host/host_combine.h) against the oracle's documented order, bit
// for bit, for both places the weights can be applied. The y rows span several
// binades and both signs, so sums cancel and another order or rounding shows.
#include <cstdio>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/host/host_combine.h"
#include "tests/oracle/oracle.h"
#include "tests/oracle/rng.h"

namespace moe_ep_test {
namespace {

using namespace moe_ep_oracle;

struct Shape {
  int world, experts, hidden, top_k;
  Generator gen;
};

class HostCombine : public testing::TestWithParam<Shape> {};

TEST_P(HostCombine, MatchesOracleBitForBit) {
  const Shape& sh = GetParam();
  Problem p;
  p.world = sh.world;
  p.num_experts = sh.experts;
  p.hidden = sh.hidden;
  p.top_k = sh.top_k;
  p.max_tokens_per_rank = 32;
  p.generator = sh.gen;
  const int H = p.hidden, K = p.top_k;
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    const RankInputs in = make_inputs(p, 0, seed);
    // y of every slot: sign, exponent in [-3, 3] and mantissa at random.
    SplitMix64 rng(seed * 7777);
    std::vector<uint16_t> y(static_cast<size_t>(in.num_tokens) * K * H);
    for (uint16_t& v : y)
      v = static_cast<uint16_t>((rng.below(2) << 15) | ((127 - 3 + rng.below(7)) << 7) |
                                rng.below(128));
    auto row = [&](int t, int k) { return &y[(static_cast<size_t>(t) * K + k) * H]; };
    const std::vector<uint16_t> want = ll_combine_reduce(p, in, row);
    std::vector<uint16_t> got(want.size(), 0x7FC1);
    for (int t = 0; t < in.num_tokens; ++t) {
      const uint16_t* rows[kMaxTopK];
      int32_t rank[kMaxTopK];
      for (int k = 0; k < K; ++k) {
        const int64_t e = in.topk_idx[static_cast<size_t>(t) * K + k];
        rows[k] = e == -1 ? nullptr : row(t, k);
        rank[k] = e == -1 ? -1 : p.rank_of_expert(e);
      }
      const float* w = &in.topk_weights[static_cast<size_t>(t) * K];
      mep_combine_partials(&got[static_cast<size_t>(t) * H], rows, w, rank, K, H);
    }
    EXPECT_EQ(compare_exact_bf16("out", got.data(), want.data(), want.size(), H), "")
        << "seed " << seed << " generator " << generator_name(p.generator) << " hidden " << H
        << " top_k " << K;
  }
}

// HT, summed per node: rows 2^24, 2^16, 1, 1 from ranks 0..3. As one
// ascending sum each 1 is lost to rounding (2^24 + 2^16 + 1 ties to even)
// and the bf16 result is the tie 2^24 + 2^16, rounded down to 2^24; as
// nodes of two the second node's 2 survives and the result rounds up.
TEST(HostCombineHt, NodeSumsThenAcrossNodes) {
  const uint16_t r0 = 0x4B80, r1 = 0x4780, one = 0x3F80;  // 2^24, 2^16, 1
  const uint16_t *rows[4] = {&r0, &r1, &one, &one};
  const int32_t ranks[4] = {0, 1, 2, 3};
  uint16_t out = 0;
  for (int n : {0, 1, 4}) {
    mep_combine_sum(&out, rows, ranks, 4, n, 1);
    EXPECT_EQ(out, 0x4B80) << "nodes of " << n;
  }
  mep_combine_sum(&out, rows, ranks, 4, 2, 1);
  EXPECT_EQ(out, 0x4B81) << "nodes of 2";
  // Missing ranks: rows from ranks 1 and 2 only, nodes of 2: 2^16 and 1
  // each sit alone in their node.
  const uint16_t *two[2] = {&r1, &one};
  const int32_t two_ranks[2] = {1, 2};
  mep_combine_sum(&out, two, two_ranks, 2, 2, 1);
  EXPECT_EQ(out, 0x4780);  // 65537 rounds to 2^16 in bf16
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, HostCombine,
    testing::Values(Shape{2, 8, 2880, 4, Generator::kUniform},
                    Shape{2, 64, 2880, 9, Generator::kMasked},
                    Shape{4, 64, 1032, 8, Generator::kSkewed},
                    Shape{8, 256, 128, 32, Generator::kUniform},
                    Shape{4, 16, 2056, 6, Generator::kEmptyRanks},
                    Shape{4, 64, 7168, 8, Generator::kAllToOneRank}));

}  // namespace
}  // namespace moe_ep_test
