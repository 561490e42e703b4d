// fp8.cc: E4M3FN by definition. Encoding searches the table of decoded
// magnitudes instead of manipulating bits, so it cannot share a bit trick's bug.
#include "tests/oracle/fp8.h"

#include <array>
#include <cmath>
#include <limits>

namespace moe_ep_oracle {
namespace {

constexpr int kMaxFiniteCode = 0x7E;

float decode_by_definition(uint8_t code) {
  int sign = code >> 7;
  int exponent = (code >> 3) & 0xF;
  int mantissa = code & 0x7;
  if (exponent == 0xF && mantissa == 0x7) return std::numeric_limits<float>::quiet_NaN();
  double magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(mantissa / 8.0, 1 - 7);  // subnormal: 0.m * 2^-6
  } else {
    magnitude = std::ldexp(1.0 + mantissa / 8.0, exponent - 7);
  }
  return static_cast<float>(sign ? -magnitude : magnitude);
}

const std::array<float, 256>& decode_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[c] = decode_by_definition(static_cast<uint8_t>(c));
    return t;
  }();
  return table;
}

}  // namespace

float e4m3_to_float(uint8_t code) { return decode_table()[code]; }

uint8_t float_to_e4m3(float f) {
  uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  if (std::isnan(f)) return sign | 0x7F;
  double a = std::fabs(static_cast<double>(f));
  if (a >= kE4m3Max) return sign | kMaxFiniteCode;  // satfinite, inf included

  // Codes 0x00..0x7E decode to strictly increasing magnitudes: find the
  // largest code whose value is <= a; a < 448 so code + 1 is still finite.
  const std::array<float, 256>& t = decode_table();
  int lo = 0, hi = kMaxFiniteCode;  // invariant: t[lo] <= a < t[hi]
  while (hi - lo > 1) {
    int mid = (lo + hi) / 2;
    if (t[mid] <= a) lo = mid; else hi = mid;
  }
  // Differences of floats held in double are exact, so the tie test is exact.
  double below = a - t[lo], above = t[hi] - a;
  int code;
  if (below < above) code = lo;
  else if (above < below) code = hi;
  else code = (lo % 2 == 0) ? lo : hi;  // tie: even mantissa = even code
  return static_cast<uint8_t>(sign | code);
}

}  // namespace moe_ep_oracle
