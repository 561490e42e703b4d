/* row_shape.h: the sentences of a dispatch whose sources made the call
 * with rows laid out otherwise than this rank's (another hidden, top_k or
 * row format), from the row descriptions (kernels/common/row_desc.h) that
 * the HT count words and the LL slot-list heads carry (as
 * runtime/row_desc_text.h names them). No CUDA: CPU-tested. */
#ifndef MEP_ROW_SHAPE_H_
#define MEP_ROW_SHAPE_H_

#include <stdint.h>

#include "moe_ep.h"

#ifdef __cplusplus
extern "C" {
#endif

/* An HT dispatch whose kernel reported the refusal `num_recv`
 * (mep_ht_refused_recv; this rank's call is described by `mine`):
 * INVALID_ARGUMENT naming both ranks and both calls. The rows were drained
 * unwritten, every rank refuses alike, and the group stays usable. */
moe_ep_status_t mep_ht_refused_error(int32_t rank, int64_t num_recv, uint32_t mine);

/* The same where some rank's call had worst-case rows (no host sync learns
 * of it there, so every rank's kernel recorded it): MISMATCH, the group
 * fails. */
moe_ep_status_t mep_ht_row_desc_fatal(int32_t rank, int32_t peer, uint32_t mine,
                                      uint32_t theirs);

/* An LL dispatch receive that found the difference (MEP_LL_OP_ROW_DESC):
 * MISMATCH, the group fails (LL signals cannot be taken back). */
moe_ep_status_t mep_ll_row_desc_fatal(int32_t rank, int32_t peer, int32_t buffer_set,
                                      uint32_t mine, uint32_t theirs);

#ifdef __cplusplus
}
#endif

#endif /* MEP_ROW_SHAPE_H_ */
