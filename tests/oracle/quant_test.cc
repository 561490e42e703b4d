// quant_test.cc: per-128-channel scales, UE8M0 rounding and packing, and the
// quantize/dequantize round trip, on hand-computed values.
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "tests/oracle/bf16.h"
#include "tests/oracle/compare.h"
#include "tests/oracle/fp8.h"
#include "tests/oracle/quant.h"

namespace moe_ep_oracle {
namespace {

TEST(Scale, F32AndPowerOfTwo) {
  EXPECT_EQ(scale_for_amax(448.0f, false), 1.0f);
  EXPECT_EQ(scale_for_amax(448.0f, true), 1.0f);
  EXPECT_EQ(scale_for_amax(449.0f, false), 449.0f / 448.0f);
  EXPECT_EQ(scale_for_amax(449.0f, true), 2.0f);
  EXPECT_EQ(scale_for_amax(224.0f, true), 0.5f);
  EXPECT_EQ(scale_for_amax(225.0f, true), 1.0f);
  EXPECT_EQ(scale_for_amax(2.0f, true), std::ldexp(1.0f, -7));  // 2/448 = 2^-7.8 -> 2^-7
}

TEST(Scale, ZeroGroupGetsTheFloor) {
  EXPECT_EQ(scale_for_amax(0.0f, false), 1e-4f / 448.0f);
  EXPECT_EQ(scale_for_amax(0.0f, true), std::ldexp(1.0f, -22));  // 2.23e-7 -> 2^-22
  EXPECT_EQ(scale_for_amax(5e-5f, false), 1e-4f / 448.0f);
}

TEST(Scale, Ue8m0Bytes) {
  EXPECT_EQ(ue8m0_byte(1.0f), 127);
  EXPECT_EQ(ue8m0_byte(2.0f), 128);
  EXPECT_EQ(ue8m0_byte(std::ldexp(1.0f, -22)), 105);
  EXPECT_EQ(ue8m0_to_float(105), std::ldexp(1.0f, -22));
  EXPECT_EQ(round_scale_pow2(std::ldexp(1.0f, -3)), std::ldexp(1.0f, -3));
  EXPECT_EQ(round_scale_pow2(std::nextafter(0.125f, 1.0f)), 0.25f);
}

TEST(Scale, PacksFourGroupsPerWordLittleEndian) {
  // 6 groups: word 0 = bytes of groups 0..3, word 1 = groups 4, 5 then 0, 0.
  std::vector<float> s = {1.0f, 2.0f, 0.5f, 4.0f, 0.25f, 8.0f};
  std::vector<int32_t> w(2);
  pack_ue8m0(s.data(), 6, w.data());
  EXPECT_EQ(static_cast<uint32_t>(w[0]), 0x817E807Fu);  // 4.0=129, 0.5=126, 2=128, 1=127
  EXPECT_EQ(static_cast<uint32_t>(w[1]), 0x0000827Du);  // 8.0=130, 0.25=125
  std::vector<float> back(6);
  unpack_ue8m0(w.data(), 6, back.data());
  EXPECT_EQ(back, s);
}

TEST(Quantize, RowPerGroup) {
  // Group 0: amax 448 (scale 1): values quantize as themselves.
  // Group 1: all zero (floor scale): codes 0.
  const int H = 256;
  std::vector<uint16_t> x(H, float_to_bf16(0.0f));
  x[0] = float_to_bf16(448.0f);
  x[1] = float_to_bf16(-1.0625f);  // tie -> -1.0
  x[2] = float_to_bf16(3.0f);
  std::vector<uint8_t> q(H);
  std::vector<float> s(2);
  quantize_row(x.data(), H, ScaleFormat::kF32, q.data(), s.data());
  EXPECT_EQ(s[0], 1.0f);
  EXPECT_EQ(s[1], 1e-4f / 448.0f);
  EXPECT_EQ(q[0], 0x7E);
  EXPECT_EQ(q[1], 0xB8);
  EXPECT_EQ(q[2], float_to_e4m3(3.0f));
  for (int i = 128; i < H; ++i) EXPECT_EQ(q[i], 0x00) << i;
  std::vector<float> d(H);
  dequantize_row(q.data(), s.data(), H, d.data());
  EXPECT_EQ(d[0], 448.0f);
  EXPECT_EQ(d[1], -1.0f);
  EXPECT_EQ(d[2], 3.0f);
}

TEST(Quantize, Ue8m0UsesPowerOfTwoScale) {
  const int H = 128;
  std::vector<uint16_t> x(H, float_to_bf16(1.0f));
  x[5] = float_to_bf16(-2.0f);  // amax 2 -> scale 2/448 -> 2^-7
  std::vector<uint8_t> q(H);
  std::vector<float> s(1);
  quantize_row(x.data(), H, ScaleFormat::kUe8m0, q.data(), s.data());
  EXPECT_EQ(s[0], std::ldexp(1.0f, -7));
  EXPECT_EQ(e4m3_to_float(q[5]), -256.0f);  // -2 * 128 exactly
  EXPECT_EQ(e4m3_to_float(q[0]), 128.0f);
}

TEST(Quantize, PerTokenTakesOneScaleOverTheWholeRow) {
  // Group 0 holds the row's amax (448: scale 1); group 1's small values are
  // scaled by it too, not by their own amax, so 0.01 becomes a subnormal code.
  const int H = 256;
  std::vector<uint16_t> x(H, float_to_bf16(0.0f));
  x[0] = float_to_bf16(448.0f);
  x[130] = float_to_bf16(0.01f);
  x[131] = float_to_bf16(-3.0f);
  std::vector<uint8_t> q(H), q_group(H);
  std::vector<float> s(2, -1.0f), s_group(2);
  quantize_row(x.data(), H, ScaleFormat::kPerToken, q.data(), s.data());
  EXPECT_EQ(s[0], 1.0f);
  EXPECT_EQ(s[1], -1.0f);  // one scale written, no more
  EXPECT_EQ(q[0], 0x7E);
  EXPECT_EQ(q[130], float_to_e4m3(bf16_to_float(x[130])));
  EXPECT_EQ(q[131], float_to_e4m3(-3.0f));
  quantize_row(x.data(), H, ScaleFormat::kF32, q_group.data(), s_group.data());
  EXPECT_EQ(s_group[1], 3.0f / 448.0f);
  EXPECT_NE(q[130], q_group[130]);
  // An all-zero row gets the floor, as a group does.
  std::vector<uint16_t> zero(H, float_to_bf16(0.0f));
  quantize_row(zero.data(), H, ScaleFormat::kPerToken, q.data(), s.data());
  EXPECT_EQ(s[0], 1e-4f / 448.0f);
}

TEST(Quantize, DequantizedErrorWithinHalfAnFp8Step) {
  // bf16 values in [-2, 2] with scale amax/448: |deq - x| <= 2^-4 * |x| for
  // normals (3 mantissa bits), plus half the subnormal step times scale.
  const int H = 512;
  std::vector<uint16_t> x(H);
  for (int i = 0; i < H; ++i) x[i] = float_to_bf16(std::sin(0.37f * i) * 2.0f);
  for (ScaleFormat f : {ScaleFormat::kF32, ScaleFormat::kUe8m0}) {
    std::vector<uint8_t> q(H);
    std::vector<float> s(H / 128), d(H);
    quantize_row(x.data(), H, f, q.data(), s.data());
    dequantize_row(q.data(), s.data(), H, d.data());
    for (int i = 0; i < H; ++i) {
      float xi = bf16_to_float(x[i]);
      EXPECT_LE(std::fabs(d[i] - xi), std::fabs(xi) / 16 + s[i / 128] * std::ldexp(1.0f, -10))
          << "i " << i;
    }
  }
}

}  // namespace
}  // namespace moe_ep_oracle
