// prepare_test.cc: expected prepare counts on a hand-written routing, and
// their mutual consistency on generated routings.
#include <algorithm>

#include <gtest/gtest.h>

#include "tests/oracle/prepare.h"

namespace moe_ep_oracle {
namespace {

TEST(Prepare, HandCase) {
  Problem p;  // 2 ranks, experts 0,1 on rank 0 and 2,3 on rank 1
  p.world = 2; p.num_experts = 4; p.hidden = 128; p.top_k = 2; p.max_tokens_per_rank = 3;
  RankInputs in;
  in.num_tokens = 3;
  in.topk_idx = {1, 2, /**/ 3, -1, /**/ 0, 1};
  in.topk_weights.assign(6, 0.5f);
  in.x.assign(3 * 128, 0);
  PrepareExpected e = prepare_expected(p, in);
  EXPECT_EQ(e.num_tokens_per_rank, (std::vector<int32_t>{2, 2}));
  EXPECT_EQ(e.num_tokens_per_expert, (std::vector<int32_t>{1, 2, 1, 1}));
  EXPECT_EQ(e.is_token_in_rank, (std::vector<uint8_t>{1, 1, /**/ 0, 1, /**/ 1, 0}));
}

TEST(Prepare, CountsAreConsistent) {
  for (Generator g : {Generator::kUniform, Generator::kMasked, Generator::kAllToOneRank}) {
    Problem p;
    p.world = 4; p.num_experts = 16; p.hidden = 128; p.top_k = 6; p.max_tokens_per_rank = 40;
    p.generator = g;
    for (int r = 0; r < p.world; ++r) {
      RankInputs in = make_inputs(p, r, 21);
      PrepareExpected e = prepare_expected(p, in);
      int64_t slots = std::count_if(in.topk_idx.begin(), in.topk_idx.end(), [](int64_t v) { return v != -1; });
      int64_t per_expert = 0;
      for (int32_t c : e.num_tokens_per_expert) per_expert += c;
      EXPECT_EQ(per_expert, slots);
      for (int d = 0; d < p.world; ++d) {
        int col = 0;
        for (int t = 0; t < in.num_tokens; ++t) col += e.is_token_in_rank[t * p.world + d];
        EXPECT_EQ(e.num_tokens_per_rank[d], col);
        int experts_on_d = 0;
        for (int x = 0; x < p.local_experts(); ++x)
          experts_on_d += e.num_tokens_per_expert[d * p.local_experts() + x];
        EXPECT_LE(e.num_tokens_per_rank[d], experts_on_d);  // a token may pick several
      }
    }
  }
}

}  // namespace
}  // namespace moe_ep_oracle
