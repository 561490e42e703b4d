// problem.h: the oracle's plain description of one layer call (its own types,
// not the plugin's config), and where each expert lives.
#ifndef MOE_EP_TESTS_ORACLE_PROBLEM_H_
#define MOE_EP_TESTS_ORACLE_PROBLEM_H_

#include <cstdint>
#include <stdexcept>
#include <string>

namespace moe_ep_oracle {

constexpr int kGroupSize = 128;   // channels per fp8 scale
// bf16 rows move in 16-byte vectors: any hidden that is a multiple of 8 is
// a valid bf16 layer (the plugin's rule, restated); fp8 needs kGroupSize.
constexpr int kBf16HiddenAlign = 8;
constexpr int kMaxTopK = 32;      // same number as the plugin's limit, restated

// How topk_idx (and the token count) are drawn; see inputs.h for each rule.
enum class Generator { kUniform, kSkewed, kAllToOneRank, kEmptyRanks, kMasked };

enum class DispatchDtype { kBf16, kFp8 };

// kF32: scale = amax/448 per 128-channel group; kUe8m0: that rounded up to
// a power of two, stored as f32; kUe8m0Packed: the same powers of two as
// biased exponent bytes, four groups per int32; kPerToken: one f32 scale
// for the whole row, amax/448 over all its channels (HT only: rows an
// engine quantised before the dispatch; LL quantises per group).
enum class ScaleFormat { kF32, kUe8m0, kUe8m0Packed, kPerToken };

struct Problem {
  int world = 1;
  int num_experts = 1;
  int hidden = kGroupSize;   // this layer's hidden
  int top_k = 1;             // this layer's top_k
  int max_tokens_per_rank = 1;
  Generator generator = Generator::kUniform;
  // LL: the rows dispatch quantises; HT: kFp8 = x quantised by the engine
  // before dispatch (ht_fp8_input), rows carried verbatim.
  DispatchDtype dispatch_dtype = DispatchDtype::kBf16;
  ScaleFormat scale_format = ScaleFormat::kF32;
  // HT combine: the config's ranks_per_node (0 = unset). Set, each node's
  // rows (nodes of this many consecutive ranks) are summed first, then the
  // nodes' sums (ht_combine_expected).
  int node_ranks = 0;

  // Experts live on ranks in contiguous blocks of local_experts().
  int local_experts() const { return num_experts / world; }
  int rank_of_expert(int64_t e) const { return static_cast<int>(e / local_experts()); }
  int local_id(int64_t e) const { return static_cast<int>(e % local_experts()); }
  int scale_groups() const { return hidden / kGroupSize; }
  int packed_scale_words() const { return (scale_groups() + 3) / 4; }
  // f32 scales per quantised row: one per group, or one per token.
  int scale_floats() const { return scale_format == ScaleFormat::kPerToken ? 1 : scale_groups(); }
};

// An input the oracle cannot serve: a bug in the test, not in the plugin.
// Thrown (never an abort), so GoogleTest reports the sentence as the test's
// failure and a conformance worker as its rank's FAIL line, and the other
// checks of the process still run.
class OracleError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// "" when the oracle can serve `p`, else a sentence naming the broken rule.
// It serves every shape the plugin accepts: hidden any positive multiple of
// 8 with bf16 dispatch, of 128 with fp8 dispatch.
std::string problem_error(const Problem& p);

// Throws OracleError("bad Problem: " + problem_error(p)) when p is bad.
void check_problem(const Problem& p);

const char* generator_name(Generator g);

}  // namespace moe_ep_oracle

#endif  // MOE_EP_TESTS_ORACLE_PROBLEM_H_
