/* nccl_wait.c: bounded waits on nonblocking NCCL calls and setup streams
 * (see nccl_wait.h). */
#define _GNU_SOURCE /* clock_gettime, nanosleep under -std=c11 */
#include "runtime/nccl/nccl_wait.h"

#include <time.h>

#include "runtime/error.h"

/* A setup step takes milliseconds to seconds: polling every 50 us keeps
 * the wait's own delay negligible without spinning a core. */
#define MEP_NCCL_POLL_NS 50000L

int64_t mep_nccl_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Makes the thread's capture mode thread-local, unless it is relaxed
 * already (more permissive: left as it is). Returns whether
 * thread_local_leave must put *before back. */
static int thread_local_enter(enum cudaStreamCaptureMode *before) {
  *before = cudaStreamCaptureModeThreadLocal;
  int swapped = cudaThreadExchangeStreamCaptureMode(before) == cudaSuccess;
  if (swapped && *before == cudaStreamCaptureModeRelaxed) {
    (void)cudaThreadExchangeStreamCaptureMode(before); /* relaxed again */
    swapped = 0;
  }
  return swapped;
}

static void thread_local_leave(int swapped, enum cudaStreamCaptureMode *before) {
  if (swapped) (void)cudaThreadExchangeStreamCaptureMode(before);
}

/* An event's (or, event NULL, a stream's) query in thread-local capture
 * mode (thread_local_enter). */
static cudaError_t query_thread_local(cudaEvent_t event, cudaStream_t stream) {
  enum cudaStreamCaptureMode before;
  const int swapped = thread_local_enter(&before);
  const cudaError_t e = event != NULL ? cudaEventQuery(event) : cudaStreamQuery(stream);
  thread_local_leave(swapped, &before);
  return e;
}

int mep_nccl_on_side_stream(void (*work)(void *arg, cudaStream_t stream), void *arg,
                            int timeout_ms) {
  enum cudaStreamCaptureMode before;
  const int swapped = thread_local_enter(&before);
  cudaStream_t side = NULL;
  int done = 1;
  if (cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking) == cudaSuccess) {
    work(arg, side);
    done = mep_nccl_stream_drained(side, timeout_ms);
    (void)cudaStreamDestroy(side);
  }
  thread_local_leave(swapped, &before);
  return done;
}

cudaError_t mep_nccl_event_query(cudaEvent_t event) { return query_thread_local(event, NULL); }

cudaError_t mep_nccl_stream_query(cudaStream_t stream) { return query_thread_local(NULL, stream); }

int mep_nccl_query_refused_by_capture(cudaError_t e) {
  /* In thread-local mode another thread's capture refuses nothing here. */
  return e == cudaErrorStreamCaptureUnsupported || e == cudaErrorStreamCaptureImplicit ||
         e == cudaErrorStreamCaptureWrongThread || e == cudaErrorStreamCaptureInvalidated;
}

int mep_nccl_query_ended(cudaError_t e) {
  return e != cudaErrorNotReady && e != cudaErrorCapturedEvent &&
         !mep_nccl_query_refused_by_capture(e);
}

static void pause_poll(void) {
  const struct timespec ts = {0, MEP_NCCL_POLL_NS};
  nanosleep(&ts, NULL);
}

moe_ep_status_t mep_nccl_error(ncclComm_t comm, const char *step, ncclResult_t r) {
  const char *last = ncclGetLastError(comm);
  return mep_error(MOE_EP_ERR_NCCL, "%s failed: %s%s%s", step, ncclGetErrorString(r),
                   last && last[0] ? ": " : "", last ? last : "");
}

static moe_ep_status_t timed_out(const char *step, int32_t timeout_ms) {
  return mep_error(MOE_EP_ERR_TIMEOUT,
                   "%s did not complete within bootstrap.timeout_ms=%d: another rank of the "
                   "group has not reached the same step (it failed, stopped or is far behind)",
                   step, (int)timeout_ms);
}

/* Polls the communicator after a call that returned r until its state
 * settles or the deadline passes (*late). A nonblocking communicator may
 * report ncclInProgress after a call that itself returned ncclSuccess
 * (seen with NCCL 2.28.9 during setup: the next call was refused as
 * "before the previous operation returned ncclSuccess"), so the state is
 * read whatever the call returned. Returns the settled
 * result. */
static ncclResult_t settle(ncclComm_t comm, ncclResult_t r, int32_t timeout_ms, int *late) {
  const int64_t deadline = mep_nccl_now_ms() + timeout_ms;
  *late = 0;
  if (r != ncclSuccess && r != ncclInProgress) return r;
  for (;;) {
    ncclResult_t q = ncclCommGetAsyncError(comm, &r);
    if (q != ncclSuccess) return q;
    if (r != ncclInProgress) return r;
    if (mep_nccl_now_ms() >= deadline) {
      *late = 1;
      return r;
    }
    pause_poll();
  }
}

moe_ep_status_t mep_nccl_settle(ncclComm_t comm, ncclResult_t r, const char *step,
                                int32_t timeout_ms) {
  int late = 0;
  r = settle(comm, r, timeout_ms, &late);
  if (late) return timed_out(step, timeout_ms);
  return r == ncclSuccess ? MOE_EP_OK : mep_nccl_error(comm, step, r);
}

int mep_nccl_settled(ncclComm_t comm, ncclResult_t r, int32_t timeout_ms) {
  int late = 0;
  return settle(comm, r, timeout_ms, &late) == ncclSuccess && !late;
}

/* comm NULL (mep_nccl_local_wait): the stream holds this rank's own work
 * (no peer takes part), so an expiry blames this GPU, not another rank. */
moe_ep_status_t mep_nccl_stream_wait(ncclComm_t comm, cudaStream_t stream, const char *step,
                                     int32_t timeout_ms) {
  const int64_t deadline = mep_nccl_now_ms() + timeout_ms;
  for (;;) {
    cudaError_t e = mep_nccl_stream_query(stream);
    if (e == cudaSuccess) return MOE_EP_OK;
    if (mep_nccl_query_ended(e))
      return mep_error(MOE_EP_ERR_CUDA, "%s failed on the GPU: %s", step, cudaGetErrorString(e));
    if (comm != NULL) {
      ncclResult_t a = ncclSuccess;
      ncclResult_t q = ncclCommGetAsyncError(comm, &a);
      if (q != ncclSuccess) return mep_nccl_error(comm, step, q);
      if (a != ncclSuccess && a != ncclInProgress) return mep_nccl_error(comm, step, a);
    }
    if (mep_nccl_now_ms() >= deadline) {
      if (comm != NULL) return timed_out(step, timeout_ms);
      return mep_error(MOE_EP_ERR_TIMEOUT,
                       "%s did not complete within bootstrap.timeout_ms=%d: this rank's GPU "
                       "did not run it (busy with other work, or hung)",
                       step, (int)timeout_ms);
    }
    pause_poll();
  }
}

moe_ep_status_t mep_nccl_local_wait(cudaStream_t stream, const char *step, int32_t timeout_ms) {
  return mep_nccl_stream_wait(NULL, stream, step, timeout_ms);
}

int mep_nccl_stream_drained(cudaStream_t stream, int32_t timeout_ms) {
  const int64_t deadline = mep_nccl_now_ms() + timeout_ms;
  while (!mep_nccl_query_ended(mep_nccl_stream_query(stream))) {
    if (mep_nccl_now_ms() >= deadline) return 0;
    pause_poll();
  }
  return 1;
}
