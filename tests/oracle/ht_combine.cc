// ht_combine.cc: expected HT combine: per source token, the sum of the
// partials of the ranks that received it, in ascending rank order; with
// p.node_ranks set, per node first (ranks ascending), then the nodes' sums
// (nodes ascending), each in f32 from +0, rounded to bf16 once.
#include <algorithm>

#include "tests/oracle/bf16.h"
#include "tests/oracle/expert.h"
#include "tests/oracle/ht.h"
#include "tests/oracle/rng.h"

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

// Sums, over r ascending with token_on_rank, the rows row_of(r) gives: per
// node of p.node_ranks ranks (one node when unset), then across nodes.
// With one node, +0 + the node's sum is that sum; with nodes of one rank,
// +0 + a row is the row's value (a -0 row only meets a nonzero or +0
// running sum), so both are the plain ascending sum.
template <typename RowOf>
std::vector<uint16_t> reduce(const Problem& p, const RankInputs& in, RowOf row_of) {
  const int H = p.hidden, n = p.node_ranks > 0 ? p.node_ranks : p.world;
  std::vector<uint16_t> out(static_cast<size_t>(in.num_tokens) * H);
  std::vector<float> acc(H), node(H);
  for (int t = 0; t < in.num_tokens; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int b = 0; b < p.world / n; ++b) {
      std::fill(node.begin(), node.end(), 0.0f);
      for (int r = b * n; r < (b + 1) * n; ++r) {
        if (!token_on_rank(p, in, t, r)) continue;
        const uint16_t* y = row_of(t, r);
        for (int i = 0; i < H; ++i) node[i] += bf16_to_float(y[i]);
      }
      for (int i = 0; i < H; ++i) acc[i] += node[i];
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

std::vector<uint16_t> ht_wide_partials(int64_t rows, int hidden, uint64_t seed) {
  SplitMix64 rng(seed);
  std::vector<uint16_t> y(static_cast<size_t>(rows) * hidden);
  for (uint16_t& v : y)
    v = static_cast<uint16_t>((rng.below(2) << 15) | ((127 - 12 + rng.below(26)) << 7) |
                              rng.below(128));
  return y;
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
