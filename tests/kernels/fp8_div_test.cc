// fp8_div_test.cc: the fp8 quantiser's quotient (kernels/common/fp8_div.h)
// against IEEE division, for every scale the f32 rule makes from a bf16
// amax and every bf16 value: 32640 scales x 65282 values.
#include "kernels/common/fp8_div.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>

namespace {

float Bf16(uint32_t bits) {
  const uint32_t u = bits << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

struct Scan {
  uint64_t pairs = 0, bad = 0;
  float first_s = 0, first_x = 0, first_want = 0, first_got = 0;
};

// Where the two can differ without changing an e4m3 byte: a quotient under
// 2^-20 (e4m3's smallest step is 2^-9) must stay under 2^-19 with the
// division's sign; every other quotient must be the division's, bit for bit.
inline bool Agrees(float want, float got) {
  if (std::fabs(want) >= 0x1p-20f) return Bits(want) == Bits(got);
  return std::fabs(got) < 0x1p-19f && std::signbit(got) == std::signbit(want);
}

// Every positive finite bf16 amax (bit patterns below 0x7F80) through the
// quantiser's scale rule (fp8.cuh, mep_fp8_scale), and every non-NaN bf16 x.
__attribute__((always_inline)) inline void ScanBody(Scan* out) {
  for (uint32_t a = 0; a < 0x7F80u; ++a) {
    const float s = std::fmax(Bf16(a), 1e-4f) / 448.0f;
    const float inv = 1.0f / s;
    for (uint32_t h = 0; h < 0x10000u; ++h) {
      const float x = Bf16(h);
      if (std::isnan(x)) continue;
      const float want = x / s, got = mep_fp8_div(x, s, inv);
      ++out->pairs;
      if (Agrees(want, got)) continue;
      if (out->bad++ == 0) {
        out->first_s = s;
        out->first_x = x;
        out->first_want = want;
        out->first_got = got;
      }
    }
  }
}

#if defined(__x86_64__)
// The same loop with the FMA instructions inlined (fmaf is a library call
// without them); picked only on a CPU that has them.
__attribute__((target("fma"))) void ScanFma(Scan* out) { ScanBody(out); }
#endif
void ScanPlain(Scan* out) { ScanBody(out); }

void ScanAll(Scan* out) {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("fma")) return ScanFma(out);
#endif
  ScanPlain(out);
}

// Every positive finite bf16 amax (0 and the subnormals take the 1e-4
// floor), every non-NaN bf16 x (+-inf included).
TEST(Fp8Div, MatchesIeeeDivisionForEveryScaleAndBf16Value) {
  Scan sc;
  ScanAll(&sc);
  EXPECT_EQ(sc.pairs, uint64_t{0x7F80u} * (0x10000u - 2u * 127u));
  EXPECT_EQ(sc.bad, 0u) << "first mismatch: s=" << std::hexfloat << sc.first_s
                        << " x=" << sc.first_x << " expected " << sc.first_want << " got "
                        << sc.first_got;
}

// Signed zeros and infinities keep the division's value and sign.
TEST(Fp8Div, SignedZerosAndInfinities) {
  const float s = 1e-4f / 448.0f, inv = 1.0f / s;
  for (float x : {0.0f, -0.0f, INFINITY, -INFINITY, 0x1p-149f, -0x1p-149f}) {
    const float got = mep_fp8_div(x, s, inv);
    EXPECT_EQ(std::signbit(got), std::signbit(x)) << "x=" << std::hexfloat << x;
    if (std::isinf(x)) {
      EXPECT_EQ(got, x);
    }
    if (x == 0.0f) {
      EXPECT_EQ(got, 0.0f);
    }
  }
  EXPECT_TRUE(std::isnan(mep_fp8_div(NAN, s, inv)));
}

}  // namespace
