// ht_dispatch.cc: expected HT receive of one rank: one row per source token
// that has any expert there, in (source rank, token) order.
#include "tests/oracle/ht.h"

#include <algorithm>

#include "tests/oracle/expert.h"
#include "tests/oracle/quant.h"

namespace moe_ep_oracle {

HtDispatchExpected ht_dispatch_expected(const Problem& p, const std::vector<RankInputs>& all,
                                        int rank) {
  check_problem(p);
  const int K = p.top_k, H = p.hidden;
  HtDispatchExpected d;
  d.rank = rank;
  d.num_recv_tokens_per_expert.assign(p.local_experts(), 0);
  std::vector<int32_t> idx_row(K);
  std::vector<float> w_row(K);
  for (int s = 0; s < p.world; ++s) {
    const RankInputs& in = all[s];
    for (int t = 0; t < in.num_tokens; ++t) {
      bool here = false;
      for (int k = 0; k < K; ++k) {
        size_t tk = static_cast<size_t>(t) * K + k;
        int64_t e = in.topk_idx[tk];
        bool mine = e != -1 && p.rank_of_expert(e) == rank;
        idx_row[k] = mine ? p.local_id(e) : -1;
        w_row[k] = mine ? in.topk_weights[tk] : 0.0f;
        here = here || mine;
      }
      if (!here) continue;
      d.src_rank.push_back(s);
      d.src_token.push_back(t);
      const uint16_t* x = &in.x[static_cast<size_t>(t) * H];
      d.recv_x.insert(d.recv_x.end(), x, x + H);
      d.recv_topk_idx.insert(d.recv_topk_idx.end(), idx_row.begin(), idx_row.end());
      d.recv_topk_weights.insert(d.recv_topk_weights.end(), w_row.begin(), w_row.end());
      for (int32_t l : idx_row)
        if (l != -1) d.num_recv_tokens_per_expert[l] += 1;
    }
  }
  d.num_recv = static_cast<int64_t>(d.src_rank.size());
  if (p.dispatch_dtype == DispatchDtype::kFp8) {
    // Each source quantised its whole x once; rows arrive as it sent them.
    std::vector<HtFp8Input> q;
    for (const RankInputs& in : all) q.push_back(ht_fp8_input(p, in));
    const int G = p.scale_floats(), W = p.packed_scale_words();
    const bool packed = p.scale_format == ScaleFormat::kUe8m0Packed;
    for (int64_t n = 0; n < d.num_recv; ++n) {
      const HtFp8Input& src = q[d.src_rank[n]];
      const size_t t = static_cast<size_t>(d.src_token[n]);
      d.recv_x_fp8.insert(d.recv_x_fp8.end(), &src.x[t * H], &src.x[t * H] + H);
      if (packed) {
        d.recv_scales_packed.insert(d.recv_scales_packed.end(), &src.packed[t * W],
                                    &src.packed[t * W] + W);
      } else {
        d.recv_scales.insert(d.recv_scales.end(), &src.scales[t * G], &src.scales[t * G] + G);
      }
    }
  }
  return d;
}

HtFp8Input ht_fp8_input(const Problem& p, const RankInputs& in) {
  check_problem(p);
  const int H = p.hidden, G = p.scale_floats(), W = p.packed_scale_words();
  const size_t T = static_cast<size_t>(in.num_tokens);
  HtFp8Input q;
  q.x.resize(T * H);
  q.scales.resize(T * G);
  if (p.scale_format == ScaleFormat::kUe8m0Packed) q.packed.resize(T * W);
  for (size_t t = 0; t < T; ++t) {
    quantize_row(&in.x[t * H], H, p.scale_format, &q.x[t * H], &q.scales[t * G]);
    if (!q.packed.empty()) pack_ue8m0(&q.scales[t * G], G, &q.packed[t * W]);
  }
  return q;
}

std::vector<uint16_t> ht_partials(const Problem& p, const HtDispatchExpected& d) {
  const int K = p.top_k, H = p.hidden;
  std::vector<uint16_t> y(static_cast<size_t>(d.num_recv) * H);
  for (int64_t n = 0; n < d.num_recv; ++n)
    ht_partial_row(p, d.rank, &d.recv_x[n * H], &d.recv_topk_idx[n * K],
                   &d.recv_topk_weights[n * K], &y[n * H]);
  return y;
}

}  // namespace moe_ep_oracle
