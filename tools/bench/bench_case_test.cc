// bench_case_test.cc: the bench's routing. Uniform routing must stay the
// one every earlier result was measured with; skewed routing must give
// distinct experts per token and hot experts shared by every rank.
#include "tools/bench/bench_case.h"

#include <algorithm>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace mep_bench {
namespace {

constexpr int kExperts = 256, kTopK = 8, kTokens = 256;

// Loads of every expert over both ranks' routing (EP2, as the bench runs).
std::vector<int> Loads(uint64_t seed, double skew) {
  std::vector<int> load(kExperts, 0);
  for (int rank = 0; rank < 2; rank++) {
    for (int64_t e : Routing(seed, rank, kTokens, kTopK, kExperts, skew)) load[e]++;
  }
  return load;
}

void ExpectDistinctInRange(const std::vector<int64_t>& idx, double skew) {
  ASSERT_EQ(idx.size(), static_cast<size_t>(kTokens) * kTopK);
  for (int t = 0; t < kTokens; t++) {
    std::set<int64_t> row;
    for (int k = 0; k < kTopK; k++) {
      const int64_t e = idx[static_cast<size_t>(t) * kTopK + k];
      ASSERT_TRUE(e >= 0 && e < kExperts) << "skew " << skew << " token " << t << " k " << k
                                          << ": expert " << e;
      row.insert(e);
    }
    ASSERT_EQ(row.size(), static_cast<size_t>(kTopK)) << "skew " << skew << " token " << t
                                                      << ": an expert repeats";
  }
}

TEST(Routing, UniformKeepsTheMeasuredRouting) {
  // Seed 1's first tokens, as every table in tools/bench/RESULTS.md used.
  const std::vector<int64_t> rank0 = Routing(1, 0, 2, kTopK, kExperts);
  const std::vector<int64_t> want0 = {21,  243, 92, 89,  196, 144, 224, 52,
                                      116, 66,  235, 47, 112, 242, 249, 53};
  EXPECT_EQ(rank0, want0);
  const std::vector<int64_t> rank1 = Routing(1, 1, 1, kTopK, kExperts);
  const std::vector<int64_t> want1 = {159, 93, 79, 197, 113, 249, 105, 189};
  EXPECT_EQ(rank1, want1);
  EXPECT_EQ(Routing(1, 0, 2, kTopK, kExperts, 0.0), want0);
}

TEST(Routing, SkewedDrawsDistinctExpertsInRange) {
  for (double skew : {0.25, 0.5, 1.0, 2.0}) {
    for (int rank = 0; rank < 2; rank++) {
      ExpectDistinctInRange(Routing(7, rank, kTokens, kTopK, kExperts, skew), skew);
    }
  }
}

TEST(Routing, SkewMakesHotExpertsSharedByRanks) {
  const double mean = 2.0 * kTokens * kTopK / kExperts;
  const std::vector<int> uniform = Loads(1, 0.0);
  const std::vector<int> mild = Loads(1, 0.25);
  const std::vector<int> hot = Loads(1, 0.5);
  const int max_uniform = *std::max_element(uniform.begin(), uniform.end());
  const int max_mild = *std::max_element(mild.begin(), mild.end());
  const int max_hot = *std::max_element(hot.begin(), hot.end());
  // The flag's help text: ~3x and ~8x the mean at 256 experts, top-8.
  EXPECT_LT(max_uniform, 2.5 * mean) << "max " << max_uniform << " mean " << mean;
  EXPECT_GT(max_mild, 2.0 * mean) << "max " << max_mild << " mean " << mean;
  EXPECT_LT(max_mild, 4.5 * mean) << "max " << max_mild << " mean " << mean;
  EXPECT_GT(max_hot, 6.0 * mean) << "max " << max_hot << " mean " << mean;
  EXPECT_LT(max_hot, 11.0 * mean) << "max " << max_hot << " mean " << mean;
  // The hot experts come from the seed, not the rank.
  std::vector<int> per_rank[2];
  for (int rank = 0; rank < 2; rank++) {
    per_rank[rank].assign(kExperts, 0);
    for (int64_t e : Routing(1, rank, kTokens, kTopK, kExperts, 0.5)) per_rank[rank][e]++;
  }
  const auto hottest = [](const std::vector<int>& l) {
    return std::max_element(l.begin(), l.end()) - l.begin();
  };
  EXPECT_EQ(hottest(per_rank[0]), hottest(per_rank[1]));
}

TEST(Routing, SkewedRoutingIsDeterministic) {
  EXPECT_EQ(Routing(3, 1, 64, kTopK, kExperts, 0.5), Routing(3, 1, 64, kTopK, kExperts, 0.5));
  EXPECT_NE(Routing(3, 1, 64, kTopK, kExperts, 0.5), Routing(4, 1, 64, kTopK, kExperts, 0.5));
}

}  // namespace
}  // namespace mep_bench
