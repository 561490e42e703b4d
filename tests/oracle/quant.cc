// quant.cc: the scale rules written out one step at a time, in the order
// quant.h states them.
#include "tests/oracle/quant.h"

#include <cmath>
#include <cstdio>

#include "tests/oracle/bf16.h"
#include "tests/oracle/fp8.h"

namespace moe_ep_oracle {

float group_amax(const uint16_t* x, int n) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) {
    float v = bf16_to_float(x[i]);
    if (std::isfinite(v)) amax = std::fmax(amax, std::fabs(v));
  }
  return amax;
}

float round_scale_pow2(float s) {
  int e;
  float m = std::frexp(s, &e);  // s = m * 2^e, m in [0.5, 1)
  // m == 0.5 means s is already 2^(e-1); anything above rounds up to 2^e.
  return m == 0.5f ? std::ldexp(1.0f, e - 1) : std::ldexp(1.0f, e);
}

float scale_for_amax(float amax, bool pow2) {
  float a = std::fmax(amax, kAmaxFloor);
  float scale = a / kE4m3Max;
  return pow2 ? round_scale_pow2(scale) : scale;
}

uint8_t ue8m0_byte(float pow2_scale) {
  int e;
  float m = std::frexp(pow2_scale, &e);
  int biased = (e - 1) + 127;
  if (m != 0.5f || biased < 0 || biased > 254) {
    char why[128];
    std::snprintf(why, sizeof why,
                  "ue8m0_byte: pow2_scale = %g is not a power of two in [2^-127, 2^127]",
                  pow2_scale);
    throw OracleError(why);
  }
  return static_cast<uint8_t>(biased);
}

float ue8m0_to_float(uint8_t byte) { return std::ldexp(1.0f, static_cast<int>(byte) - 127); }

// n values of x quantised with one scale, chosen from their own amax.
static float quantize_span(const uint16_t* x, int n, bool pow2, uint8_t* q) {
  float scale = scale_for_amax(group_amax(x, n), pow2);
  for (int i = 0; i < n; ++i) {
    float v = bf16_to_float(x[i]);
    q[i] = std::isnan(v) ? kQuantizedNan : float_to_e4m3(v / scale);
  }
  return scale;
}

void quantize_row(const uint16_t* x, int hidden, ScaleFormat fmt, uint8_t* q, float* scales) {
  if (fmt == ScaleFormat::kPerToken) {
    scales[0] = quantize_span(x, hidden, false, q);
    return;
  }
  bool pow2 = fmt != ScaleFormat::kF32;
  for (int g = 0; g < hidden / kGroupSize; ++g)
    scales[g] = quantize_span(x + g * kGroupSize, kGroupSize, pow2, q + g * kGroupSize);
}

void pack_ue8m0(const float* pow2_scales, int groups, int32_t* words) {
  for (int w = 0; w < (groups + 3) / 4; ++w) {
    uint32_t word = 0;
    for (int b = 0; b < 4 && 4 * w + b < groups; ++b)
      word |= static_cast<uint32_t>(ue8m0_byte(pow2_scales[4 * w + b])) << (8 * b);
    words[w] = static_cast<int32_t>(word);
  }
}

void unpack_ue8m0(const int32_t* words, int groups, float* pow2_scales) {
  for (int g = 0; g < groups; ++g) {
    uint32_t word = static_cast<uint32_t>(words[g / 4]);
    pow2_scales[g] = ue8m0_to_float(static_cast<uint8_t>(word >> (8 * (g % 4))));
  }
}

void dequantize_row(const uint8_t* q, const float* scales, int hidden, float* out) {
  for (int i = 0; i < hidden; ++i) out[i] = e4m3_to_float(q[i]) * scales[i / kGroupSize];
}

}  // namespace moe_ep_oracle
