/* host_rows.c: packing and unpacking of host-backend rows. */
#include "kernels/host/host_rows.h"

#include <string.h>

#include "kernels/common/limits.h"
#include "kernels/host/host_numeric.h"

#define ROUND16(x) (((x) + 15u) & ~(size_t)15u)
#define META_HEAD 2 /* int32 token, int32 ordinal */

static size_t payload_bytes(int hidden, int fp8) {
  if (!fp8) return ROUND16((size_t)hidden * 2u);
  return ROUND16((size_t)hidden + (size_t)(hidden / MEP_HIDDEN_ALIGN) * 4u);
}

void mep_row_layout_init(mep_row_layout_t *l, int hidden, int top_k, int fp8,
                         int scale_pow2) {
  l->hidden = hidden;
  l->top_k = top_k;
  l->fp8 = fp8;
  l->scale_pow2 = scale_pow2;
  l->meta_bytes = ROUND16((size_t)(META_HEAD + 2 * top_k) * 4u);
  l->payload_bytes = payload_bytes(hidden, fp8);
  l->row_bytes = l->meta_bytes + l->payload_bytes;
}

size_t mep_row_bytes_max(int hidden, int top_k, int fp8) {
  /* fp8 rows are never larger than bf16 rows of the same hidden. */
  size_t p = payload_bytes(hidden, 0);
  if (fp8 && payload_bytes(hidden, 1) > p) p = payload_bytes(hidden, 1);
  return ROUND16((size_t)(META_HEAD + 2 * top_k) * 4u) + p;
}

/* token, ordinal, lids[K], w[K]: the part every row kind shares. */
static void pack_meta(const mep_row_layout_t *l, uint8_t *row, int32_t token,
                      int32_t ordinal, const int32_t *lids, const float *weights) {
  int32_t *meta = (int32_t *)row;
  meta[0] = token;
  meta[1] = ordinal;
  memcpy(meta + META_HEAD, lids, (size_t)l->top_k * 4u);
  float *w = (float *)(meta + META_HEAD + l->top_k);
  for (int k = 0; k < l->top_k; k++) w[k] = weights ? weights[k] : 0.0f;
}

void mep_row_pack(const mep_row_layout_t *l, uint8_t *row, int32_t token,
                  int32_t ordinal, const int32_t *lids, const float *weights,
                  const uint16_t *x) {
  pack_meta(l, row, token, ordinal, lids, weights);
  uint8_t *payload = row + l->meta_bytes;
  if (!l->fp8) {
    memcpy(payload, x, (size_t)l->hidden * 2u);
    return;
  }
  int groups = l->hidden / MEP_HIDDEN_ALIGN;
  float *scales = (float *)(payload + l->hidden);
  for (int g = 0; g < groups; g++) {
    const uint16_t *xg = x + (size_t)g * MEP_HIDDEN_ALIGN;
    float s = mep_fp8_group_scale(xg, MEP_HIDDEN_ALIGN, l->scale_pow2);
    scales[g] = s;
    for (int i = 0; i < MEP_HIDDEN_ALIGN; i++) {
      payload[g * MEP_HIDDEN_ALIGN + i] = mep_f32_to_e4m3(mep_bf16_to_f32(xg[i]) / s);
    }
  }
}

void mep_row_pack_fp8(const mep_row_layout_t *l, uint8_t *row, int32_t token,
                      int32_t ordinal, const int32_t *lids, const float *weights,
                      const uint8_t *x_fp8, const void *scales, size_t scale_bytes) {
  pack_meta(l, row, token, ordinal, lids, weights);
  uint8_t *payload = row + l->meta_bytes;
  memcpy(payload, x_fp8, (size_t)l->hidden);
  memcpy(payload + l->hidden, scales, scale_bytes);
}

int32_t mep_row_token(const uint8_t *row) { return ((const int32_t *)row)[0]; }
int32_t mep_row_ordinal(const uint8_t *row) { return ((const int32_t *)row)[1]; }
const int32_t *mep_row_lids(const uint8_t *row) {
  return (const int32_t *)row + META_HEAD;
}
const float *mep_row_weights(const mep_row_layout_t *l, const uint8_t *row) {
  return (const float *)((const int32_t *)row + META_HEAD + l->top_k);
}
const uint8_t *mep_row_payload(const mep_row_layout_t *l, const uint8_t *row) {
  return row + l->meta_bytes;
}

/* Copies a row's token bytes (bf16 or e4m3) to recv_x_row; returns its fp8
 * scale area, or NULL for a bf16 row. */
static const uint8_t *unpack_x(const mep_row_layout_t *l, const uint8_t *row,
                               void *recv_x_row) {
  const uint8_t *payload = mep_row_payload(l, row);
  memcpy(recv_x_row, payload, (size_t)l->hidden * (l->fp8 ? 1u : 2u));
  return l->fp8 ? payload + l->hidden : NULL;
}

void mep_row_unpack_ll(const mep_row_layout_t *l, const uint8_t *row,
                       void *recv_x_row, void *recv_scales_row,
                       int packed_scales) {
  const uint8_t *scale_area = unpack_x(l, row, recv_x_row);
  if (scale_area == NULL) return;
  int groups = l->hidden / MEP_HIDDEN_ALIGN;
  const float *scales = (const float *)scale_area;
  if (!packed_scales) {
    memcpy(recv_scales_row, scales, (size_t)groups * 4u);
    return;
  }
  /* UE8M0 packed: group g's exponent byte goes to byte g%4 of word g/4. */
  int words = (groups + 3) / 4;
  uint32_t *out = (uint32_t *)recv_scales_row;
  for (int w = 0; w < words; w++) out[w] = 0;
  for (int g = 0; g < groups; g++) {
    out[g / 4] |= (uint32_t)mep_ue8m0_code(scales[g]) << (8 * (g % 4));
  }
}

void mep_row_unpack_ht(const mep_row_layout_t *l, const uint8_t *row,
                       void *recv_x_row, void *recv_scales_row,
                       size_t scale_bytes) {
  const uint8_t *scale_area = unpack_x(l, row, recv_x_row);
  if (scale_area != NULL) memcpy(recv_scales_row, scale_area, scale_bytes);
}
