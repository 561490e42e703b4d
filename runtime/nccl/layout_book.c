/* layout_book.c: see layout_book.h. */
#include "runtime/nccl/layout_book.h"

#include "runtime/error.h"

static int set_in_range(int32_t set) { return set >= 0 && set < MEP_NUM_BUFFER_SETS; }

moe_ep_status_t mep_layout_book_record(mep_layout_book_t *book, int32_t set, uint64_t seq,
                                       moe_ep_status_t launch) {
  if (launch == MOE_EP_OK && set_in_range(set)) book->held[set] = seq + 1;
  return launch;
}

moe_ep_status_t mep_layout_book_check(const mep_layout_book_t *book, const char *entry,
                                      int32_t rank, int32_t set, uint64_t seq) {
  if (!set_in_range(set)) {
    return mep_error(MOE_EP_ERR_INTERNAL, "%s on rank %d: the handle names buffer set %d; there are %d",
                     entry, rank, set, MEP_NUM_BUFFER_SETS);
  }
  if (book->held[set] == seq + 1) return MOE_EP_OK;
  if (book->held[set] == 0) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "%s on rank %d: buffer set %d holds no dispatch layout, but this "
                     "handle's dispatch (operation %llu) used it",
                     entry, rank, set, (unsigned long long)seq);
  }
  return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                   "%s on rank %d: the layout of this handle's dispatch (operation %llu, "
                   "buffer set %d) was overwritten by a later dispatch on the same "
                   "set (operation %llu); sets alternate per operation, dispatch or "
                   "combine, so a handle's layout lasts until the dispatch after next "
                   "when dispatches follow each other, and until the next dispatch when "
                   "a combine comes between",
                   entry, rank, (unsigned long long)seq, set,
                   (unsigned long long)(book->held[set] - 1));
}
