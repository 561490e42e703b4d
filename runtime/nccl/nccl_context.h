/* nccl_context.h: the calling thread's CUDA state belongs to the engine.
 * Every entry of the nccl backend that touches the device saves the
 * thread's current context, makes the group's device's primary context
 * current (the driver's call, so the runtime's per-thread device is not
 * changed), and puts the saved context back on the way out, none
 * included. A thread that never chose a device therefore does not come
 * back holding one (on a multi-GPU node that would be a context on GPU 0
 * for every process), and one that runs its own context on the group's
 * GPU keeps it while the group's work goes to the primary context, where
 * the group's memory lives. Without the driver's context calls it falls
 * back to the runtime's current device. */
#ifndef MEP_RUNTIME_NCCL_NCCL_CONTEXT_H_
#define MEP_RUNTIME_NCCL_NCCL_CONTEXT_H_

#include "moe_ep.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mep_nccl_caller {
  void *ctx;    /* CUcontext; NULL: none */
  int have_ctx; /* ctx is known (the driver's context calls resolved) */
  int device;   /* fallback: the runtime's current device, or -1 */
  int switched; /* set by mep_nccl_enter: the context was changed */
} mep_nccl_caller_t;

/* Around one entry: saves the caller's state and makes `device`'s primary
 * context current; leave restores only what enter changed (so an engine
 * thread already on the group's device pays one context query per entry)
 * and returns st. */
moe_ep_status_t mep_nccl_enter(int device, mep_nccl_caller_t *c);
moe_ep_status_t mep_nccl_leave(const mep_nccl_caller_t *c, moe_ep_status_t st);
/* Runs fn(g) (a create or a teardown, which switch to the group's device
 * on their own) and puts the caller's state back. */
moe_ep_status_t mep_nccl_as_caller(moe_ep_status_t (*fn)(moe_ep_group_t *g), moe_ep_group_t *g);
/* Whether work queued on `stream` runs in the context current on this
 * thread (after mep_nccl_enter: the group's device's primary context,
 * where the group's memory lives). 0 for a stream of another device, or
 * of another context on this one: the group's kernels would run where its
 * memory is not mapped. A green context's stream on the same device
 * counts as the primary context's, and the special streams (NULL, legacy,
 * per-thread) as the current context's. 1 when the driver cannot tell
 * (it predates CUDA 12.5, or the query fails: the launch then reports). */
int mep_nccl_stream_here(void *stream);
/* Makes `device`'s primary context current (or, in the fallback, the
 * device current). */
moe_ep_status_t mep_nccl_make_current(int device);

#ifdef __cplusplus
}
#endif

#endif /* MEP_RUNTIME_NCCL_NCCL_CONTEXT_H_ */
