/* ucx_quiet.h: UCX's own log lines from the library's UCX progress go to
 * the library's logger, not stderr. UCX writes a warning to stderr for
 * every active message whose id no handler took, and lines for
 * connections that fail; anyone who reaches a worker's port can cause
 * them, and nothing may print from library code. Outside the library's
 * progress (the engine's own UCX use), UCX's lines go where they went. */
#ifndef MOE_EP_RUNTIME_UCX_QUIET_H_
#define MOE_EP_RUNTIME_UCX_QUIET_H_

#include <ucp/api/ucp.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ucp_worker_progress(worker), with UCX's lines on this thread meanwhile
 * sent to the library's logger (subsystem "ucx": UCX's errors at warn, the
 * first 16 in the process, as anyone reaching a port can cause them; the
 * rest at debug). */
unsigned mep_ucx_progress(ucp_worker_h worker);

/* The same for every UCX call this thread makes until the matching
 * leave (nested pairs count): the library's entries (group_create,
 * group_destroy, the calls under a group's lock) and its own threads, so
 * what UCX writes while connecting, closing or tearing down goes to the
 * logger too. */
void mep_ucx_quiet_enter(void);
void mep_ucx_quiet_leave(void);

/* How many of UCX's lines the library took from stderr in this process. */
unsigned long long mep_ucx_lines_taken(void);

#ifdef __cplusplus
}
#endif

#endif /* MOE_EP_RUNTIME_UCX_QUIET_H_ */
