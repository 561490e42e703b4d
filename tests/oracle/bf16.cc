// bf16.cc: bfloat16 rounding. Kept apart from kernels/host so a bug there
// cannot hide by being copied here.
#include "tests/oracle/bf16.h"

#include <cmath>
#include <cstring>

namespace moe_ep_oracle {

uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  // Adding 0x7FFF plus the kept LSB carries into bit 16 exactly when the
  // dropped half is above one half ulp, or equal to it with an odd LSB.
  uint32_t lsb = (u >> 16) & 1u;
  u += 0x7FFFu + lsb;
  return static_cast<uint16_t>(u >> 16);
}

float bf16_to_float(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

}  // namespace moe_ep_oracle
