// compare.cc: element-wise comparison loops that count mismatches and
// describe the first one.
#include "tests/oracle/compare.h"

#include <cstdio>
#include <cstring>
#include <sstream>

#include "tests/oracle/bf16.h"

namespace moe_ep_oracle {
namespace {

template <typename T, typename Same, typename Show>
std::string compare(const char* what, const T* got, const T* want, size_t n, size_t row_len,
                    Same same, Show show) {
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < n; ++i)
    if (!same(got[i], want[i]) && bad++ == 0) first = i;
  if (bad == 0) return "";
  if (row_len == 0) row_len = 1;
  std::ostringstream m;
  m << what << ": " << bad << " of " << n << " differ; first at [" << first / row_len << ", "
    << first % row_len << "] (flat " << first << "): got " << show(got[first]) << " want "
    << show(want[first]);
  return m.str();
}

template <typename T>
bool bits_equal(T a, T b) { return std::memcmp(&a, &b, sizeof a) == 0; }

}  // namespace


std::string compare_exact_u8(const char* what, const uint8_t* got, const uint8_t* want,
                             size_t n, size_t row_len) {
  return compare(what, got, want, n, row_len, bits_equal<uint8_t>, [](uint8_t v) { return int(v); });
}

std::string compare_exact_u16(const char* what, const uint16_t* got, const uint16_t* want,
                              size_t n, size_t row_len) {
  return compare(what, got, want, n, row_len, bits_equal<uint16_t>, [](uint16_t v) { return int(v); });
}

std::string compare_exact_bf16(const char* what, const uint16_t* got, const uint16_t* want,
                               size_t n, size_t row_len) {
  return compare(what, got, want, n, row_len, bits_equal<uint16_t>, [](uint16_t v) {
    char s[48];
    std::snprintf(s, sizeof s, "0x%04x (%.9g)", v, static_cast<double>(bf16_to_float(v)));
    return std::string(s);
  });
}

std::string compare_exact_i32(const char* what, const int32_t* got, const int32_t* want,
                              size_t n, size_t row_len) {
  return compare(what, got, want, n, row_len, bits_equal<int32_t>, [](int32_t v) { return v; });
}

std::string compare_exact_f32(const char* what, const float* got, const float* want,
                              size_t n, size_t row_len) {
  return compare(what, got, want, n, row_len, bits_equal<float>, [](float v) { return v; });
}

}  // namespace moe_ep_oracle
