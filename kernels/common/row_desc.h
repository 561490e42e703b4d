/* row_desc.h: a dispatch call's row layout in 20 bits. A receiver reads a
 * source's rows (and, in LL, its slot words) with its own call's hidden,
 * top_k and row format, so every source tells its receivers how it made the
 * call: HT in its count words, LL in its slot-list heads; a receiver whose
 * own call differs refuses instead of reading. Exact: hidden / 8 - 1 (12
 * bits), top_k - 1 (5), and the format (3): 0 bf16, else fp8 with scale
 * mode MEP_FP8_SCALE_* + 1. Plain C (the runtime writes the sentences). */
#ifndef MEP_ROW_DESC_H_
#define MEP_ROW_DESC_H_

#include <stdint.h>

#include "kernels/common/kernels_types.h"
#include "kernels/common/limits.h"

#ifdef __CUDACC__
#define MEP_RD_HD __host__ __device__
#else
#define MEP_RD_HD
#endif

#define MEP_ROW_DESC_BITS 20

static inline MEP_RD_HD uint32_t mep_row_desc(int hidden, int top_k, int fp8, int scale_mode) {
  return (uint32_t)(hidden / 8 - 1) | (uint32_t)(top_k - 1) << 12 |
         (fp8 ? (uint32_t)(scale_mode + 1) : 0u) << 17;
}
static inline MEP_RD_HD int mep_row_desc_hidden(uint32_t d) { return (int)((d & 0xfffu) + 1u) * 8; }
static inline MEP_RD_HD int mep_row_desc_top_k(uint32_t d) { return (int)((d >> 12 & 0x1fu) + 1u); }
/* -1 for bf16 rows; else the fp8 scale mode (MEP_FP8_SCALE_*). */
static inline MEP_RD_HD int mep_row_desc_scale_mode(uint32_t d) { return (int)(d >> 17 & 7u) - 1; }

/* The 4-byte scale words of one fp8 row of scale mode `mode` (-1: bf16,
 * none): one f32 per 128 channels, four UE8M0 exponents per word when
 * packed, or one f32 for the whole row. */
static inline MEP_RD_HD int mep_fp8_scale_words(int hidden, int mode) {
  return mode < 0                              ? 0
         : mode == MEP_FP8_SCALE_PER_TOKEN     ? 1
         : mode == MEP_FP8_SCALE_UE8M0_PACKED  ? (hidden / 128 + 3) / 4
                                               : hidden / 128;
}

#ifdef __cplusplus
static_assert(MEP_MAX_HIDDEN / 8 <= 4096 && MEP_MAX_TOP_K <= 32 && MEP_FP8_SCALE_PER_TOKEN < 7,
              "a row description holds hidden / 8 - 1 in 12 bits, top_k - 1 in 5, the format in 3");
#else
_Static_assert(MEP_MAX_HIDDEN / 8 <= 4096 && MEP_MAX_TOP_K <= 32 && MEP_FP8_SCALE_PER_TOKEN < 7,
               "a row description holds hidden / 8 - 1 in 12 bits, top_k - 1 in 5, the format in 3");
#endif

#endif /* MEP_ROW_DESC_H_ */
