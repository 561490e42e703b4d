// quant_nonfinite_test.cc: the documented rule for +-inf and NaN in fp8
// dispatch input (moe_ep.h), for every scale format, on hand-computed codes
// and scales: scales from the finite values only, +-inf -> +-448 (0x7E /
// 0xFE), NaN of either sign -> 0x7F, a group with nothing finite but 0 ->
// the floor's scale.
#include <cmath>
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "tests/oracle/bf16.h"
#include "tests/oracle/quant.h"

namespace moe_ep_oracle {
namespace {

constexpr uint16_t kPosInf = 0x7F80, kNegInf = 0xFF80, kPosNan = 0x7FC0, kNegNan = 0xFFC1;
constexpr int kH = 512;  // four groups

// Group 0: finite amax 448 with +inf, -inf, NaN, -NaN beside it.
// Group 1: nothing finite (inf and NaN of both signs).
// Group 2: finite amax 2 (2, -1) and one +inf.
// Group 3: zeros and one -inf.
std::vector<uint16_t> mixed_row() {
  std::vector<uint16_t> x(kH, float_to_bf16(0.0f));
  x[0] = float_to_bf16(448.0f);
  x[1] = kPosInf;
  x[2] = kNegInf;
  x[3] = kPosNan;
  x[4] = kNegNan;
  x[5] = float_to_bf16(1.0f);
  const uint16_t cycle[] = {kPosInf, kNegInf, kPosNan, kNegNan};
  for (int i = 128; i < 256; ++i) x[i] = cycle[i % 4];
  x[256] = float_to_bf16(2.0f);
  x[257] = float_to_bf16(-1.0f);
  x[258] = kPosInf;
  x[400] = kNegInf;
  return x;
}

// Expected codes where they differ from 0x00; f32 and power-of-two scales
// agree everywhere except group 2 (scale 2/448 vs 2^-7).
std::vector<uint8_t> expected_codes(bool pow2) {
  std::vector<uint8_t> q(kH, 0x00);
  q[0] = 0x7E;  // 448 / 1
  q[1] = 0x7E;  // +inf saturates
  q[2] = 0xFE;  // -inf saturates
  q[3] = 0x7F;  // NaN
  q[4] = 0x7F;  // -NaN: the sign is not kept
  q[5] = 0x38;  // 1.0
  const uint8_t cycle[] = {0x7E, 0xFE, 0x7F, 0x7F};
  for (int i = 128; i < 256; ++i) q[i] = cycle[i % 4];
  q[256] = pow2 ? 0x78 : 0x7E;  // 2 / 2^-7 = 256; 2 / (2/448) = 448
  q[257] = pow2 ? 0xF0 : 0xF6;  // -128; -224
  q[258] = 0x7E;
  q[400] = 0xFE;
  return q;
}

void expect_codes(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want,
                  const char* fmt) {
  for (int i = 0; i < kH; ++i)
    ASSERT_EQ(got[i], want[i]) << fmt << ": first bad index " << i << " (x bits 0x" << std::hex
                               << mixed_row()[i] << ") expected 0x" << int(want[i]) << " got 0x"
                               << int(got[i]);
}

TEST(QuantizeNonFinite, AmaxSkipsInfAndNan) {
  const std::vector<uint16_t> x = mixed_row();
  EXPECT_EQ(group_amax(&x[0], 128), 448.0f);
  EXPECT_EQ(group_amax(&x[128], 128), 0.0f);
  EXPECT_EQ(group_amax(&x[256], 128), 2.0f);
  EXPECT_EQ(group_amax(&x[384], 128), 0.0f);
}

// quantize_row of mixed_row() in `fmt`: scales and codes as expected.
void expect_format(ScaleFormat fmt, const std::vector<float>& want_scales, const char* name) {
  const std::vector<uint16_t> x = mixed_row();
  std::vector<uint8_t> q(kH);
  std::vector<float> s(kH / 128);
  quantize_row(x.data(), kH, fmt, q.data(), s.data());
  EXPECT_EQ(s, want_scales) << name;
  expect_codes(q, expected_codes(fmt != ScaleFormat::kF32), name);
}

TEST(QuantizeNonFinite, F32Scales) {
  expect_format(ScaleFormat::kF32, {1.0f, 1e-4f / 448.0f, 2.0f / 448.0f, 1e-4f / 448.0f}, "f32");
}

TEST(QuantizeNonFinite, Ue8m0Scales) {
  expect_format(ScaleFormat::kUe8m0,
                {1.0f, std::ldexp(1.0f, -22), std::ldexp(1.0f, -7), std::ldexp(1.0f, -22)},
                "ue8m0");
}

TEST(QuantizeNonFinite, Ue8m0PackedScales) {
  const std::vector<uint16_t> x = mixed_row();
  std::vector<uint8_t> q(kH);
  std::vector<float> s(kH / 128);
  quantize_row(x.data(), kH, ScaleFormat::kUe8m0Packed, q.data(), s.data());
  std::vector<int32_t> w(1);
  pack_ue8m0(s.data(), kH / 128, w.data());
  // bytes 127 (2^0), 105 (2^-22), 120 (2^-7), 105, little-endian
  EXPECT_EQ(static_cast<uint32_t>(w[0]), 0x6978697Fu);
  expect_codes(q, expected_codes(true), "ue8m0_packed");
}

// Every inf/NaN bf16 code of one sign class, alone in a zero group: the
// scale is the floor's and the code is the rule's, for all 2 x 127 NaN
// payloads and both infinities.
TEST(QuantizeNonFinite, EveryNonFiniteBf16Code) {
  for (uint32_t bits = 0x7F80; bits <= 0x7FFF; ++bits) {
    for (uint16_t sign : {uint16_t{0}, uint16_t{0x8000}}) {
      const uint16_t v = static_cast<uint16_t>(bits | sign);
      std::vector<uint16_t> x(128, float_to_bf16(0.0f));
      x[7] = v;
      std::vector<uint8_t> q(128);
      float s = 0;
      quantize_row(x.data(), 128, ScaleFormat::kF32, q.data(), &s);
      const uint8_t want = bits == 0x7F80 ? (sign ? 0xFE : 0x7E) : 0x7F;
      ASSERT_EQ(s, 1e-4f / 448.0f) << "bf16 0x" << std::hex << v;
      ASSERT_EQ(q[7], want) << "bf16 0x" << std::hex << v << " expected 0x" << int(want)
                            << " got 0x" << int(q[7]);
    }
  }
}

}  // namespace
}  // namespace moe_ep_oracle
