// ll_combine.cc: expected LL combine, in the documented summation order
// (ll.h), the same wherever the weights were applied. Written from the rule, not
// from the kernels: fma means one rounding, as the rule says.
#include <algorithm>
#include <cmath>
#include <vector>

#include "tests/oracle/bf16.h"
#include "tests/oracle/expert.h"
#include "tests/oracle/ll.h"

namespace moe_ep_oracle {
namespace {

// acc[i] = fma(w, y[i], acc[i]) for every channel.
void accumulate(float w, const uint16_t* y, int hidden, float* acc) {
  for (int i = 0; i < hidden; ++i) acc[i] = std::fma(w, bf16_to_float(y[i]), acc[i]);
}

// One bf16 partial per rank the token reaches, summed in the order those
// ranks first appear in its top-k.
void reduce_partials(const Problem& p, const RankInputs& mine, const LlSlotY& y, int t,
                     float* acc) {
  const int K = p.top_k, H = p.hidden;
  const int64_t* idx = &mine.topk_idx[static_cast<size_t>(t) * K];
  const float* w = &mine.topk_weights[static_cast<size_t>(t) * K];
  std::vector<float> part(H);
  for (int k = 0; k < K; ++k) {
    if (idx[k] == -1) continue;
    const int r = p.rank_of_expert(idx[k]);
    bool seen = false;
    for (int j = 0; j < k && !seen; ++j) seen = idx[j] != -1 && p.rank_of_expert(idx[j]) == r;
    if (seen) continue;  // r's partial was added at its first slot
    std::fill(part.begin(), part.end(), 0.0f);
    for (int j = k; j < K; ++j)
      if (idx[j] != -1 && p.rank_of_expert(idx[j]) == r) accumulate(w[j], y(t, j), H, part.data());
    for (int i = 0; i < H; ++i) acc[i] += bf16_to_float(float_to_bf16(part[i]));
  }
}

}  // namespace

std::vector<uint16_t> ll_combine_reduce(const Problem& p, const RankInputs& mine,
                                        const LlSlotY& y) {
  check_problem(p);
  const int T = mine.num_tokens, H = p.hidden;
  std::vector<uint16_t> out(static_cast<size_t>(T) * H);
  std::vector<float> acc(H);
  for (int t = 0; t < T; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    reduce_partials(p, mine, y, t, acc.data());
    for (int i = 0; i < H; ++i) out[static_cast<size_t>(t) * H + i] = float_to_bf16(acc[i]);
  }
  return out;
}

std::vector<uint16_t> ll_combine_expected(const Problem& p, const RankInputs& mine) {
  check_problem(p);
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
