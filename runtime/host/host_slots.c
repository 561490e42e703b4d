/* host_slots.c: the per-handle slot table (see host_slots.h). */
#include "runtime/host/host_slots.h"

#include <stdlib.h>

slot_table_t *mep_slot_table_new(int64_t n, int experts) {
  size_t bytes = sizeof(slot_table_t) + (size_t)(experts + 1) * 4u + (size_t)n * 12u + 16u;
  slot_table_t *st = malloc(bytes);
  if (st == NULL) return NULL;
  st->n = n;
  st->num_experts = experts;
  st->expert_start = (int32_t *)(st + 1);
  uintptr_t rec = (uintptr_t)(st->expert_start + experts + 1);
  st->rec = (int32_t(*)[3])((rec + 15u) & ~(uintptr_t)15u);
  return st;
}

void mep_slot_table_layout(const slot_table_t *tab, int world, int64_t slots,
                           int32_t *src_info, int64_t *layout_range) {
  for (int e = 0; e < tab->num_experts; e++) {
    int32_t first = tab->expert_start[e], count = tab->expert_start[e + 1] - first;
    for (int64_t i = 0; src_info != NULL && i < slots; i++) {
      src_info[e * slots + i] = i < count ? tab->rec[first + i][1] : -1;
    }
    if (layout_range == NULL) continue;
    int64_t *range = layout_range + (size_t)e * (size_t)world;
    int32_t i = 0, begin = 0;
    for (int s = 0; s < world; s++) {
      while (i < count && tab->rec[first + i][0] == s) i++;
      range[s] = ((int64_t)begin << 32) | (int64_t)(i - begin);
      begin = i;
    }
  }
}
