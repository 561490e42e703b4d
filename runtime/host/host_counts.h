/* host_counts.h: HT prepare's count table on the host backend, as the
 * bootstrap's allgather returns it to every rank: row s is rank s's tokens
 * per destination rank, or its refusal of the prepare. The rows come from
 * other processes, so every entry is checked before any is summed, and
 * every rank, reading the same table, reaches the same verdict. */
#ifndef MEP_HOST_COUNTS_H_
#define MEP_HOST_COUNTS_H_

#include <stdint.h>

#include "moe_ep.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A refusing rank's row: this value in every entry. */
#define MEP_HOST_REFUSED_COUNT (-1)

/* Reads the world x world table `all` for `rank`, whose group allows
 * `max_tokens` tokens per rank. MOE_EP_OK with *num_recv the rows `rank`
 * will receive; INVALID_ARGUMENT naming the first rank that refused its
 * prepare (the group stays usable); INTERNAL naming the first rank with an
 * entry outside [0, max_tokens] (a corrupt or mismatched peer: the group
 * fails). Sources are taken in rank order, the first verdict wins. */
moe_ep_status_t mep_host_count_table_read(const int32_t *all, int world, int rank,
                                          int max_tokens, int64_t *num_recv);

#ifdef __cplusplus
}
#endif

#endif /* MEP_HOST_COUNTS_H_ */
