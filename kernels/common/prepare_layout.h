/* prepare_layout.h: the launcher of prepare's layout kernel, which both
 * modes share. Plain C: the runtime includes this, never the CUDA C++ behind
 * it. */
#ifndef MEP_PREPARE_LAYOUT_H_
#define MEP_PREPARE_LAYOUT_H_

#include <stdint.h>

#include "kernels/common/kernels_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* prepare's optional layout outputs (prepare_layout.cu), from the
 * device topk_idx. Experts live on ranks in contiguous blocks of
 * num_experts / world; a topk_idx value outside -1..num_experts-1 counts
 * as -1 (dispatch drops such a slot). Any output may be NULL (skipped). */
typedef struct mep_prepare_layout_args {
  const void *topk_idx;   /* [T, K] int32 or int64, -1 = no expert */
  int32_t topk_idx_bytes; /* 4 or 8 */
  int32_t num_tokens;     /* T, may be 0 (the counts are then zeroed) */
  int32_t top_k;          /* K */
  int32_t num_experts;    /* E */
  int32_t world;          /* R */
  int32_t reserved0;
  int32_t *num_tokens_per_rank;   /* [R]: tokens with >= 1 expert on rank r */
  int32_t *num_tokens_per_expert; /* [E]: (token, k) slots naming expert e */
  uint8_t *is_token_in_rank;      /* [T, R]: 1 when token t has an expert on r */
} mep_prepare_layout_args_t;

/* One single-block kernel on `stream`: no host sync, no allocation, so it
 * may be captured in a CUDA graph. Deterministic (integer counts). */
mep_kstatus_t mep_prepare_layout(const mep_prepare_layout_args_t *args, void *stream);

/* Loads mep_prepare_layout's kernels on the current device (both index
 * widths) before their first launch, whose load would wait for the
 * device's running work (kernels/ll/ll.h, mep_ll_load). */
mep_kstatus_t mep_prepare_layout_load(void);

#ifdef __cplusplus
}
#endif

#endif /* MEP_PREPARE_LAYOUT_H_ */
