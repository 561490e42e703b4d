// hand_case.h (tests only): a routing small enough to work out LL and HT
// layouts by hand. 2 ranks, 4 experts (0,1 on rank 0; 2,3 on rank 1), K = 2.
#ifndef MOE_EP_TESTS_ORACLE_HAND_CASE_H_
#define MOE_EP_TESTS_ORACLE_HAND_CASE_H_

#include <vector>

#include "tests/oracle/bf16.h"
#include "tests/oracle/inputs.h"

namespace moe_ep_oracle {

inline Problem hand_problem() {
  Problem p;
  p.world = 2;
  p.num_experts = 4;
  p.hidden = 128;
  p.top_k = 2;
  p.max_tokens_per_rank = 3;
  return p;
}

// Row (s, t) holds s*10 + t + 1 plus a small ramp over channels, so a wrong
// row or a shifted column both show.
inline float hand_x(int s, int t, int i) { return static_cast<float>(s * 10 + t + 1) / 16 + i / 1024.0f; }

// rank 0: t0 -> {1, 2}, t1 -> {3, -1}, t2 -> {0, 1}
// rank 1: t0 -> {2, 0}, t1 -> {-1, -1}, t2 -> {1, 3}
inline std::vector<RankInputs> hand_inputs() {
  const std::vector<std::vector<int64_t>> idx = {{1, 2, 3, -1, 0, 1}, {2, 0, -1, -1, 1, 3}};
  std::vector<RankInputs> all(2);
  for (int s = 0; s < 2; ++s) {
    RankInputs& in = all[s];
    in.num_tokens = 3;
    in.topk_idx = idx[s];
    for (int j = 0; j < 6; ++j) in.topk_weights.push_back(0.25f * (j + 1) + s);  // distinct
    for (int t = 0; t < 3; ++t)
      for (int i = 0; i < 128; ++i) in.x.push_back(float_to_bf16(hand_x(s, t, i)));
  }
  return all;
}

}  // namespace moe_ep_oracle

#endif  // MOE_EP_TESTS_ORACLE_HAND_CASE_H_
