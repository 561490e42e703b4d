/* host_slots.h: the host backend's per-handle record of a dispatch's
 * receive (where every received slot came from), which routes the combine
 * and answers handle_layout. One malloc block, owned by the handle. */
#ifndef MEP_HOST_SLOTS_H_
#define MEP_HOST_SLOTS_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Every received slot: (source rank, token, k) for LL, grouped by local
 * expert and in slot order within each; (source rank, token, ordinal among
 * the token's ranks) for HT, in row order. */
typedef struct slot_table {
  int32_t set;  /* buffer set and operation number of the dispatch */
  uint64_t seq;
  int64_t n;
  int32_t num_experts;
  int32_t *expert_start; /* [E_l + 1], LL */
  int32_t (*rec)[3];
} slot_table_t;

/* A table for n slots and `experts` local experts (free() releases it), or
 * NULL when out of memory. */
slot_table_t *mep_slot_table_new(int64_t n, int experts);

/* An LL table's layout in DeepEP's form: src_info [E_l, slots] int32 (the
 * source token of each slot, -1 past the expert's count) and layout_range
 * [E_l, world] int64 (begin << 32 | count per source rank). Slots are in
 * source-rank order, so each source's are one range. Either may be NULL. */
void mep_slot_table_layout(const slot_table_t *tab, int world, int64_t slots,
                           int32_t *src_info, int64_t *layout_range);

#ifdef __cplusplus
}
#endif

#endif /* MEP_HOST_SLOTS_H_ */
