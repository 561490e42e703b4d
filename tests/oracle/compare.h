// compare.h: how conformance tests compare plugin outputs with the oracle,
// with messages that say where and by how much (rank, index, got, want).
#ifndef MOE_EP_TESTS_ORACLE_COMPARE_H_
#define MOE_EP_TESTS_ORACLE_COMPARE_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace moe_ep_oracle {

// Bit-exact comparisons (dispatch payloads, fp8 codes included: the
// kernels quantise by an exact division, q = e4m3(x / scale), as the oracle
// does (tests/kernels/fp8_div_test.cc); counts; combine outputs, whose
// summation order is documented), with the same message shape.
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
