/* row_shape.c: see row_shape.h. */
#include "runtime/nccl/row_shape.h"

#include <stdio.h>

#include "kernels/common/kernels_types.h"
#include "kernels/common/row_desc.h"
#include "kernels/ht/ht_layout.h"
#include "runtime/error.h"

void mep_row_desc_text(uint32_t desc, char *out, size_t len) {
  const int mode = mep_row_desc_scale_mode(desc);
  if (mode < 0) {
    snprintf(out, len, "hidden=%d, top_k=%d, bf16 rows", mep_row_desc_hidden(desc),
             mep_row_desc_top_k(desc));
    return;
  }
  snprintf(out, len, "hidden=%d, top_k=%d, fp8 rows with %s scales", mep_row_desc_hidden(desc),
           mep_row_desc_top_k(desc),
           mode == MEP_FP8_SCALE_F32     ? "f32"
           : mode == MEP_FP8_SCALE_UE8M0 ? "power-of-two (UE8M0 in f32)"
                                         : "packed UE8M0");
}

static const char kSameRows[] =
    "every rank must make a call with the same hidden, top_k and row format (bf16, or fp8 with "
    "the same scale format)";

moe_ep_status_t mep_ht_refused_error(int32_t rank, int64_t num_recv, uint32_t mine) {
  char a[96], b[96];
  mep_row_desc_text(mep_ht_refused_desc(num_recv), a, sizeof a);
  mep_row_desc_text(mine, b, sizeof b);
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
  mep_row_desc_text(theirs, a, sizeof a);
  mep_row_desc_text(mine, b, sizeof b);
  return mep_error(MOE_EP_ERR_MISMATCH,
                   "an HT dispatch kernel on rank %d found that rank %d made this call with %s, "
                   "this rank with %s; %s. A rank made the call with MOE_EP_FLAG_WORST_CASE, "
                   "where no host sync can refuse it, so every rank dropped the rows unread "
                   "(worst-case rows marked empty); destroy the group",
                   rank, peer, a, b, kSameRows);
}

moe_ep_status_t mep_ll_row_desc_fatal(int32_t rank, int32_t peer, int32_t buffer_set,
                                      uint32_t mine, uint32_t theirs) {
  char a[96], b[96];
  mep_row_desc_text(theirs, a, sizeof a);
  mep_row_desc_text(mine, b, sizeof b);
  return mep_error(MOE_EP_ERR_MISMATCH,
                   "a dispatch receive on rank %d (buffer set %d) found that rank %d made this "
                   "call with %s, this rank with %s; %s. None of that rank's rows was copied; "
                   "destroy the group",
                   rank, buffer_set, peer, a, b, kSameRows);
}
