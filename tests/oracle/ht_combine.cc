// ht_combine.cc: expected HT combine: per source token, the sum of the
// partials of the ranks that received it, in ascending rank order.
#include <algorithm>

#include "tests/oracle/bf16.h"
#include "tests/oracle/expert.h"
#include "tests/oracle/ht.h"

namespace moe_ep_oracle {
namespace {

bool token_on_rank(const Problem& p, const RankInputs& in, int t, int r) {
  for (int k = 0; k < p.top_k; ++k) {
    int64_t e = in.topk_idx[static_cast<size_t>(t) * p.top_k + k];
    if (e != -1 && p.rank_of_expert(e) == r) return true;
  }
  return false;
}

// The partial rank r returns for token t of `in` (ht_partials' row).
void partial_of(const Problem& p, const RankInputs& in, int t, int r, uint16_t* y) {
  const int K = p.top_k;
  std::vector<int32_t> idx(K);
  std::vector<float> w(K);
  for (int k = 0; k < K; ++k) {
    size_t tk = static_cast<size_t>(t) * K + k;
    int64_t e = in.topk_idx[tk];
    bool mine = e != -1 && p.rank_of_expert(e) == r;
    idx[k] = mine ? p.local_id(e) : -1;
    w[k] = mine ? in.topk_weights[tk] : 0.0f;
  }
  ht_partial_row(p, r, &in.x[static_cast<size_t>(t) * p.hidden], idx.data(), w.data(), y);
}

// Sums, over r ascending with token_on_rank, the rows row_of(r) gives.
template <typename RowOf>
std::vector<uint16_t> reduce(const Problem& p, const RankInputs& in, RowOf row_of) {
  const int H = p.hidden;
  std::vector<uint16_t> out(static_cast<size_t>(in.num_tokens) * H);
  std::vector<float> acc(H);
  for (int t = 0; t < in.num_tokens; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int r = 0; r < p.world; ++r) {
      if (!token_on_rank(p, in, t, r)) continue;
      const uint16_t* y = row_of(t, r);
      for (int i = 0; i < H; ++i) acc[i] += bf16_to_float(y[i]);
    }
    for (int i = 0; i < H; ++i) out[static_cast<size_t>(t) * H + i] = float_to_bf16(acc[i]);
  }
  return out;
}

}  // namespace

std::vector<uint16_t> ht_combine_reduce(const Problem& p, const std::vector<RankInputs>& all,
                                        int s, const std::vector<const uint16_t*>& y_by_rank) {
  check_problem(p);
  // next_row[r]: r's dispatch row of s's next token that goes to r; starts
  // after every row r received from ranks below s.
  std::vector<int64_t> next_row(p.world, 0);
  for (int s2 = 0; s2 < s; ++s2)
    for (int t = 0; t < all[s2].num_tokens; ++t)
      for (int r = 0; r < p.world; ++r) next_row[r] += token_on_rank(p, all[s2], t, r);
  // reduce() visits t ascending and, per t, each receiving r once, so a
  // running counter per r is exactly the row index.
  return reduce(p, all[s], [&](int, int r) {
    return y_by_rank[r] + static_cast<size_t>(next_row[r]++) * p.hidden;
  });
}

std::vector<uint16_t> ht_combine_expected(const Problem& p, const std::vector<RankInputs>& all,
                                          int s) {
  check_problem(p);
  std::vector<uint16_t> y(p.hidden);
  return reduce(p, all[s], [&](int t, int r) {
    partial_of(p, all[s], t, r, y.data());
    return static_cast<const uint16_t*>(y.data());
  });
}

}  // namespace moe_ep_oracle
