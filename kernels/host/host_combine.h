/* host_combine.h: the host backend's combine reductions, in plain C, in
 * the summation order README documents ("Routing weights may be given to
 * the LL dispatch"): bit for bit what the GPU kernels compute (one fmaf per
 * term, f32 sums from +0, bf16 rounded to nearest even). */
#ifndef MEP_HOST_COMBINE_H_
#define MEP_HOST_COMBINE_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* LL, wherever the weights were given: per rank a bf16 partial of its
 * slots (fmaf in k order, from +0), the partials added in f32 from +0 in
 * the order their ranks first appear among the token's slots (k
 * ascending), bf16 once.
 * rows[k] NULL for skipped slots; rank[k] is slot k's rank (read only where
 * rows[k] is set). top_k <= MEP_MAX_TOP_K. */
void mep_combine_partials(uint16_t *out, const uint16_t *const *rows,
                          const float *w, const int32_t *rank, int top_k,
                          int hidden);

/* HT: rows[j] from rank rank[j], ranks ascending. out[h] = bf16(acc):
 * per node of node_ranks consecutive ranks (0: one node), the node's rows
 * summed in f32 from +0, and acc the nodes' sums added in f32 from +0,
 * nodes ascending. With one node, or nodes of one rank, that is the plain
 * ascending sum. */
void mep_combine_sum(uint16_t *out, const uint16_t *const *rows,
                     const int32_t *rank, int n, int node_ranks, int hidden);

#ifdef __cplusplus
}
#endif

#endif /* MEP_HOST_COMBINE_H_ */
