/* ht_refusal.c: see ht_refusal.h. */
#include "runtime/nccl/ht_refusal.h"

#include <stdio.h>

#include "kernels/ht/ht_layout.h"
#include "runtime/error.h"

void mep_ht_desc_text(uint32_t desc, char *out, size_t len) {
  if (mep_ht_desc_fp8(desc)) {
    snprintf(out, len, "hidden=%d, top_k=%d, fp8 rows with %d scale words",
             mep_ht_desc_hidden(desc), mep_ht_desc_top_k(desc), mep_ht_desc_scale_words(desc));
  } else {
    snprintf(out, len, "hidden=%d, top_k=%d, bf16 rows", mep_ht_desc_hidden(desc),
             mep_ht_desc_top_k(desc));
  }
}

static const char kSameRows[] =
    "every rank must make a call with the same hidden, top_k and row format (bf16, or fp8 with "
    "the same scale format)";

moe_ep_status_t mep_ht_refused_error(int32_t rank, int64_t num_recv, uint32_t mine) {
  char a[96], b[96];
  mep_ht_desc_text(mep_ht_refused_desc(num_recv), a, sizeof a);
  mep_ht_desc_text(mine, b, sizeof b);
  return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                   "dispatch on rank %d: rank %d made this call with %s, this rank with %s; %s. "
                   "The rows were dropped unread; every rank refuses this call alike (each has "
                   "a source that differs from it), the group stays usable, and every rank must "
                   "skip this layer call's combine",
                   rank, mep_ht_refused_source(num_recv), a, b, kSameRows);
}

moe_ep_status_t mep_ht_row_desc_fatal(int32_t rank, int32_t peer, uint32_t mine,
                                      uint32_t theirs) {
  char a[96], b[96];
  mep_ht_desc_text(theirs, a, sizeof a);
  mep_ht_desc_text(mine, b, sizeof b);
  return mep_error(MOE_EP_ERR_MISMATCH,
                   "an HT dispatch kernel on rank %d found that rank %d made this call with %s, "
                   "this rank with %s; %s. With MOE_EP_FLAG_WORST_CASE no host sync can refuse "
                   "the call, so the rows were dropped unread and every row marked empty; "
                   "destroy the group",
                   rank, peer, a, b, kSameRows);
}
