// inputs.cc: the generators of inputs.h, one small function per rule.
#include "tests/oracle/inputs.h"

#include <algorithm>

#include "tests/oracle/bf16.h"
#include "tests/oracle/rng.h"

namespace moe_ep_oracle {
namespace {

bool contains(const int64_t* row, int n, int64_t e) {
  return std::find(row, row + n, e) != row + n;
}

// Fills row[0..n) with distinct experts drawn by `draw` (rejection).
template <typename Draw>
void pick_distinct(int64_t* row, int n, Draw draw) {
  for (int k = 0; k < n; ++k) {
    int64_t e;
    do e = draw(); while (contains(row, k, e));
    row[k] = e;
  }
}

void route_token(const Problem& p, uint64_t seed, SplitMix64& rng, int64_t* row) {
  const int K = p.top_k, E = p.num_experts;
  auto uniform = [&] { return static_cast<int64_t>(rng.below(E)); };
  switch (p.generator) {
    case Generator::kUniform:
    case Generator::kEmptyRanks:
    case Generator::kMasked:
      pick_distinct(row, K, uniform);
      break;
    case Generator::kSkewed: {
      const int hot = std::min(E, std::max(8, E / 32));
      // Re-tossing the coin on each rejection keeps this finite when the hot
      // set is smaller than K.
      pick_distinct(row, K, [&] {
        return rng.unit() < 0.7 ? static_cast<int64_t>(rng.below(hot)) : uniform();
      });
      break;
    }
    case Generator::kAllToOneRank: {
      const int L = p.local_experts();
      const int64_t first = static_cast<int64_t>(seed % p.world) * L;
      const int n = std::min(K, L);
      pick_distinct(row, n, [&] { return first + static_cast<int64_t>(rng.below(L)); });
      for (int k = n; k < K; ++k) row[k] = -1;
      break;
    }
  }
}

}  // namespace

int num_tokens_for_rank(const Problem& p, int rank, uint64_t seed) {
  check_problem(p);
  if (p.generator != Generator::kEmptyRanks || p.max_tokens_per_rank == 0)
    return p.max_tokens_per_rank;
  if ((static_cast<uint64_t>(rank) + seed) % 2 == 1) return 0;
  SplitMix64 rng = make_stream(seed, rank, Stream::kCount);
  return 1 + static_cast<int>(rng.below(p.max_tokens_per_rank));
}

RankInputs make_inputs(const Problem& p, int rank, uint64_t seed) {
  check_problem(p);
  RankInputs in;
  const int T = num_tokens_for_rank(p, rank, seed), H = p.hidden, K = p.top_k;
  in.num_tokens = T;

  SplitMix64 xr = make_stream(seed, rank, Stream::kX);
  in.x.resize(static_cast<size_t>(T) * H);
  for (uint16_t& v : in.x) v = float_to_bf16(static_cast<float>(xr.unit() * 4.0 - 2.0));

  SplitMix64 wr = make_stream(seed, rank, Stream::kWeights);
  in.topk_weights.resize(static_cast<size_t>(T) * K);
  for (float& w : in.topk_weights) w = static_cast<float>(0.05 + 0.95 * wr.unit());

  SplitMix64 ir = make_stream(seed, rank, Stream::kIdx);
  in.topk_idx.assign(static_cast<size_t>(T) * K, -1);
  for (int t = 0; t < T; ++t) route_token(p, seed, ir, &in.topk_idx[static_cast<size_t>(t) * K]);
  if (p.generator == Generator::kMasked && T > 0) {
    for (int64_t& e : in.topk_idx)
      if (ir.unit() < 0.25) e = -1;
    int64_t all_masked = static_cast<int64_t>(ir.below(T));
    for (int k = 0; k < K; ++k) in.topk_idx[all_masked * K + k] = -1;
  }
  return in;
}

std::vector<RankInputs> make_all_inputs(const Problem& p, uint64_t seed) {
  std::vector<RankInputs> all;
  for (int r = 0; r < p.world; ++r) all.push_back(make_inputs(p, r, seed));
  return all;
}

}  // namespace moe_ep_oracle
