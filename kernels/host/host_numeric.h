/* host_numeric.h: number formats for the host backend, in plain C: bf16,
 * fp8 e4m3fn (round to nearest even, saturating), per-128-channel scales
 * (f32 or UE8M0 power-of-two). Bit-exact with the GPU conversion rules. */
#ifndef MEP_HOST_NUMERIC_H_
#define MEP_HOST_NUMERIC_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

float mep_bf16_to_f32(uint16_t v);
uint16_t mep_f32_to_bf16(float f); /* round to nearest even; NaN stays NaN */

float mep_e4m3_to_f32(uint8_t v);
/* Round to nearest even; beyond +-448 (and +-inf) saturates to +-448;
 * NaN of either sign -> 0x7F (as CUDA's satfinite conversion of the
 * GPU quantiser). */
uint8_t mep_f32_to_e4m3(float f);

/* Scale of one 128-channel group: max(amax, 1e-4) / 448, rounded up to a
 * power of two when `pow2` (UE8M0); amax is over the finite values only
 * (moe_ep.h, "fp8 and non-finite input"). */
float mep_fp8_group_scale(const uint16_t *x_bf16, int n, int pow2);
/* The biased 8-bit exponent of a power-of-two scale (UE8M0 code). */
uint8_t mep_ue8m0_code(float pow2_scale);

#ifdef __cplusplus
}
#endif

#endif /* MEP_HOST_NUMERIC_H_ */
