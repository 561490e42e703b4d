// ll_combine.cc: expected LL combine: a weighted sum per token in ascending k.
#include <vector>

#include "tests/oracle/bf16.h"
#include "tests/oracle/expert.h"
#include "tests/oracle/ll.h"

namespace moe_ep_oracle {

std::vector<uint16_t> ll_combine_reduce(const Problem& p, const RankInputs& mine,
                                        const LlSlotY& y) {
  check_problem(p);
  const int T = mine.num_tokens, K = p.top_k, H = p.hidden;
  std::vector<uint16_t> out(static_cast<size_t>(T) * H);
  std::vector<float> acc(H);
  for (int t = 0; t < T; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int k = 0; k < K; ++k) {
      size_t tk = static_cast<size_t>(t) * K + k;
      if (mine.topk_idx[tk] == -1) continue;
      const float w = mine.topk_weights[tk];
      const uint16_t* yk = y(t, k);
      for (int i = 0; i < H; ++i) acc[i] += w * bf16_to_float(yk[i]);
    }
    for (int i = 0; i < H; ++i) out[static_cast<size_t>(t) * H + i] = float_to_bf16(acc[i]);
  }
  return out;
}

std::vector<uint16_t> ll_combine_expected(const Problem& p, const RankInputs& mine) {
  const int K = p.top_k, H = p.hidden;
  // y of every valid slot, computed once per token (O(T*K*H) in all).
  std::vector<float> xr(H);
  std::vector<uint16_t> ys(static_cast<size_t>(mine.num_tokens) * K * H);
  for (int t = 0; t < mine.num_tokens; ++t) {
    transported_row(p, &mine.x[static_cast<size_t>(t) * H], xr.data());
    for (int k = 0; k < K; ++k) {
      int64_t e = mine.topk_idx[static_cast<size_t>(t) * K + k];
      if (e != -1) expert_fn_row(static_cast<int>(e), xr.data(), H, &ys[(static_cast<size_t>(t) * K + k) * H]);
    }
  }
  return ll_combine_reduce(p, mine, [&](int t, int k) {
    return &ys[(static_cast<size_t>(t) * K + k) * H];
  });
}

}  // namespace moe_ep_oracle
