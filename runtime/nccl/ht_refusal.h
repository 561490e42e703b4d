/* ht_refusal.h: the sentences of an HT dispatch whose sources' rows are
 * laid out otherwise than its own call's (another hidden, top_k or row
 * format), from the row descriptions the count words carry
 * (kernels/ht/ht_layout.h). No CUDA: CPU-tested. */
#ifndef MEP_HT_REFUSAL_H_
#define MEP_HT_REFUSAL_H_

#include <stddef.h>
#include <stdint.h>

#include "moe_ep.h"

#ifdef __cplusplus
extern "C" {
#endif

/* "hidden=H, top_k=K, bf16 rows" or "... fp8 rows with W scale words". */
void mep_ht_desc_text(uint32_t desc, char *out, size_t len);

/* A dispatch without worst-case rows whose kernel reported the refusal
 * `num_recv` (mep_ht_refused_recv; this rank's call is described by
 * `mine`): INVALID_ARGUMENT naming both ranks and both descriptions. The
 * rows were drained unwritten, every rank refuses alike, and the group
 * stays usable. */
moe_ep_status_t mep_ht_refused_error(int32_t rank, int64_t num_recv, uint32_t mine);

/* The same found by a dispatch with worst-case rows (no host sync learns
 * of it, so the kernel recorded it): MISMATCH, the group fails. */
moe_ep_status_t mep_ht_row_desc_fatal(int32_t rank, int32_t peer, uint32_t mine,
                                      uint32_t theirs);

#ifdef __cplusplus
}
#endif

#endif /* MEP_HT_REFUSAL_H_ */
