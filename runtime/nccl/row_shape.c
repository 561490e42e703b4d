/* row_shape.c: see row_shape.h. */
#include "runtime/nccl/row_shape.h"

#include "kernels/ht/ht_layout.h"
#include "runtime/error.h"
#include "runtime/row_desc_text.h"

static const char kSameRows[] =
    "every rank must make a call with the same hidden, top_k and row format (bf16, or fp8 with "
    "the same scale format)";

/* Both calls' descriptions, as the sentences name them. */
typedef struct row_texts {
  char theirs[96], mine[96];
} row_texts_t;

static row_texts_t row_texts(uint32_t theirs, uint32_t mine) {
  row_texts_t t;
  mep_row_desc_text(theirs, t.theirs, sizeof t.theirs);
  mep_row_desc_text(mine, t.mine, sizeof t.mine);
  return t;
}

moe_ep_status_t mep_ht_refused_error(int32_t rank, int64_t num_recv, uint32_t mine) {
  const row_texts_t t = row_texts(mep_ht_refused_desc(num_recv), mine);
  return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                   "dispatch on rank %d: rank %d made this call with %s, this rank with %s; %s. "
                   "The rows were dropped unread; every rank refuses this call alike (each has "
                   "a source that differs from it), the group stays usable, and every rank must "
                   "skip this layer call's combine",
                   rank, mep_ht_refused_source(num_recv), t.theirs, t.mine, kSameRows);
}

moe_ep_status_t mep_ht_row_desc_fatal(int32_t rank, int32_t peer, uint32_t mine,
                                      uint32_t theirs) {
  const row_texts_t t = row_texts(theirs, mine);
  return mep_error(MOE_EP_ERR_MISMATCH,
                   "an HT dispatch kernel on rank %d found that rank %d made this call with %s, "
                   "this rank with %s; %s. A rank made the call with MOE_EP_FLAG_WORST_CASE, "
                   "where no host sync can refuse it, so every rank dropped the rows unread "
                   "(worst-case rows marked empty); destroy the group",
                   rank, peer, t.theirs, t.mine, kSameRows);
}

moe_ep_status_t mep_ll_row_desc_fatal(int32_t rank, int32_t peer, int32_t buffer_set,
                                      uint32_t mine, uint32_t theirs) {
  const row_texts_t t = row_texts(theirs, mine);
  return mep_error(MOE_EP_ERR_MISMATCH,
                   "a dispatch receive on rank %d (buffer set %d) found that rank %d made this "
                   "call with %s, this rank with %s; %s. None of that rank's rows was copied; "
                   "destroy the group",
                   rank, buffer_set, peer, t.theirs, t.mine, kSameRows);
}
