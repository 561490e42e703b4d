/* fp8_div.h: the fp8 quantiser's x / s, correctly rounded, without a
 * division per value: q0 = x * inv with inv = RN(1 / s), then one
 * correction by the exact residual x - q0 * s (one fused multiply-add):
 * q = RN(q0 + (x - q0 * s) * inv), Markstein's sequence. __fdiv_rn runs the
 * same steps but checks each value's operands and branches to a slow path,
 * and those branches kept a lane's 16 divisions in series.
 *
 * Exact where the quantiser needs it: for every scale the f32 rule makes
 * from a bf16 amax (max(amax, 1e-4) / 448) and every bf16 x, the quotient
 * equals IEEE x / s bit for bit when |x / s| >= 2^-20, and otherwise has
 * the same sign and stays below 2^-19, so both give e4m3 (+-)0
 * (tests/kernels/fp8_div_test.cc runs all 2.13e9 pairs). A non-finite x
 * leaves a NaN residual and keeps q0 (+-inf or NaN); the result takes x's
 * sign, as the division's does, also where q0 and the correction cancel
 * to zero. Plain C, so the host test checks the device formula. */
#ifndef MEP_KERNELS_FP8_DIV_H_
#define MEP_KERNELS_FP8_DIV_H_

#include <math.h>

#ifdef __CUDACC__
#define MEP_FP8_DIV_HD __host__ __device__
#else
#define MEP_FP8_DIV_HD
#endif

/* x / s for s > 0 normal, given inv = RN(1 / s). */
static inline MEP_FP8_DIV_HD float mep_fp8_div(float x, float s, float inv) {
#ifdef __CUDA_ARCH__
  const float q0 = __fmul_rn(x, inv);
  const float e = __fmaf_rn(-q0, s, x);
  return copysignf(isfinite(e) ? __fmaf_rn(e, inv, q0) : q0, x);
#else
  const float q0 = x * inv;
  const float e = fmaf(-q0, s, x);
  return copysignf(isfinite(e) ? fmaf(e, inv, q0) : q0, x);
#endif
}

#endif /* MEP_KERNELS_FP8_DIV_H_ */
