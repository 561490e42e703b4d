// inputs_test.cc: properties of every routing generator, and determinism of
// make_inputs per (seed, rank).
#include <algorithm>
#include <cmath>
#include <set>

#include <gtest/gtest.h>

#include "tests/oracle/bf16.h"
#include "tests/oracle/inputs.h"

namespace moe_ep_oracle {
namespace {

Problem make_problem(Generator g, int world = 4, int experts = 32, int k = 8) {
  Problem p;
  p.world = world;
  p.num_experts = experts;
  p.hidden = 256;
  p.top_k = k;
  p.max_tokens_per_rank = 64;
  p.generator = g;
  return p;
}

const Generator kAll[] = {Generator::kUniform, Generator::kSkewed, Generator::kAllToOneRank,
                          Generator::kEmptyRanks, Generator::kMasked};

TEST(Inputs, ShapesRangesAndDistinctExperts) {
  for (Generator g : kAll) {
    Problem p = make_problem(g);
    for (uint64_t seed : {1u, 2u, 77u}) {
      for (int r = 0; r < p.world; ++r) {
        RankInputs in = make_inputs(p, r, seed);
        SCOPED_TRACE(std::string(generator_name(g)) + " seed " + std::to_string(seed) +
                     " rank " + std::to_string(r));
        const size_t T = in.num_tokens;
        ASSERT_EQ(in.x.size(), T * p.hidden);
        ASSERT_EQ(in.topk_idx.size(), T * p.top_k);
        ASSERT_EQ(in.topk_weights.size(), T * p.top_k);
        for (uint16_t v : in.x) ASSERT_LE(std::fabs(bf16_to_float(v)), 2.0f);
        for (float w : in.topk_weights) ASSERT_TRUE(w >= 0.05f && w <= 1.0f) << w;
        for (size_t t = 0; t < T; ++t) {
          std::set<int64_t> seen;
          for (int k = 0; k < p.top_k; ++k) {
            int64_t e = in.topk_idx[t * p.top_k + k];
            ASSERT_TRUE(e >= -1 && e < p.num_experts) << e;
            if (e != -1) {
              ASSERT_TRUE(seen.insert(e).second) << "duplicate " << e << " token " << t;
            }
          }
        }
      }
    }
  }
}

TEST(Inputs, Deterministic) {
  for (Generator g : kAll) {
    Problem p = make_problem(g);
    RankInputs a = make_inputs(p, 1, 5), b = make_inputs(p, 1, 5);
    EXPECT_EQ(a.num_tokens, b.num_tokens);
    EXPECT_EQ(a.x, b.x);
    EXPECT_EQ(a.topk_idx, b.topk_idx);
    EXPECT_EQ(a.topk_weights, b.topk_weights);
  }
}

TEST(Inputs, DifferentRankOrSeedDiffers) {
  Problem p = make_problem(Generator::kUniform);
  RankInputs a = make_inputs(p, 0, 5), b = make_inputs(p, 1, 5), c = make_inputs(p, 0, 6);
  EXPECT_NE(a.x, b.x);
  EXPECT_NE(a.topk_idx, b.topk_idx);
  EXPECT_NE(a.topk_weights, b.topk_weights);
  EXPECT_NE(a.x, c.x);
  EXPECT_NE(a.topk_idx, c.topk_idx);
}

TEST(Inputs, XDoesNotDependOnTheRoutingGenerator) {
  RankInputs a = make_inputs(make_problem(Generator::kUniform), 2, 9);
  RankInputs b = make_inputs(make_problem(Generator::kSkewed), 2, 9);
  EXPECT_EQ(a.x, b.x);
  EXPECT_EQ(a.topk_weights, b.topk_weights);
}

TEST(Inputs, UniformUsesFullBatchAndEveryExpert) {
  Problem p = make_problem(Generator::kUniform);
  RankInputs in = make_inputs(p, 0, 3);
  EXPECT_EQ(in.num_tokens, p.max_tokens_per_rank);
  EXPECT_EQ(std::count(in.topk_idx.begin(), in.topk_idx.end(), -1), 0);
  std::set<int64_t> used(in.topk_idx.begin(), in.topk_idx.end());
  EXPECT_EQ(used.size(), static_cast<size_t>(p.num_experts));  // 512 picks over 32
}

TEST(Inputs, SkewedFavoursHotExperts) {
  Problem p = make_problem(Generator::kSkewed, 8, 256, 8);  // hot = first 8
  RankInputs in = make_inputs(p, 0, 3);
  size_t hot = std::count_if(in.topk_idx.begin(), in.topk_idx.end(), [](int64_t e) { return e < 8; });
  // ~0.7 of picks aim at 8 hot experts, minus rejections of repeats within a token.
  EXPECT_GT(hot, in.topk_idx.size() / 3);
  Problem q = make_problem(Generator::kSkewed, 2, 4, 4);  // hot set == every expert
  RankInputs small = make_inputs(q, 1, 3);                // must terminate
  EXPECT_EQ(small.num_tokens, q.max_tokens_per_rank);
}

TEST(Inputs, AllToOneRankTargetsOneRank) {
  for (uint64_t seed : {0u, 1u, 6u, 11u}) {
    Problem p = make_problem(Generator::kAllToOneRank, 4, 32, 4);  // L = 8 >= K
    const int target = static_cast<int>(seed % p.world);
    for (int r = 0; r < p.world; ++r) {
      RankInputs in = make_inputs(p, r, seed);
      for (int64_t e : in.topk_idx) {
        ASSERT_NE(e, -1);
        ASSERT_EQ(p.rank_of_expert(e), target) << "seed " << seed;
      }
    }
  }
  // K = 8 > L = 2: the two local experts of the target, then six -1.
  Problem p = make_problem(Generator::kAllToOneRank, 4, 8, 8);
  RankInputs in = make_inputs(p, 0, 3);
  for (int t = 0; t < in.num_tokens; ++t) {
    std::set<int64_t> valid(&in.topk_idx[t * 8], &in.topk_idx[t * 8 + 2]);
    EXPECT_EQ(valid, (std::set<int64_t>{6, 7}));
    for (int k = 2; k < 8; ++k) EXPECT_EQ(in.topk_idx[t * 8 + k], -1);
  }
}

TEST(Inputs, EmptyRanksHaveNoTokens) {
  Problem p = make_problem(Generator::kEmptyRanks);
  for (uint64_t seed : {4u, 5u}) {
    int empty = 0;
    for (int r = 0; r < p.world; ++r) {
      RankInputs in = make_inputs(p, r, seed);
      bool should_be_empty = (r + seed) % 2 == 1;
      if (should_be_empty) {
        ++empty;
        EXPECT_EQ(in.num_tokens, 0);
        EXPECT_TRUE(in.x.empty() && in.topk_idx.empty() && in.topk_weights.empty());
      } else {
        EXPECT_GE(in.num_tokens, 1);
        EXPECT_LE(in.num_tokens, p.max_tokens_per_rank);
        EXPECT_EQ(std::count(in.topk_idx.begin(), in.topk_idx.end(), -1), 0);
      }
      EXPECT_EQ(num_tokens_for_rank(p, r, seed), in.num_tokens);
    }
    EXPECT_EQ(empty, 2);
  }
}

TEST(Inputs, MaskedHasMinusOnesAndAnEmptyToken) {
  Problem p = make_problem(Generator::kMasked);
  for (int r = 0; r < p.world; ++r) {
    RankInputs in = make_inputs(p, r, 13);
    size_t masked = std::count(in.topk_idx.begin(), in.topk_idx.end(), -1);
    double frac = static_cast<double>(masked) / in.topk_idx.size();
    EXPECT_GT(frac, 0.15);
    EXPECT_LT(frac, 0.40);
    int all_masked = 0;
    for (int t = 0; t < in.num_tokens; ++t)
      all_masked += std::all_of(&in.topk_idx[t * p.top_k], &in.topk_idx[(t + 1) * p.top_k],
                                [](int64_t e) { return e == -1; });
    EXPECT_GE(all_masked, 1);
  }
}

TEST(Inputs, RejectsBadProblems) {
  Problem p = make_problem(Generator::kUniform);
  EXPECT_EQ(problem_error(p), "");
  p.num_experts = 30;  // not a multiple of world 4
  EXPECT_NE(problem_error(p), "");
  p = make_problem(Generator::kUniform);
  p.hidden = 100;
  EXPECT_NE(problem_error(p), "");
  p = make_problem(Generator::kUniform, 4, 4, 8);  // top_k > experts
  EXPECT_NE(problem_error(p), "");
}

}  // namespace
}  // namespace moe_ep_oracle
