// compare.h: how conformance tests compare plugin outputs with the oracle,
// with messages that say where and by how much (rank, index, got, want).
#ifndef MOE_EP_TESTS_ORACLE_COMPARE_H_
#define MOE_EP_TESTS_ORACLE_COMPARE_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace moe_ep_oracle {

// Combine outputs: |got - want| <= tol * max(1, |want|), tol = 1e-2.
// Why: the plugin may sum the same float terms in another order (<= 32 top-k
// terms, or <= world partials); the float error of that is ~1e-6 relative to
// the terms, but it can move the final bf16 rounding by one ulp (2^-8 = 0.4%
// relative); 1e-2 covers that with margin, and the floor of 1 keeps sums
// that cancel to near 0 from demanding relative precision they cannot have.
// A wrong expert (gain differs by >= 1%), a missing or doubled term (weights
// >= 0.05) or a wrong token is far outside it. A NaN never matches.
constexpr float kBf16SumTol = 1e-2f;
bool bf16_sum_close(float got, float want, float tol = kBf16SumTol);

// "" if got[i] and want[i] (bf16 bits) satisfy bf16_sum_close for all
// i < n; else "<what>: N of n differ; first at [row, col] (flat i): got G
// want W", with row/col from row_len.
std::string compare_bf16_close(const char* what, const uint16_t* got, const uint16_t* want,
                               size_t n, size_t row_len, float tol = kBf16SumTol);

// fp8 payloads: codes equal, or neighbours of the same sign (|magnitude code
// difference| == 1), or +0/-0. Why: q = e4m3(x / scale) is the reference, but
// a kernel computing x * (1 / scale) differs from it by one float ulp before
// rounding, which flips the e4m3 rounding of ~1 value in 2^20 when scales are
// not powers of two. With power-of-two scales (UE8M0) compare exactly.
bool e4m3_adjacent(uint8_t got, uint8_t want);
std::string compare_e4m3_adjacent(const char* what, const uint8_t* got, const uint8_t* want,
                                  size_t n, size_t row_len);

// Bit-exact comparisons (dispatch payloads, counts), same message shape.
std::string compare_exact_u8(const char* what, const uint8_t* got, const uint8_t* want,
                             size_t n, size_t row_len);
std::string compare_exact_u16(const char* what, const uint16_t* got, const uint16_t* want,
                              size_t n, size_t row_len);
std::string compare_exact_i32(const char* what, const int32_t* got, const int32_t* want,
                              size_t n, size_t row_len);
std::string compare_exact_f32(const char* what, const float* got, const float* want,
                              size_t n, size_t row_len);

}  // namespace moe_ep_oracle

#endif  // MOE_EP_TESTS_ORACLE_COMPARE_H_
