// quant.h: per-128-channel fp8 quantization of a bf16 row, as LL dispatch
// delivers it: scales (f32 or power-of-two), UE8M0 packing, dequantization.
#ifndef MOE_EP_TESTS_ORACLE_QUANT_H_
#define MOE_EP_TESTS_ORACLE_QUANT_H_

#include <cstdint>

#include "tests/oracle/problem.h"

namespace moe_ep_oracle {

// Floor on a group's amax so an all-zero group still gets a finite scale.
constexpr float kAmaxFloor = 1e-4f;

// max |x| over the finite ones of n bf16 values, as floats (0 when none
// is finite): +-inf and NaN do not choose the scale.
float group_amax(const uint16_t* x, int n);

// amax' = max(amax, 1e-4f); scale = amax' / 448 (one f32 division); with
// pow2, rounded up to 2^ceil(log2(scale)) exactly (frexp, no log).
float scale_for_amax(float amax, bool pow2);

// 2^ceil(log2(s)) for a positive normal float s.
float round_scale_pow2(float s);

// UE8M0 byte of a power of two 2^e: e + 127 (OracleError for any other
// value). And back.
uint8_t ue8m0_byte(float pow2_scale);
float ue8m0_to_float(uint8_t byte);

// The code a NaN input arrives as, whatever its sign (CUDA's satfinite
// conversion gives the positive NaN).
constexpr uint8_t kQuantizedNan = 0x7F;

// Quantize one row of `hidden` bf16 values (hidden % 128 == 0): fills
// q[hidden] with e4m3(x / scale) and scales[hidden/128] with each group's
// scale (a power of two for kUe8m0 and kUe8m0Packed), or with kPerToken
// scales[0] with the row's one scale (the same rule over all of it). Non-finite input:
// +-inf gives +-448 (x / scale is +-inf, which satfinite saturates), NaN
// gives kQuantizedNan; a group with no finite value other than 0 gets the
// floor's scale, 1e-4 / 448 (2^-22 with power-of-two scales).
void quantize_row(const uint16_t* x, int hidden, ScaleFormat fmt, uint8_t* q, float* scales);

// Group g's UE8M0 byte goes to byte g%4 (little-endian) of word g/4; the
// last word's missing bytes are 0. words has (groups + 3) / 4 entries.
void pack_ue8m0(const float* pow2_scales, int groups, int32_t* words);
void unpack_ue8m0(const int32_t* words, int groups, float* pow2_scales);

// out[i] = decode(q[i]) * scales[i / 128], in float.
void dequantize_row(const uint8_t* q, const float* scales, int hidden, float* out);

}  // namespace moe_ep_oracle

#endif  // MOE_EP_TESTS_ORACLE_QUANT_H_
