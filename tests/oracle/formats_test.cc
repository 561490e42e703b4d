// formats_test.cc: bf16 and fp8 e4m3fn conversions pinned to values worked
// out by hand from the formats' definitions.
#include <cmath>
#include <cstring>
#include <limits>

#include <gtest/gtest.h>

#include "tests/oracle/bf16.h"
#include "tests/oracle/fp8.h"
#include "tests/oracle/rng.h"

namespace moe_ep_oracle {
namespace {

float from_bits(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

TEST(Bf16, KnownValues) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bf16(-2.0f), 0xC000);
  EXPECT_EQ(float_to_bf16(0.0f), 0x0000);
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(bf16_to_float(0x3F80), 1.0f);
  EXPECT_EQ(bf16_to_float(0xC040), -3.0f);
}

TEST(Bf16, RoundsToNearestEven) {
  const float ulp = std::ldexp(1.0f, -7);  // bf16 ulp at 1.0
  EXPECT_EQ(float_to_bf16(1.0f + ulp / 2), 0x3F80);          // tie, even below
  EXPECT_EQ(float_to_bf16(1.0f + 3 * ulp / 2), 0x3F82);      // tie, even above
  EXPECT_EQ(float_to_bf16(1.0f + ulp / 2 + std::ldexp(1.0f, -20)), 0x3F81);
  EXPECT_EQ(float_to_bf16(1.0f + ulp / 2 - std::ldexp(1.0f, -20)), 0x3F80);
}

TEST(Bf16, OverflowInfAndNan) {
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // RNE -> inf
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(float_to_bf16(-std::numeric_limits<float>::infinity()), 0xFF80);
  // A NaN whose payload sits only in the dropped bits must not become inf.
  uint16_t b = float_to_bf16(from_bits(0x7F800001u));
  EXPECT_TRUE(std::isnan(bf16_to_float(b))) << std::hex << b;
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
}

TEST(Bf16, RoundTripsEveryNonNanCode) {
  for (uint32_t c = 0; c < 0x10000; ++c) {
    float f = bf16_to_float(static_cast<uint16_t>(c));
    if (std::isnan(f)) continue;
    EXPECT_EQ(float_to_bf16(f), c);
  }
}

TEST(E4m3, DecodesKnownCodes) {
  EXPECT_EQ(e4m3_to_float(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(e4m3_to_float(0x80)));
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));   // min subnormal
  EXPECT_EQ(e4m3_to_float(0x07), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_to_float(0x08), std::ldexp(1.0f, -6));   // min normal
  EXPECT_EQ(e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_float(0x39), 1.125f);
  EXPECT_EQ(e4m3_to_float(0x7D), 416.0f);
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0f);                 // max normal
  EXPECT_EQ(e4m3_to_float(0xFE), -448.0f);
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0xFF)));
  EXPECT_EQ(e4m3_to_float(0x78), 256.0f);                 // exponent 15 is finite
}

TEST(E4m3, SaturatesAndKeepsNan) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(float_to_e4m3(448.0f), 0x7E);
  EXPECT_EQ(float_to_e4m3(464.0f), 0x7E);   // would round to 480: saturates
  EXPECT_EQ(float_to_e4m3(1e9f), 0x7E);
  EXPECT_EQ(float_to_e4m3(inf), 0x7E);
  EXPECT_EQ(float_to_e4m3(-inf), 0xFE);
  EXPECT_EQ(float_to_e4m3(-1e9f), 0xFE);
  EXPECT_TRUE(e4m3_is_nan(float_to_e4m3(std::nanf(""))));
  EXPECT_EQ(float_to_e4m3(std::nanf("")), 0x7F);
  EXPECT_EQ(float_to_e4m3(-std::nanf("")), 0xFF);
}

TEST(E4m3, SubnormalsAndZero) {
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.0f, -9)), 0x01);
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.0f, -10)), 0x00);        // tie 0 vs 2^-9: even
  EXPECT_EQ(float_to_e4m3(1.5f * std::ldexp(1.0f, -10)), 0x01);
  EXPECT_EQ(float_to_e4m3(3 * std::ldexp(1.0f, -10)), 0x02);    // tie 1 vs 2 (x2^-9): even
  EXPECT_EQ(float_to_e4m3(5 * std::ldexp(1.0f, -10)), 0x02);    // tie 2 vs 3: even
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.0f, -30)), 0x00);
  EXPECT_EQ(float_to_e4m3(-std::ldexp(1.0f, -30)), 0x80);       // sign kept
  EXPECT_EQ(float_to_e4m3(-0.0f), 0x80);
  EXPECT_EQ(float_to_e4m3(0.0f), 0x00);
}

TEST(E4m3, TiesToEvenAtNormals) {
  EXPECT_EQ(float_to_e4m3(1.0625f), 0x38);   // 1.0 | 1.125: even is 1.0
  EXPECT_EQ(float_to_e4m3(1.1875f), 0x3A);   // 1.125 | 1.25: even is 1.25
  EXPECT_EQ(float_to_e4m3(1.07f), 0x39);     // above the tie
  EXPECT_EQ(float_to_e4m3(432.0f), 0x7E);    // 416 | 448: even is 448
  EXPECT_EQ(float_to_e4m3(-1.0625f), 0xB8);
}

TEST(E4m3, RoundTripsAllCodes) {
  for (int c = 0; c < 256; ++c) {
    uint8_t code = static_cast<uint8_t>(c);
    if (e4m3_is_nan(code)) continue;
    EXPECT_EQ(float_to_e4m3(e4m3_to_float(code)), code) << "code " << c;
  }
}

// The binary search against the definition itself: nearest by linear scan.
TEST(E4m3, MatchesLinearScanOnRandomValues) {
  SplitMix64 rng(42);
  for (int i = 0; i < 20000; ++i) {
    float f = static_cast<float>(std::ldexp(rng.unit() * 2 - 1, static_cast<int>(rng.below(22)) - 12));
    double a = std::fabs(static_cast<double>(f));
    int best = 0;
    for (int c = 1; c <= 0x7E; ++c) {
      double dc = std::fabs(e4m3_to_float(static_cast<uint8_t>(c)) - a);
      double db = std::fabs(e4m3_to_float(static_cast<uint8_t>(best)) - a);
      if (dc < db || (dc == db && c % 2 == 0)) best = c;
    }
    if (a >= 448) best = 0x7E;
    uint8_t want = static_cast<uint8_t>((std::signbit(f) ? 0x80 : 0) | best);
    ASSERT_EQ(float_to_e4m3(f), want) << "f = " << f;
  }
}

}  // namespace
}  // namespace moe_ep_oracle
