// problem.cc: validation of a Problem, so a mis-specified test fails with a
// sentence instead of reading out of bounds.
#include "tests/oracle/problem.h"

namespace moe_ep_oracle {

std::string problem_error(const Problem& p) {
  auto s = [](const char* what, long v) { return std::string(what) + " = " + std::to_string(v); };
  if (p.world < 1) return s("world must be >= 1, got world", p.world);
  if (p.num_experts < p.world || p.num_experts % p.world != 0)
    return s("num_experts must be a positive multiple of world, got num_experts", p.num_experts);
  const bool fp8 = p.dispatch_dtype == DispatchDtype::kFp8;
  if (fp8 && (p.hidden < kGroupSize || p.hidden % kGroupSize != 0))
    return s("hidden must be a positive multiple of 128 with fp8 dispatch (one scale per 128 "
             "channels), got hidden", p.hidden);
  if (p.hidden < kBf16HiddenAlign || p.hidden % kBf16HiddenAlign != 0)
    return s("hidden must be a positive multiple of 8, got hidden", p.hidden);
  if (p.top_k < 1 || p.top_k > kMaxTopK) return s("top_k must be in [1, 32], got top_k", p.top_k);
  // Distinct experts per token need at least top_k experts to choose from.
  if (p.top_k > p.num_experts) return s("top_k must be <= num_experts, got top_k", p.top_k);
  if (p.max_tokens_per_rank < 0)
    return s("max_tokens_per_rank must be >= 0, got", p.max_tokens_per_rank);
  if (p.node_ranks < 0 || (p.node_ranks > 0 && p.world % p.node_ranks != 0))
    return s("node_ranks must be 0 or divide world, got node_ranks", p.node_ranks);
  return "";
}

void check_problem(const Problem& p) {
  std::string e = problem_error(p);
  if (!e.empty()) throw OracleError("bad Problem: " + e);
}

const char* generator_name(Generator g) {
  switch (g) {
    case Generator::kUniform: return "uniform";
    case Generator::kSkewed: return "skewed";
    case Generator::kAllToOneRank: return "all_to_one_rank";
    case Generator::kEmptyRanks: return "empty_ranks";
    case Generator::kMasked: return "masked";
  }
  return "?";
}

}  // namespace moe_ep_oracle
