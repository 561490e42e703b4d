/* host_rows.h: the host backend's wire row: one token sent once to one
 * destination rank, with the destination's local expert ids for each top-k
 * slot, its weights (HT), and its payload (bf16, or fp8 + per-128 scales).
 * Pure per-rank compute; the transport lives in runtime/host/. */
#ifndef MEP_HOST_ROWS_H_
#define MEP_HOST_ROWS_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mep_row_layout {
  int32_t hidden;
  int32_t top_k;
  int32_t fp8;        /* payload is e4m3 + f32 scales */
  int32_t scale_pow2; /* UE8M0 rounding of the scales */
  size_t meta_bytes;  /* token, ordinal, lid[K], w[K]; 16-byte multiple */
  size_t payload_bytes;
  size_t row_bytes;
} mep_row_layout_t;

void mep_row_layout_init(mep_row_layout_t *l, int hidden, int top_k, int fp8,
                         int scale_pow2);
/* Bytes of the largest row any layer of the group can produce. */
size_t mep_row_bytes_max(int hidden, int top_k, int fp8);

/* Writes one row. lids[k] = local expert id on the destination or -1;
 * weights may be NULL (LL). x is the token's bf16 row of `hidden`; with
 * l->fp8 it is quantised here (LL). */
void mep_row_pack(const mep_row_layout_t *l, uint8_t *row, int32_t token,
                  int32_t ordinal, const int32_t *lids, const float *weights,
                  const uint16_t *x);
/* Writes one row of an fp8 layout from an already quantised token (HT):
 * `hidden` e4m3 bytes and `scale_bytes` bytes of scales (f32 per group, or
 * packed UE8M0 words), both copied verbatim. scale_bytes <= hidden/128 * 4,
 * so the row fits l->row_bytes. */
void mep_row_pack_fp8(const mep_row_layout_t *l, uint8_t *row, int32_t token,
                      int32_t ordinal, const int32_t *lids, const float *weights,
                      const uint8_t *x_fp8, const void *scales, size_t scale_bytes);

int32_t mep_row_token(const uint8_t *row);
int32_t mep_row_ordinal(const uint8_t *row);
const int32_t *mep_row_lids(const uint8_t *row);
const float *mep_row_weights(const mep_row_layout_t *l, const uint8_t *row);
const uint8_t *mep_row_payload(const mep_row_layout_t *l, const uint8_t *row);

/* Copies a row's payload into an LL receive slot: bf16 -> recv_x row;
 * fp8 -> recv_x row + scales (f32 [groups] or packed UE8M0 int32
 * [(groups+3)/4] when packed_scales). */
void mep_row_unpack_ll(const mep_row_layout_t *l, const uint8_t *row,
                       void *recv_x_row, void *recv_scales_row,
                       int packed_scales);
/* Copies a row's payload into an HT receive row, verbatim: bf16 -> recv_x
 * row; fp8 -> `hidden` bytes to recv_x and the first scale_bytes bytes of
 * the scale area (as mep_row_pack_fp8 wrote them) to recv_scales. */
void mep_row_unpack_ht(const mep_row_layout_t *l, const uint8_t *row,
                       void *recv_x_row, void *recv_scales_row,
                       size_t scale_bytes);

#ifdef __cplusplus
}
#endif

#endif /* MEP_HOST_ROWS_H_ */
