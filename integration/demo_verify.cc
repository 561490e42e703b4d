// demo_verify.cc: the demo's bridge to the reference oracle.
#include "integration/demo_verify.h"

#include <cstdio>
#include <string>
#include <vector>

#include "tests/oracle/oracle.h"

using namespace moe_ep_oracle;

extern "C" void demo_expert_row(int e, const float* x, int hidden, uint16_t* y) {
  expert_fn_row(e, x, hidden, y);
}

extern "C" void demo_received_row(const void* row, const float* scales, int hidden, int fp8,
                                  float* out) {
  if (fp8) {
    dequantize_row(static_cast<const uint8_t*>(row), scales, hidden, out);
  } else {
    const uint16_t* r = static_cast<const uint16_t*>(row);
    for (int i = 0; i < hidden; i++) out[i] = bf16_to_float(r[i]);
  }
}

extern "C" int demo_verify_combine(int world, int num_experts, int hidden, int top_k,
                                   int max_tokens, int fp8, int num_tokens, const uint16_t* x,
                                   const int64_t* topk, const float* w, const uint16_t* out,
                                   char* why, int why_len) {
  Problem p;
  p.world = world;
  p.num_experts = num_experts;
  p.hidden = hidden;
  p.top_k = top_k;
  p.max_tokens_per_rank = max_tokens;
  p.dispatch_dtype = fp8 ? DispatchDtype::kFp8 : DispatchDtype::kBf16;
  RankInputs mine;
  mine.num_tokens = num_tokens;
  mine.x.assign(x, x + static_cast<size_t>(num_tokens) * hidden);
  mine.topk_idx.assign(topk, topk + static_cast<size_t>(num_tokens) * top_k);
  mine.topk_weights.assign(w, w + static_cast<size_t>(num_tokens) * top_k);
  // The demo gives the weights to combine only; its documented sum order
  // makes the check bit-exact on every backend.
  std::string d;
  try {
    std::vector<uint16_t> want = ll_combine_expected(p, mine, LlWeightsAt::kCombine);
    d = compare_exact_bf16("combine out", out, want.data(), want.size(), hidden);
  } catch (const OracleError& e) {  // never let an exception into the C caller
    d = e.what();
  }
  if (!d.empty()) std::snprintf(why, why_len, "%s", d.c_str());
  return d.empty();
}
