// ll_dispatch.cc: expected LL receive of one rank, built by walking every
// source rank's tokens in (rank, token) order and appending to expert lists.
#include "tests/oracle/ll.h"

#include <vector>

#include "tests/oracle/bf16.h"
#include "tests/oracle/quant.h"

namespace moe_ep_oracle {

LlDispatchExpected ll_dispatch_expected(const Problem& p, const std::vector<RankInputs>& all,
                                        int rank) {
  check_problem(p);
  if (p.dispatch_dtype == DispatchDtype::kFp8 && p.scale_format == ScaleFormat::kPerToken)
    throw OracleError("ll_dispatch_expected: LL quantises one scale per 128 channels; "
                      "kPerToken is a format of HT rows quantised before the dispatch");
  const int K = p.top_k, H = p.hidden, L = p.local_experts();
  LlDispatchExpected d;
  d.rank = rank;
  d.num_local_experts = L;
  d.hidden = H;
  d.slots_per_expert = p.world * p.max_tokens_per_rank;

  // Walking sources in (rank, token) order gives each expert's list in the
  // documented order; experts are distinct per token, so each (t, e) once.
  std::vector<std::vector<LlSlot>> per_expert(L);
  for (int s = 0; s < p.world; ++s) {
    const RankInputs& in = all[s];
    for (int t = 0; t < in.num_tokens; ++t)
      for (int k = 0; k < K; ++k) {
        int64_t e = in.topk_idx[static_cast<size_t>(t) * K + k];
        if (e != -1 && p.rank_of_expert(e) == rank) per_expert[p.local_id(e)].push_back({s, t, k});
      }
  }
  d.recv_count.resize(L);
  d.first_row.assign(L + 1, 0);
  for (int e = 0; e < L; ++e) {
    d.recv_count[e] = static_cast<int32_t>(per_expert[e].size());
    d.first_row[e + 1] = d.first_row[e] + d.recv_count[e];
    d.slots.insert(d.slots.end(), per_expert[e].begin(), per_expert[e].end());
  }

  const int64_t rows = d.rows();
  const int G = p.scale_groups(), W = p.packed_scale_words();
  if (p.dispatch_dtype == DispatchDtype::kBf16) {
    d.x_bf16.resize(rows * H);
  } else {
    d.x_fp8.resize(rows * H);
    d.scales.resize(rows * G);
    if (p.scale_format == ScaleFormat::kUe8m0Packed) d.scales_packed.resize(rows * W);
  }
  for (int64_t r = 0; r < rows; ++r) {
    const LlSlot& sl = d.slots[r];
    const uint16_t* x = &all[sl.src_rank].x[static_cast<size_t>(sl.src_token) * H];
    if (p.dispatch_dtype == DispatchDtype::kBf16) {
      std::copy(x, x + H, &d.x_bf16[r * H]);
      continue;
    }
    quantize_row(x, H, p.scale_format, &d.x_fp8[r * H], &d.scales[r * G]);
    if (p.scale_format == ScaleFormat::kUe8m0Packed)
      pack_ue8m0(&d.scales[r * G], G, &d.scales_packed[r * W]);
  }
  return d;
}

void ll_received_row(const Problem& p, const LlDispatchExpected& d, int64_t row, float* out) {
  const int H = p.hidden;
  if (p.dispatch_dtype == DispatchDtype::kBf16) {
    for (int i = 0; i < H; ++i) out[i] = bf16_to_float(d.x_bf16[row * H + i]);
  } else {
    dequantize_row(&d.x_fp8[row * H], &d.scales[row * p.scale_groups()], H, out);
  }
}

}  // namespace moe_ep_oracle
