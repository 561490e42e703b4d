/* host_numeric.c: bf16 / e4m3fn conversions and fp8 group scales. */
#include "kernels/host/host_numeric.h"

#include <math.h>
#include <string.h>

static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}

static float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

float mep_bf16_to_f32(uint16_t v) { return bits_f32((uint32_t)v << 16); }

uint16_t mep_f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
  uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb; /* round half to even on the dropped 16 bits */
  return (uint16_t)(u >> 16);
}

float mep_e4m3_to_f32(uint8_t v) {
  int sign = v >> 7;
  int exp = (v >> 3) & 0xf;
  int man = v & 0x7;
  float mag;
  if (exp == 0xf && man == 0x7) return sign ? -NAN : NAN;
  if (exp == 0) {
    mag = ldexpf((float)man, -9); /* subnormal: man/8 * 2^-6 */
  } else {
    mag = ldexpf(1.0f + (float)man / 8.0f, exp - 7);
  }
  return sign ? -mag : mag;
}

uint8_t mep_f32_to_e4m3(float f) {
  if (isnan(f)) return 0x7f; /* the sign of a NaN is not kept */
  uint8_t sign = signbit(f) ? 0x80 : 0x00;
  float a = fabsf(f);
  if (a >= 448.0f) return (uint8_t)(sign | 0x7e); /* satfinite, inf too */
  /* Quantum of the binade that holds a: subnormals (a < 2^-6) step by 2^-9,
   * normals with exponent e by 2^(e-3). rintf rounds ties to even. */
  int e;
  frexpf(a, &e); /* a = m * 2^e, m in [0.5, 1) => unbiased exp is e-1 */
  int unb = e - 1;
  if (unb < -6) unb = -6;
  float quantum = ldexpf(1.0f, unb - 3);
  float q = rintf(a / quantum) * quantum; /* exact: a/quantum fits float */
  if (q >= 448.0f) return (uint8_t)(sign | 0x7e);
  if (q == 0.0f) return sign;
  int qe;
  float qm = frexpf(q, &qe); /* q = qm * 2^qe */
  int exp_field = qe - 1 + 7;
  if (exp_field <= 0) { /* subnormal */
    int man = (int)ldexpf(q, 9);
    return (uint8_t)(sign | man);
  }
  int man = (int)((qm * 2.0f - 1.0f) * 8.0f);
  return (uint8_t)(sign | (exp_field << 3) | man);
}

float mep_fp8_group_scale(const uint16_t *x, int n, int pow2) {
  float amax = 0.0f;
  for (int i = 0; i < n; i++) {
    float a = fabsf(mep_bf16_to_f32(x[i]));
    if (a > amax && isfinite(a)) amax = a; /* NaN fails a > amax */
  }
  if (amax < 1e-4f) amax = 1e-4f;
  float scale = amax / 448.0f;
  if (pow2) {
    int e;
    float m = frexpf(scale, &e); /* scale = m * 2^e, m in [0.5, 1) */
    scale = (m == 0.5f) ? ldexpf(1.0f, e - 1) : ldexpf(1.0f, e);
  }
  return scale;
}

uint8_t mep_ue8m0_code(float s) {
  int e;
  frexpf(s, &e);
  return (uint8_t)(e - 1 + 127);
}
