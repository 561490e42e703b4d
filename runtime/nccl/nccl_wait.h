/* nccl_wait.h: bounded waits for the NCCL side of a group's setup and
 * teardown. moe-ep creates its communicators nonblocking (NCCL's
 * config.blocking = 0), so a collective setup call returns ncclInProgress
 * instead of blocking until every rank has joined; these helpers poll it,
 * and the stream a setup collective runs on, until a deadline, so that a
 * peer that failed or stopped between two setup steps is an error here,
 * not a hang. Errors are written with mep_error() and name the step. */
#ifndef MEP_NCCL_WAIT_H_
#define MEP_NCCL_WAIT_H_

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdint.h>

#include "moe_ep.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Milliseconds on a monotonic clock. */
int64_t mep_nccl_now_ms(void);

/* cudaEventQuery / cudaStreamQuery made in thread-local capture mode:
 * while another thread captures a graph in global mode (torch.cuda.graph's
 * default), a query in the default mode is refused and invalidates that
 * capture. */
cudaError_t mep_nccl_event_query(cudaEvent_t event);
cudaError_t mep_nccl_stream_query(cudaStream_t stream);
/* work(arg, s) on a non-blocking stream s made for it, in thread-local
 * capture mode as above, then a wait (bounded by timeout_ms) for s to
 * drain, and s destroyed: for a teardown's copy that neither the engine's
 * streams nor another thread's capture may hold back, and that must have
 * landed before what it writes is freed. 0 when the work was queued but
 * had not ended within the bound (its target must then stay allocated),
 * else 1; when CUDA refuses the stream, work is not called. */
int mep_nccl_on_side_stream(void (*work)(void *arg, cudaStream_t stream), void *arg,
                            int timeout_ms);
/* A query's answer that is not "not ready" and not a refusal tied to a
 * graph capture (which says nothing of the work): the work has ended, or
 * failed on the device and runs no further. */
int mep_nccl_query_ended(cudaError_t e);
/* 1 when a query in thread-local capture mode (mep_nccl_event_query) was
 * refused because this thread itself is capturing a CUDA graph: no later
 * query on this thread can answer until that capture ends. */
int mep_nccl_query_refused_by_capture(cudaError_t e);

/* MOE_EP_ERR_NCCL: "`step` failed: " NCCL's reason for r and its last
 * error on `comm` (NULL: outside a communicator). */
moe_ep_status_t mep_nccl_error(ncclComm_t comm, const char *step, ncclResult_t r);

/* The result `r` of NCCL call `step` on `comm`: ncclSuccess is OK;
 * ncclInProgress is polled (ncclCommGetAsyncError) until it settles or
 * timeout_ms have passed (MOE_EP_ERR_TIMEOUT); anything else is
 * MOE_EP_ERR_NCCL with NCCL's reason. */
moe_ep_status_t mep_nccl_settle(ncclComm_t comm, ncclResult_t r, const char *step,
                                int32_t timeout_ms);

/* The same wait without an error sentence (teardown, where the error a
 * caller reports must stay the last one): 1 if the call succeeded. */
int mep_nccl_settled(ncclComm_t comm, ncclResult_t r, int32_t timeout_ms);

/* Waits for `stream` (which runs `step`, a collective on `comm`) to drain,
 * at most timeout_ms; an asynchronous NCCL error on `comm` ends the wait
 * early with NCCL's reason. */
moe_ep_status_t mep_nccl_stream_wait(ncclComm_t comm, cudaStream_t stream, const char *step,
                                     int32_t timeout_ms);

/* The same for `stream` running this rank's own work (`step`: a zeroing
 * or a copy; no peer takes part): an expiry says this GPU did not run it. */
moe_ep_status_t mep_nccl_local_wait(cudaStream_t stream, const char *step, int32_t timeout_ms);
/* Teardown's quiet form: 1 once `stream` has no work left (or reports a
 * failure: nothing more of it runs), 0 when timeout_ms passed first. Sets
 * no error sentence: the caller's stays the last one. */
int mep_nccl_stream_drained(cudaStream_t stream, int32_t timeout_ms);

#ifdef __cplusplus
}
#endif

#endif /* MEP_NCCL_WAIT_H_ */
