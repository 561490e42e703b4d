/* host_combine.c: the combine reductions of host_combine.h. Every product
 * is added with fmaf (one rounding), as the kernels' fmaf does; the build
 * also turns contraction off, so no other expression here becomes an FMA. */
#include "kernels/host/host_combine.h"

#include <math.h>
#include <stddef.h>

#include "kernels/common/limits.h"
#include "kernels/host/host_numeric.h"

void mep_combine_partials(uint16_t *out, const uint16_t *const *rows,
                          const float *w, const int32_t *rank, int top_k,
                          int hidden) {
  /* The token's slots grouped by rank, groups in first-appearance order,
   * k ascending within a group: slot[group_start[g] .. group_start[g+1]). */
  int slot[MEP_MAX_TOP_K], group_start[MEP_MAX_TOP_K + 1], groups = 0, n = 0;
  for (int k = 0; k < top_k; k++) {
    if (rows[k] == NULL) continue;
    int first = 1;
    for (int j = 0; j < k && first; j++) first = rows[j] == NULL || rank[j] != rank[k];
    if (!first) continue;
    group_start[groups++] = n;
    for (int j = k; j < top_k; j++) {
      if (rows[j] != NULL && rank[j] == rank[k]) slot[n++] = j;
    }
  }
  group_start[groups] = n;
  for (int h = 0; h < hidden; h++) {
    float acc = 0.0f;
    for (int g = 0; g < groups; g++) {
      float part = 0.0f;
      for (int i = group_start[g]; i < group_start[g + 1]; i++) {
        part = fmaf(w[slot[i]], mep_bf16_to_f32(rows[slot[i]][h]), part);
      }
      acc += mep_bf16_to_f32(mep_f32_to_bf16(part));
    }
    out[h] = mep_f32_to_bf16(acc);
  }
}

void mep_combine_sum(uint16_t *out, const uint16_t *const *rows,
                     const int32_t *rank, int n, int node_ranks, int hidden) {
  for (int h = 0; h < hidden; h++) {
    float acc = 0.0f;
    for (int j = 0; j < n;) {
      const int32_t node = node_ranks > 0 ? rank[j] / node_ranks : 0;
      float part = 0.0f;
      for (; j < n && (node_ranks > 0 ? rank[j] / node_ranks : 0) == node; j++)
        part += mep_bf16_to_f32(rows[j][h]);
      acc += part;
    }
    out[h] = mep_f32_to_bf16(acc);
  }
}
