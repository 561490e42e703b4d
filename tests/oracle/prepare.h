// prepare.h: expected outputs of `prepare` for one rank: routing counts from
// that rank's own topk_idx.
#ifndef MOE_EP_TESTS_ORACLE_PREPARE_H_
#define MOE_EP_TESTS_ORACLE_PREPARE_H_

#include <cstdint>
#include <vector>

#include "tests/oracle/inputs.h"
#include "tests/oracle/problem.h"

namespace moe_ep_oracle {

struct PrepareExpected {
  std::vector<int32_t> num_tokens_per_rank;    // [R]: tokens with >= 1 expert on r
  std::vector<int32_t> num_tokens_per_expert;  // [E]: tokens choosing e
  std::vector<uint8_t> is_token_in_rank;       // [T, R]: 1 if token has an expert on r
};

// -1 slots are skipped; experts within a token are distinct (inputs.h).
PrepareExpected prepare_expected(const Problem& p, const RankInputs& mine);

}  // namespace moe_ep_oracle

#endif  // MOE_EP_TESTS_ORACLE_PREPARE_H_
