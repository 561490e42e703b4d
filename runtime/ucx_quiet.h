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
 * sent to the library's logger (debug level, subsystem "ucx"). */
unsigned mep_ucx_progress(ucp_worker_h worker);

/* How many of UCX's lines the library took from stderr in this process. */
unsigned long long mep_ucx_lines_taken(void);

#ifdef __cplusplus
}
#endif

#endif /* MOE_EP_RUNTIME_UCX_QUIET_H_ */
