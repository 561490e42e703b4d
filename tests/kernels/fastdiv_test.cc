// fastdiv_test.cc: mep_fastdiv against the division it replaces.
#include "kernels/common/fastdiv.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>

namespace {

// Every divisor up to 2^16 (top_k, world sizes, experts per rank, chunks
// per row all lie far below), at the dividends where a quotient changes.
TEST(FastDiv, ExactAroundEveryMultiple) {
  for (int32_t d = 1; d <= (1 << 16); ++d) {
    const mep_fastdiv_t f = mep_fastdiv_of(d, mep_fastdiv_mul(d));
    for (int64_t q : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{(1 << 20) / d},
                      int64_t{(int64_t{INT32_MAX}) / d}}) {
      for (int64_t x : {q * d - 1, q * d, q * d + d - 1}) {
        if (x < 0 || x > INT32_MAX) continue;
        ASSERT_EQ(mep_fastdiv((int32_t)x, f), (int32_t)(x / d))
            << "d=" << d << " x=" << x << " mul=" << f.mul << " shift=" << f.shift;
      }
    }
  }
}

// Large divisors, and random dividends up to 2^31 - 1 (seed 1).
TEST(FastDiv, ExactForLargeDivisorsAndRandomDividends) {
  std::mt19937 rng(1);
  std::uniform_int_distribution<int32_t> any(0, INT32_MAX), divisor(1, INT32_MAX);
  for (int i = 0; i < 200000; ++i) {
    const int32_t d = i < 64 ? (int32_t)((int64_t{1} << (i % 31)) + (i / 31) - 1) : divisor(rng);
    if (d < 1) continue;
    const mep_fastdiv_t f = mep_fastdiv_of(d, mep_fastdiv_mul(d));
    for (int32_t x : {any(rng), INT32_MAX, d, d - 1}) {
      ASSERT_EQ(mep_fastdiv(x, f), x / d) << "seed 1 step " << i << " d=" << d << " x=" << x;
    }
  }
}

// The device's shift, a count of leading zeros of d - 1, is the host's.
TEST(FastDiv, DeviceShiftFormula) {
  for (int64_t d = 2; d <= INT32_MAX; d = d < (1 << 16) ? d + 1 : d * 3 / 2 + 1)
    ASSERT_EQ(31u + 32u - (uint32_t)__builtin_clz((uint32_t)d - 1u),
              mep_fastdiv_shift((int32_t)d))
        << "d=" << d;
}

}  // namespace
