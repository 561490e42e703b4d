/* demo_verify.c: the demo's own reference arithmetic (see demo_verify.h),
 * written from the documented formats: bf16 round-to-nearest-even, fp8
 * e4m3 with one f32 scale per 128 channels (amax / 448), and combine's sum
 * with the weights at combine: fmaf in f32 from +0 over k ascending (README),
 * which every backend follows, so the check is bit for bit. */
#include "integration/demo_verify.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEMO_GROUP 128      /* channels per fp8 scale */
#define DEMO_E4M3_MAX 448.0f
#define DEMO_AMAX_FLOOR 1e-4f /* an all-zero group still gets a finite scale */

static float bf16_to_float(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static uint16_t float_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if (isnan(f)) return (uint16_t)((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest, ties to even */
  return (uint16_t)(u >> 16);
}

static float e4m3_to_float(uint8_t b) {
  int e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return NAN;
  float v = e == 0 ? ldexpf((float)m, -9) : ldexpf(1.0f + (float)m / 8.0f, e - 7);
  return (b & 0x80) ? -v : v;
}

/* v rounded to the nearest e4m3 value (ties to even), saturating at 448:
 * 3 mantissa bits, so the step is 2^(exponent - 3), and 2^-9 below the
 * smallest normal 2^-6. */
static float e4m3_round(float v) {
  float a = fabsf(v);
  if (a >= DEMO_E4M3_MAX) return copysignf(DEMO_E4M3_MAX, v);
  int e;
  frexpf(a, &e); /* a in [2^(e-1), 2^e) */
  int lead = e - 1 < -6 ? -6 : e - 1;
  float step = ldexpf(1.0f, lead - 3);
  return copysignf(rintf(a / step) * step, v);
}

static void fp8_transport(const uint16_t *x, int hidden, float *out) {
  for (int g = 0; g < hidden / DEMO_GROUP; g++) {
    const uint16_t *xg = x + g * DEMO_GROUP;
    float amax = 0.0f;
    for (int i = 0; i < DEMO_GROUP; i++) amax = fmaxf(amax, fabsf(bf16_to_float(xg[i])));
    float scale = fmaxf(amax, DEMO_AMAX_FLOOR) / DEMO_E4M3_MAX;
    for (int i = 0; i < DEMO_GROUP; i++)
      out[g * DEMO_GROUP + i] = e4m3_round(bf16_to_float(xg[i]) / scale) * scale;
  }
}

void demo_transported_row(const uint16_t *x, int hidden, int fp8, float *out) {
  if (fp8) {
    fp8_transport(x, hidden, out);
  } else {
    for (int i = 0; i < hidden; i++) out[i] = bf16_to_float(x[i]);
  }
}

void demo_expert_row(int global_expert, const float *x, int hidden, uint16_t *y) {
  const float gain = 1.0f + 0.01f * (float)global_expert;
  for (int i = 0; i < hidden; i++) y[i] = float_to_bf16(x[i] * gain);
}

void demo_received_row(const void *row, const float *scales, int hidden, int fp8, float *out) {
  for (int i = 0; i < hidden; i++) {
    out[i] = fp8 ? e4m3_to_float(((const uint8_t *)row)[i]) * scales[i / DEMO_GROUP]
                 : bf16_to_float(((const uint16_t *)row)[i]);
  }
}

/* Token t's combine against the reference, in the documented order: per
 * rank the token reaches (first appearance in its top-k), a bf16-rounded
 * f32 sum of that rank's slots in k order; those partials summed in f32,
 * then bf16. xr, acc, part, y are [hidden] scratch. */
static int check_token(int rank, int t, int hidden, int top_k, int local_experts, int fp8,
                       const uint16_t *x, const int64_t *topk_idx, const float *weights,
                       const uint16_t *out, float *xr, float *acc, float *part, uint16_t *y,
                       char *why, int why_len) {
  const int64_t *idx = topk_idx + (size_t)t * (size_t)top_k;
  const float *w = weights + (size_t)t * (size_t)top_k;
  demo_transported_row(x + (size_t)t * (size_t)hidden, hidden, fp8, xr);
  for (int i = 0; i < hidden; i++) acc[i] = 0.0f;
  for (int k = 0; k < top_k; k++) {
    if (idx[k] < 0) continue;
    const int64_t r = idx[k] / local_experts;
    int first = 1;
    for (int j = 0; j < k && first; j++) first = idx[j] < 0 || idx[j] / local_experts != r;
    if (!first) continue; /* r's partial was added at its first slot */
    for (int i = 0; i < hidden; i++) part[i] = 0.0f;
    for (int j = k; j < top_k; j++) {
      if (idx[j] < 0 || idx[j] / local_experts != r) continue;
      demo_expert_row((int)idx[j], xr, hidden, y);
      for (int i = 0; i < hidden; i++) part[i] = fmaf(w[j], bf16_to_float(y[i]), part[i]);
    }
    for (int i = 0; i < hidden; i++) acc[i] += bf16_to_float(float_to_bf16(part[i]));
  }
  for (int i = 0; i < hidden; i++) {
    const size_t flat = (size_t)t * (size_t)hidden + (size_t)i;
    const uint16_t want = float_to_bf16(acc[i]);
    if (out[flat] != want) {
      snprintf(why, (size_t)why_len,
               "rank %d: combine out[%d][%d] (flat %zu) is bf16 0x%04x (%g), expected 0x%04x (%g)",
               rank, t, i, flat, out[flat], bf16_to_float(out[flat]), want,
               bf16_to_float(want));
      return 0;
    }
  }
  return 1;
}

int demo_verify_combine(int rank, int hidden, int top_k, int local_experts, int fp8,
                        int num_tokens, const uint16_t *x, const int64_t *topk_idx,
                        const float *weights, const uint16_t *out, char *why, int why_len) {
  float *xr = malloc(sizeof(float) * (size_t)hidden);
  float *acc = malloc(sizeof(float) * (size_t)hidden);
  float *part = malloc(sizeof(float) * (size_t)hidden);
  uint16_t *y = malloc(sizeof(uint16_t) * (size_t)hidden);
  int ok = xr != NULL && acc != NULL && part != NULL && y != NULL;
  if (!ok) snprintf(why, (size_t)why_len, "rank %d: out of memory in the check", rank);
  for (int t = 0; ok && t < num_tokens; t++) {
    ok = check_token(rank, t, hidden, top_k, local_experts, fp8, x, topk_idx, weights, out, xr,
                     acc, part, y, why, why_len);
  }
  free(xr);
  free(acc);
  free(part);
  free(y);
  return ok;
}
