/* layout_book.h: which dispatch's routing layout each buffer set's handle
 * storage holds (nccl backend). A dispatch takes over its set's storage
 * only when its launch was accepted, so a refused dispatch leaves the older
 * handle on that set combinable; combine checks that its handle's dispatch
 * is still the one held. Pure bookkeeping: no CUDA, no group. */
#ifndef MEP_LAYOUT_BOOK_H_
#define MEP_LAYOUT_BOOK_H_

#include <stdint.h>

#include "kernels/common/limits.h"
#include "moe_ep.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Zero-initialised: no set holds a layout. */
typedef struct mep_layout_book {
  uint64_t held[MEP_NUM_BUFFER_SETS]; /* operation number + 1; 0 = none */
} mep_layout_book_t;

/* Records that buffer set `set` holds dispatch `seq`'s layout, but only when
 * `launch` (the status of that dispatch's launch) is MOE_EP_OK; returns
 * `launch` unchanged. Taking the status, not a flag, keeps the launch
 * ahead of the record at every call site. */
moe_ep_status_t mep_layout_book_record(mep_layout_book_t *book, int32_t set, uint64_t seq,
                                       moe_ep_status_t launch);

/* MOE_EP_OK when `set` still holds dispatch `seq`'s layout; otherwise
 * INVALID_ARGUMENT with a sentence naming `entry` (the call that needs the
 * layout: combine, handle_layout), `rank`, both operations and the set. */
moe_ep_status_t mep_layout_book_check(const mep_layout_book_t *book, const char *entry,
                                      int32_t rank, int32_t set, uint64_t seq);

#ifdef __cplusplus
}
#endif

#endif /* MEP_LAYOUT_BOOK_H_ */
