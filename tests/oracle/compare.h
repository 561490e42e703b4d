// compare.h: how conformance tests compare plugin outputs with the oracle,
// with messages that say where and by how much (rank, index, got, want).
#ifndef MOE_EP_TESTS_ORACLE_COMPARE_H_
#define MOE_EP_TESTS_ORACLE_COMPARE_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace moe_ep_oracle {

// fp8 payloads: codes equal, or neighbours of the same sign (|magnitude code
// difference| == 1), or +0/-0. Why: q = e4m3(x / scale) is the reference, but
// a kernel computing x * (1 / scale) differs from it by one float ulp before
// rounding, which flips the e4m3 rounding of ~1 value in 2^20 when scales are
// not powers of two. With power-of-two scales (UE8M0) compare exactly.
bool e4m3_adjacent(uint8_t got, uint8_t want);
std::string compare_e4m3_adjacent(const char* what, const uint8_t* got, const uint8_t* want,
                                  size_t n, size_t row_len);

// Bit-exact comparisons (dispatch payloads, counts, and combine outputs,
// whose summation order is documented), same message shape.
std::string compare_exact_u8(const char* what, const uint8_t* got, const uint8_t* want,
                             size_t n, size_t row_len);
std::string compare_exact_u16(const char* what, const uint16_t* got, const uint16_t* want,
                              size_t n, size_t row_len);
// bf16 bits compared exactly, shown as bits and value ("0x3f81 (1.0078125)").
std::string compare_exact_bf16(const char* what, const uint16_t* got, const uint16_t* want,
                               size_t n, size_t row_len);
std::string compare_exact_i32(const char* what, const int32_t* got, const int32_t* want,
                              size_t n, size_t row_len);
std::string compare_exact_f32(const char* what, const float* got, const float* want,
                              size_t n, size_t row_len);

}  // namespace moe_ep_oracle

#endif  // MOE_EP_TESTS_ORACLE_COMPARE_H_
