// fp8.h: OCP FP8 E4M3FN <-> float for the oracle: bias 7, no infinities,
// S.1111.111 is NaN, max normal 448 (0x7E), min normal 2^-6, min subnormal 2^-9.
#ifndef MOE_EP_TESTS_ORACLE_FP8_H_
#define MOE_EP_TESTS_ORACLE_FP8_H_

#include <cstdint>

namespace moe_ep_oracle {

constexpr float kE4m3Max = 448.0f;

// Exact decode of any of the 256 codes; 0x7F / 0xFF give a NaN.
float e4m3_to_float(uint8_t code);

// Round-to-nearest-even, saturating ("satfinite", as CUDA's
// __NV_SATFINITE): finite values beyond 448 and +-inf give +-448; NaN gives
// 0x7F with the input's sign. Values that round to zero keep their sign.
uint8_t float_to_e4m3(float f);

inline bool e4m3_is_nan(uint8_t code) { return (code & 0x7F) == 0x7F; }

}  // namespace moe_ep_oracle

#endif  // MOE_EP_TESTS_ORACLE_FP8_H_
