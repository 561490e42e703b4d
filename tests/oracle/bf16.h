// bf16.h: bfloat16 <-> float for the oracle, from the format's definition
// (the top 16 bits of an IEEE binary32). bf16 values travel as uint16_t bits.
#ifndef MOE_EP_TESTS_ORACLE_BF16_H_
#define MOE_EP_TESTS_ORACLE_BF16_H_

#include <cstdint>

namespace moe_ep_oracle {

// Round-to-nearest-even; overflow rounds to +-inf as RNE must; a NaN stays
// a NaN (sign kept, quiet bit set so truncation cannot turn it into inf).
uint16_t float_to_bf16(float f);

// Exact: every bf16 value is a float.
float bf16_to_float(uint16_t b);

}  // namespace moe_ep_oracle

#endif  // MOE_EP_TESTS_ORACLE_BF16_H_
