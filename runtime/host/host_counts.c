/* host_counts.c: see host_counts.h. */
#include "runtime/host/host_counts.h"

#include "runtime/error.h"

/* A refusal fills its row; a row with -1 elsewhere too is corrupt. */
static int is_refusal(const int32_t *row, int world) {
  for (int d = 0; d < world; d++) {
    if (row[d] != MEP_HOST_REFUSED_COUNT) return 0;
  }
  return 1;
}

moe_ep_status_t mep_host_count_table_read(const int32_t *all, int world, int rank,
                                          int max_tokens, int64_t *num_recv) {
  int64_t sum = 0;
  for (int s = 0; s < world; s++) {
    const int32_t *row = all + (size_t)s * (size_t)world;
    if (is_refusal(row, world)) {
      return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                       "prepare on rank %d: rank %d refused its own prepare of this layer call "
                       "(its error says why), so the count exchange has nothing from it; "
                       "the group stays usable",
                       rank, s);
    }
    /* The whole row, not only this rank's entry: every rank then fails on
     * the same entry, whichever rank it names. */
    for (int d = 0; d < world; d++) {
      if (row[d] < 0 || row[d] > max_tokens) {
        return mep_error(MOE_EP_ERR_INTERNAL,
                         "prepare on rank %d: rank %d announced %d tokens for rank %d, outside "
                         "[0, max_tokens_per_rank=%d] (corrupt or mismatched peer)",
                         rank, s, row[d], d, max_tokens);
      }
    }
    sum += row[rank];
  }
  *num_recv = sum;
  return MOE_EP_OK;
}
