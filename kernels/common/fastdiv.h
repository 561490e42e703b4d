/* fastdiv.h: quotients of non-negative 31-bit values by a divisor that is
 * fixed for a whole launch, as one widening multiply and a shift instead
 * of a division. The host makes the multiplier once per launch
 * (mep_fastdiv_mul); a kernel pairs it with its shift (mep_fastdiv_of, a
 * count of leading zeros), so the argument block carries four bytes per
 * divisor. Its work-unit index math then costs a few instructions where
 * an integer division costs ~20 dependent ones ahead of the unit's first
 * loads.
 *
 * Granlund and Montgomery's round-up multiplier: with l = ceil(log2 d),
 * mul = floor(2^(31 + l) / d) + 1 < 2^32 and
 * floor(x / d) = (x * mul) >> (31 + l) for every 0 <= x < 2^31.
 * Plain C, so the host test checks the device formula. */
#ifndef MEP_KERNELS_FASTDIV_H_
#define MEP_KERNELS_FASTDIV_H_

#include <stdint.h>

#ifdef __CUDACC__
#define MEP_FASTDIV_HD __host__ __device__
#else
#define MEP_FASTDIV_HD
#endif

typedef struct mep_fastdiv {
  uint32_t mul;
  uint32_t shift; /* 31 + ceil(log2 d) */
} mep_fastdiv_t;

/* 31 + ceil(log2 d), d in 1 .. 2^31 - 1. */
static inline MEP_FASTDIV_HD uint32_t mep_fastdiv_shift(int32_t d) {
#ifdef __CUDA_ARCH__
  return 31u + 32u - (uint32_t)__clz(d - 1); /* __clz(0) = 32 */
#else
  uint32_t l = 0;
  while (((uint64_t)1 << l) < (uint64_t)d) ++l;
  return 31u + l;
#endif
}

/* The multiplier of divisor d in 1 .. 2^31 - 1 (the callers' divisors are
 * call shapes, checked positive before any launch). */
static inline MEP_FASTDIV_HD uint32_t mep_fastdiv_mul(int32_t d) {
  return (uint32_t)(((uint64_t)1 << mep_fastdiv_shift(d)) / (uint64_t)d + 1u);
}

/* Divisor d's pair from its multiplier (mep_fastdiv_mul(d)). */
static inline MEP_FASTDIV_HD mep_fastdiv_t mep_fastdiv_of(int32_t d, uint32_t mul) {
  mep_fastdiv_t f;
  f.mul = mul;
  f.shift = mep_fastdiv_shift(d);
  return f;
}

/* floor(x / d) for 0 <= x < 2^31. */
static inline MEP_FASTDIV_HD int32_t mep_fastdiv(int32_t x, mep_fastdiv_t f) {
  return (int32_t)(((uint64_t)(uint32_t)x * f.mul) >> f.shift);
}

#endif /* MEP_KERNELS_FASTDIV_H_ */
