// ll.h: expected LL (low-latency) dispatch and combine (docs/DESIGN.md).
// Valid rows only are kept, compactly; rows >= recv_count are undefined in the
// plugin's output and tests compare only rows < recv_count.
#ifndef MOE_EP_TESTS_ORACLE_LL_H_
#define MOE_EP_TESTS_ORACLE_LL_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "tests/oracle/inputs.h"
#include "tests/oracle/problem.h"

namespace moe_ep_oracle {

struct LlSlot {
  int src_rank;
  int src_token;
  int k;  // slot of the source token's topk_idx that chose this expert
};

struct LlDispatchExpected {
  int rank = 0;
  int num_local_experts = 0;
  int hidden = 0;
  int slots_per_expert = 0;         // world * max_tokens_per_rank
  std::vector<int32_t> recv_count;  // [E_local]
  // Compact storage: expert e's slot i is compact row first_row[e] + i.
  std::vector<int64_t> first_row;   // [E_local + 1]
  std::vector<LlSlot> slots;        // [rows]
  std::vector<uint16_t> x_bf16;     // [rows, H]         bf16 dispatch
  std::vector<uint8_t> x_fp8;       // [rows, H]         fp8 dispatch
  std::vector<float> scales;        // [rows, H/128]     fp8 (powers of 2 for ue8m0*)
  std::vector<int32_t> scales_packed;  // [rows, ceil(H/512)]  kUe8m0Packed

  int64_t rows() const { return first_row.empty() ? 0 : first_row.back(); }
  int64_t row(int e, int i) const { return first_row[e] + i; }
  // Row index of (e, i) in the plugin's [E_local, R*max_tokens, ...] tensors.
  int64_t full_row(int e, int i) const { return static_cast<int64_t>(e) * slots_per_expert + i; }
};

// Rank `rank`'s receive: for each local expert, one slot per (source token,
// this expert), source ranks ascending, tokens ascending within a rank.
// `all[s]` are rank s's inputs.
LlDispatchExpected ll_dispatch_expected(const Problem& p, const std::vector<RankInputs>& all,
                                        int rank);

// DeepEP's view of d.rank's receive (its LL handle's src_info and
// layout_range), from the slot order above:
//   src_info [E_local, slots_per_expert]: the source token of each slot, -1
//     from recv_count on;
//   layout_range [E_local, world]: (begin << 32) | count of each source
//     rank's slots, begin = the counts of the lower source ranks summed.
struct LlHandleLayout {
  std::vector<int32_t> src_info;
  std::vector<int64_t> layout_range;
};
LlHandleLayout ll_handle_layout(const Problem& p, const LlDispatchExpected& d);

// The float values of compact row `row` as received (bf16 exact, or fp8
// dequantized with its scales): the input of the expert function.
void ll_received_row(const Problem& p, const LlDispatchExpected& d, int64_t row, float* out);

// y of one slot (t, k) of the combining rank: H bf16 values.
using LlSlotY = std::function<const uint16_t*(int token, int k)>;

// out [T, H] bf16, channel by channel, in the one order every LL combine
// sums in, wherever the weights were given (README, "Routing weights may be
// given to the LL dispatch"); "fma" is one rounding (std::fma), every sum
// starts at +0.0f, slots with topk_idx == -1 are skipped, and a token with
// no expert gives +0. The token's ranks in the order they first appear in
// its top-k (k ascending); for each rank r a partial P_r = bf16(acc_r),
// acc_r = fma(w[t,k], y(t,k), acc_r) over r's slots k ascending;
// out[t] = bf16(acc), acc = acc + P_r in that rank order.
std::vector<uint16_t> ll_combine_reduce(const Problem& p, const RankInputs& mine,
                                        const LlSlotY& y);

// ll_combine_reduce with y(t,k) = expert_fn_row(topk_idx[t,k],
// transported_row(x[t])): what combine returns when every rank runs
// expert_fn_row on the rows it received. Needs only the combining rank's inputs.
std::vector<uint16_t> ll_combine_expected(const Problem& p, const RankInputs& mine);

}  // namespace moe_ep_oracle

#endif  // MOE_EP_TESTS_ORACLE_LL_H_
