// ht.h: expected HT (high-throughput) dispatch and combine. HT moves each
// token's row once per destination rank (not per expert), never quantising:
// bf16 rows, or with p.dispatch_dtype kFp8 the rows the source engine
// quantised before dispatch (ht_fp8_input), carried verbatim with their
// scales.
#ifndef MOE_EP_TESTS_ORACLE_HT_H_
#define MOE_EP_TESTS_ORACLE_HT_H_

#include <cstdint>
#include <vector>

#include "tests/oracle/inputs.h"
#include "tests/oracle/problem.h"

namespace moe_ep_oracle {

struct HtDispatchExpected {
  int rank = 0;
  int64_t num_recv = 0;                     // N_recv
  std::vector<int32_t> src_rank;            // [N_recv]
  std::vector<int32_t> src_token;           // [N_recv]
  std::vector<uint16_t> recv_x;             // [N_recv, H] bf16, the source row exactly
  std::vector<int32_t> recv_topk_idx;       // [N_recv, K] local id on `rank`, or -1
  std::vector<float> recv_topk_weights;     // [N_recv, K] weight, or 0 where idx is -1
  std::vector<int32_t> num_recv_tokens_per_expert;  // [E_local]
  // kFp8 only: the source's pre-quantised row and scales exactly.
  std::vector<uint8_t> recv_x_fp8;          // [N_recv, H] e4m3
  std::vector<float> recv_scales;           // [N_recv, H/128] (kF32, kUe8m0), [N_recv, 1] (kPerToken)
  std::vector<int32_t> recv_scales_packed;  // [N_recv, ceil(H/512)] (kUe8m0Packed)
};

// What an engine that quantises before an HT dispatch passes: x quantised
// with p.scale_format (quantize_row), its scales as f32 [T, H/128] (one per
// 128 channels) or [T, 1] (kPerToken), or packed [T, ceil(H/512)] for
// kUe8m0Packed (then `scales` holds the powers of two the words encode).
struct HtFp8Input {
  std::vector<uint8_t> x;        // [T, H] e4m3
  std::vector<float> scales;     // [T, scale_floats()]
  std::vector<int32_t> packed;   // [T, ceil(H/512)], kUe8m0Packed only
};
HtFp8Input ht_fp8_input(const Problem& p, const RankInputs& in);

// One row per (source rank s, token t of s) with >= 1 expert on `rank`,
// ordered by s ascending then t ascending. all[s] are rank s's inputs.
HtDispatchExpected ht_dispatch_expected(const Problem& p, const std::vector<RankInputs>& all,
                                        int rank);

// Destination rank r's partials y_r for every row it received:
// ht_partial_row (expert.h) applied to each row of d, so of the row as the
// rank sees it (fp8 rows dequantised). [N_recv, H] bf16.
std::vector<uint16_t> ht_partials(const Problem& p, const HtDispatchExpected& d);

// out [T_s, H] bf16 of source rank s from arbitrary partials:
// out[t] = bf16(sum over r ascending that received (s, t) of
// bf16_to_float(y_by_rank[r][row of (s, t) on r])), float accumulation from
// 0.0f; tokens no rank received give +0. With p.node_ranks set, the sum is
// per node first, then across nodes (ht_combine.cc). y_by_rank[r] is
// [N_recv_r, H] in r's dispatch order (may be null for a rank that
// received nothing).
std::vector<uint16_t> ht_combine_reduce(const Problem& p, const std::vector<RankInputs>& all,
                                        int s, const std::vector<const uint16_t*>& y_by_rank);

// rows x hidden bf16 partials of random sign and magnitude 2^-12..2^13:
// sums of them lose different bits in another order, so a combine summed
// in the wrong order shows (ht_partials' rows are too alike for that).
std::vector<uint16_t> ht_wide_partials(int64_t rows, int hidden, uint64_t seed);

// ht_combine_reduce with every rank's partials from ht_partials, computed
// only for s's tokens (O(T_s * K * H)).
std::vector<uint16_t> ht_combine_expected(const Problem& p, const std::vector<RankInputs>& all,
                                          int s);

}  // namespace moe_ep_oracle

#endif  // MOE_EP_TESTS_ORACLE_HT_H_
