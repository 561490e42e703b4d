/* host_layout.h: where everything lives in a rank's registered region:
 * per buffer set, the signal words, per-source row counts, the dispatch
 * rows (one slot per source rank and token) and the combine rows (flags
 * and rows of the combine in two halves). The same
 * function computes the exact byte count for buffer_size_hint. */
#ifndef MEP_HOST_LAYOUT_H_
#define MEP_HOST_LAYOUT_H_

#include <stddef.h>
#include <stdint.h>

#include "moe_ep.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mep_host_layout {
  int world;
  int nsets;
  size_t row_max;       /* largest dispatch row */
  size_t combine_rows;  /* rows of the combine area per set */
  size_t combine_row_bytes;
  size_t set_bytes;
  /* offsets inside one set */
  size_t dispatch_flags, dispatch_counts, combine_flags, combine_dispatches, dispatch_refusals,
      combine_refusals, dispatch_reads, dispatch_rows, combine_area;
} mep_host_layout_t;

void mep_host_layout_init(mep_host_layout_t *l, const moe_ep_config_t *cfg,
                          int world);
size_t mep_host_layout_bytes(const mep_host_layout_t *l);

/* Which half of its set's combine flags and rows the operation `seq` uses:
 * its ordinal among the operations on its set, mod 2. A rank makes an
 * operation on a set only once its receive of the set's previous one has
 * run, and a peer's operation two further on the set needs this rank's
 * send of the one in between; so a peer's combine never lands in the half
 * of a combine this rank has still to receive (its hook run after the
 * next dispatch, on the other set: two-batch overlap's order). */
int mep_host_combine_half(const mep_host_layout_t *l, uint64_t seq);

/* A source's count entry of a dispatch: its count word (row description
 * << 32 | rows) and the prepare number of its call (HT), 8 bytes each. */
#define MEP_HOST_COUNT_BYTES 16u

/* Byte offsets in the region of set `set`. */
size_t mep_host_off_dispatch_flag(const mep_host_layout_t *l, int set, int src);
size_t mep_host_off_dispatch_count(const mep_host_layout_t *l, int set, int src);
size_t mep_host_off_combine_flag(const mep_host_layout_t *l, int set, int half, int src);
/* Which dispatch (its seq + 1) src's combine in this half returns the rows
 * of, signalled before its flag: a receive checks that every rank combined
 * the same layer call. */
size_t mep_host_off_combine_dispatch(const mep_host_layout_t *l, int set, int half, int src);
/* The operation (seq + 1) of this kind (combine: 1) that src refused in
 * this set, signalled in place of that operation's flag (host_backend.c:
 * host_op_refused); one word per kind, as the flags are. */
size_t mep_host_off_refusal(const mep_host_layout_t *l, int set, int combine, int src);
/* The dispatch (seq + 1) of this rank's that src has finished reading in
 * this set (or will not read: it abandoned that receive): this rank's next
 * dispatch into the set waits for it (host_backend.c: wait_read). */
size_t mep_host_off_dispatch_read(const mep_host_layout_t *l, int set, int src);
size_t mep_host_off_dispatch_row(const mep_host_layout_t *l, int set, int src,
                                 int max_tokens, int row, size_t row_bytes);
size_t mep_host_off_combine_row(const mep_host_layout_t *l, int set, int half, size_t row);

#ifdef __cplusplus
}
#endif

#endif /* MEP_HOST_LAYOUT_H_ */
