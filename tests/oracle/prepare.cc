// prepare.cc: counting loops over one rank's topk_idx.
#include "tests/oracle/prepare.h"

namespace moe_ep_oracle {

PrepareExpected prepare_expected(const Problem& p, const RankInputs& mine) {
  check_problem(p);
  const int T = mine.num_tokens, K = p.top_k, R = p.world;
  PrepareExpected out;
  out.num_tokens_per_rank.assign(R, 0);
  out.num_tokens_per_expert.assign(p.num_experts, 0);
  out.is_token_in_rank.assign(static_cast<size_t>(T) * R, 0);
  for (int t = 0; t < T; ++t) {
    for (int k = 0; k < K; ++k) {
      int64_t e = mine.topk_idx[static_cast<size_t>(t) * K + k];
      if (e == -1) continue;
      out.num_tokens_per_expert[e] += 1;
      out.is_token_in_rank[static_cast<size_t>(t) * R + p.rank_of_expert(e)] = 1;
    }
    for (int r = 0; r < R; ++r) out.num_tokens_per_rank[r] += out.is_token_in_rank[static_cast<size_t>(t) * R + r];
  }
  return out;
}

}  // namespace moe_ep_oracle
