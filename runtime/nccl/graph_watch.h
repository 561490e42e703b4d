/* graph_watch.h: which CUDA graphs hold a group's calls. Each graph
 * capture a call of the group is queued into is tied to the group's watch
 * by a CUDA user object that the graph (and every executable graph made
 * from it) holds; CUDA releases it once the graph and those are destroyed
 * (and their launches done). group_destroy asks the watch whether any are
 * left: their launches would use the group's memory, so it stays allocated
 * while they may run (nccl_common.h, mep_nccl_graphs_alive). */
#ifndef MOE_EP_RUNTIME_NCCL_GRAPH_WATCH_H_
#define MOE_EP_RUNTIME_NCCL_GRAPH_WATCH_H_

#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mep_graph_watch mep_graph_watch_t; /* opaque */

/* NULL when out of memory. */
mep_graph_watch_t *mep_graph_watch_create(void);
/* The group's reference; the watch lives on while graphs hold it. Accepts
 * NULL. */
void mep_graph_watch_drop(mep_graph_watch_t *w);

/* Ties the capture `capture` (its id; 0: eager, nothing to do) that
 * `stream` is in to w, once per capture. A CUDA error leaves nothing tied
 * and queued; the caller refuses the call. */
cudaError_t mep_graph_watch_note(mep_graph_watch_t *w, cudaStream_t stream,
                                 unsigned long long capture);

/* The captures and graphs tied to w that CUDA has not released, after
 * waiting up to grace_ms for the count to reach 0: CUDA runs the release of
 * a destroyed graph on a thread of its own, shortly after the destroy. */
int64_t mep_graph_watch_live(mep_graph_watch_t *w, int grace_ms);

#ifdef __cplusplus
}
#endif

#endif /* MOE_EP_RUNTIME_NCCL_GRAPH_WATCH_H_ */
