// expert.cc: the deterministic expert function and the HT per-rank partial.
#include "tests/oracle/expert.h"

#include <vector>

#include "tests/oracle/bf16.h"
#include "tests/oracle/quant.h"

namespace moe_ep_oracle {

float expert_gain(int global_expert) { return 1.0f + 0.01f * static_cast<float>(global_expert); }

void expert_fn_row(int global_expert, const float* x, int hidden, uint16_t* y) {
  const float g = expert_gain(global_expert);
  for (int i = 0; i < hidden; ++i) y[i] = float_to_bf16(x[i] * g);
}

void transported_row(const Problem& p, const uint16_t* x, float* out) {
  if (p.dispatch_dtype == DispatchDtype::kBf16) {
    for (int i = 0; i < p.hidden; ++i) out[i] = bf16_to_float(x[i]);
    return;
  }
  std::vector<uint8_t> q(p.hidden);
  std::vector<float> scales(p.scale_floats());
  quantize_row(x, p.hidden, p.scale_format, q.data(), scales.data());
  if (p.scale_format == ScaleFormat::kPerToken) scales.assign(p.scale_groups(), scales[0]);
  dequantize_row(q.data(), scales.data(), p.hidden, out);
}

void ht_partial_row(const Problem& p, int rank, const uint16_t* x, const int32_t* idx,
                    const float* w, uint16_t* y) {
  const int H = p.hidden;
  std::vector<float> xf(H), acc(H, 0.0f);
  std::vector<uint16_t> ye(H);
  transported_row(p, x, xf.data());  // fp8: as the engine quantised it
  for (int k = 0; k < p.top_k; ++k) {
    if (idx[k] == -1) continue;
    expert_fn_row(rank * p.local_experts() + idx[k], xf.data(), H, ye.data());
    for (int i = 0; i < H; ++i) acc[i] += w[k] * bf16_to_float(ye[i]);
  }
  for (int i = 0; i < H; ++i) y[i] = float_to_bf16(acc[i]);
}

}  // namespace moe_ep_oracle
