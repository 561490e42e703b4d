// inputs.h: deterministic per-(seed, rank) inputs of one layer call, so every
// rank (and the oracle) can regenerate any rank's inputs from its seed.
#ifndef MOE_EP_TESTS_ORACLE_INPUTS_H_
#define MOE_EP_TESTS_ORACLE_INPUTS_H_

#include <cstdint>
#include <vector>

#include "tests/oracle/problem.h"

namespace moe_ep_oracle {

struct RankInputs {
  int num_tokens = 0;                // T
  std::vector<uint16_t> x;           // [T, H] bf16 bits, values in [-2, 2]
  std::vector<int64_t> topk_idx;     // [T, K] global expert or -1
  std::vector<float> topk_weights;   // [T, K] in [0.05, 1], also on -1 slots
};

// Generators (experts within one token are always distinct; -1 = no expert):
//  kUniform       T = max_tokens_per_rank; K distinct experts, uniform.
//  kSkewed        as uniform, but each pick comes with probability 0.7 from
//                 the hot experts [0, min(E, max(8, E/32))).
//  kAllToOneRank  every token picks min(K, L) distinct experts of rank
//                 seed % world (L = local experts); slots beyond L are -1.
//  kEmptyRanks    rank r has T = 0 when (r + seed) is odd, else T uniform in
//                 [1, max_tokens_per_rank] (partial batches); uniform routing.
//                 (world 1 with an odd seed: the only rank is empty.)
//  kMasked        uniform, then each slot is -1 with probability 1/4, and
//                 one token (random, when T > 0) has every slot -1.
// The token count, x, topk_idx and topk_weights use separate streams (rng.h).
RankInputs make_inputs(const Problem& p, int rank, uint64_t seed);

// make_inputs for ranks 0..world-1 with the same seed; index = rank.
std::vector<RankInputs> make_all_inputs(const Problem& p, uint64_t seed);

// The token count alone (cheap).
int num_tokens_for_rank(const Problem& p, int rank, uint64_t seed);

}  // namespace moe_ep_oracle

#endif  // MOE_EP_TESTS_ORACLE_INPUTS_H_
