/* nccl_common.c: helpers both modes of the nccl backend share (see
 * nccl_common.h). */
#define _GNU_SOURCE /* nanosleep under -std=c11 */
#include "runtime/nccl/nccl_common.h"

#include <cuda_runtime_api.h>
#include <string.h>
#include <time.h>

#include "kernels/common/prepare_layout.h"
#include "kernels/ll/ll.h"
#include "runtime/bootstrap.h"
#include "runtime/error.h"
#include "runtime/group.h"
#include "runtime/log.h"
#include "runtime/nccl/nccl_setup.h"
#include "runtime/nccl/nccl_wait.h"
#include "runtime/nccl/pinned_pool.h"

moe_ep_status_t mep_nccl_cuda_error(const char *what, int e) {
  return mep_error(MOE_EP_ERR_CUDA, "backend nccl: %s failed: %s", what,
                   cudaGetErrorString((cudaError_t)e));
}

moe_ep_status_t mep_nccl_pick_device(moe_ep_group_t *g, int *device, int *sms) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    return mep_error(MOE_EP_ERR_CUDA,
                     "group_create: backend 'nccl' needs a CUDA device, but this "
                     "process sees none (%s); use backend: host",
                     e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
  }
  int dev = g->cuda_device;
  if (dev < 0 && (e = cudaGetDevice(&dev)) != cudaSuccess) {
    return mep_nccl_cuda_error("cudaGetDevice", e);
  }
  if (dev >= count) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "group_create: params->cuda_device=%d but only %d CUDA devices are "
                     "visible",
                     dev, count);
  }
  MEP_CHECK(mep_nccl_make_current(dev));
  *device = dev;
  g->cuda_device = dev; /* tensors are checked against it */
  if ((e = cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess) {
    return mep_nccl_cuda_error("cudaDeviceGetAttribute(MultiProcessorCount)", e);
  }
  g->max_sms = *sms;
  return MOE_EP_OK;
}

moe_ep_status_t mep_nccl_resolve_lsa(mep_nccl_t *n, int rank, uint64_t *base, uint64_t *stride,
                                     uint64_t *local) {
  unsigned char desc[MEP_NCCL_SCRATCH_MIN];
  const size_t bytes = mep_ll_window_desc_bytes();
  moe_ep_status_t st =
      bytes > sizeof desc
          ? mep_error(MOE_EP_ERR_INTERNAL, "the window's descriptor is %zu bytes, more than %zu",
                      bytes, sizeof desc)
          : mep_nccl_read_back(n, desc, mep_nccl_window(n), bytes,
                               "reading the window's LSA addresses");
  if (st != MOE_EP_OK) {
    mep_error_prefix("group_create on rank %d", rank);
    return st;
  }
  if (mep_ll_lsa_from_desc(desc, base, stride, local) != MEP_KSTATUS_OK)
    return mep_error(MOE_EP_ERR_CUDA, "group_create on rank %d: %s", rank,
                     mep_kernels_last_error());
  return MOE_EP_OK;
}

moe_ep_status_t mep_nccl_alloc_records(mep_error_record_t **host,
                                       mep_error_record_t **dev) {
  return mep_pinned_take(2 * sizeof(**host), (void **)host, (void **)dev, "error records");
}

void mep_nccl_free_records(mep_error_record_t *host) { mep_pinned_give(host); }

int mep_nccl_record_ready(const mep_error_record_t *r) {
  return __atomic_load_n(&r->flag, __ATOMIC_ACQUIRE) == 2;
}

moe_ep_status_t mep_nccl_bad_routing(const moe_ep_group_t *g, const mep_error_record_t *r) {
  return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                   "dispatch on rank %d: topk_idx[%llu][%llu] = %d is outside -1..%d "
                   "(num_experts - 1); that slot was dropped as if it were -1 (the first such "
                   "entry of an earlier call; others may follow it)",
                   r->rank, (unsigned long long)r->expected, (unsigned long long)r->seen,
                   r->expert, g->cfg.num_experts - 1);
}

moe_ep_status_t mep_nccl_launched(const moe_ep_group_t *g, mep_kstatus_t k, const char *what) {
  if (k == MEP_KSTATUS_OK) return MOE_EP_OK;
  moe_ep_status_t st = k == MEP_KSTATUS_INVALID_ARGUMENT ? MOE_EP_ERR_INVALID_ARGUMENT
                                                         : MOE_EP_ERR_CUDA;
  return mep_error(st, "%s on rank %d: %s", what, g->rank, mep_kernels_last_error());
}

moe_ep_status_t mep_nccl_share_uid(void *user, int32_t rank, int32_t world, void *uid,
                                   size_t bytes) {
  (void)rank;
  (void)world;
  return mep_bootstrap_broadcast((mep_bootstrap_t *)user, uid, bytes, 0);
}

moe_ep_status_t mep_nccl_prepare_layout(moe_ep_group_t *g, mep_nccl_t *nccl, int device,
                                        mep_handle_state_t *h) {
  if (!h->out_tokens_per_rank && !h->out_tokens_per_expert && !h->out_is_token_in_rank) {
    return MOE_EP_OK;
  }
  mep_nccl_caller_t caller;
  MEP_CHECK(mep_nccl_enter(device, &caller));
  /* A stream CUDA refuses (destroyed, or in an invalidated capture) is bad
   * input, refused before the launch, which would fail the group. */
  mep_nccl_stream_t on;
  moe_ep_status_t st = mep_nccl_stream_open(h->prepare_stream, "params->stream", &on);
  if (st == MOE_EP_OK) st = mep_nccl_note_capture(nccl, &on);
  if (st != MOE_EP_OK) return mep_nccl_leave(&caller, st);
  mep_prepare_layout_args_t a = {
      .topk_idx = h->topk_idx,
      .topk_idx_bytes = h->topk_idx_bits / 8,
      .num_tokens = h->num_tokens,
      .top_k = h->top_k,
      .num_experts = g->cfg.num_experts,
      .world = g->world_size,
      .num_tokens_per_rank = h->out_tokens_per_rank,
      .num_tokens_per_expert = h->out_tokens_per_expert,
      .is_token_in_rank = h->out_is_token_in_rank,
  };
  return mep_nccl_leave(&caller,
                        mep_nccl_launched(g, mep_prepare_layout(&a, h->prepare_stream), "prepare"));
}

moe_ep_status_t mep_nccl_sent_create(mep_nccl_sent_t *sent) {
  for (int i = 0; i < MEP_NUM_BUFFER_SETS; i++) {
    cudaError_t e = cudaEventCreateWithFlags((cudaEvent_t *)&sent->event[i],
                                             cudaEventDisableTiming);
    if (e == cudaSuccess)
      e = cudaEventCreateWithFlags((cudaEvent_t *)&sent->captured[i], cudaEventDisableTiming);
    if (e != cudaSuccess) return mep_nccl_cuda_error("cudaEventCreate", e);
  }
  return MOE_EP_OK;
}

void mep_nccl_sent_destroy(mep_nccl_sent_t *sent) {
  for (int i = 0; i < MEP_NUM_BUFFER_SETS; i++) {
    if (sent->event[i] != NULL) cudaEventDestroy((cudaEvent_t)sent->event[i]);
    if (sent->captured[i] != NULL) cudaEventDestroy((cudaEvent_t)sent->captured[i]);
    sent->event[i] = sent->captured[i] = NULL;
  }
}

/* Polls until `ev` completes or the clock passes deadline_ms. */
static int await_until(cudaEvent_t ev, int64_t deadline_ms) {
  const struct timespec nap = {0, 200000}; /* 0.2 ms between polls */
  while (!mep_nccl_query_ended(mep_nccl_event_query(ev))) {
    if (mep_nccl_now_ms() > deadline_ms) return 0;
    nanosleep(&nap, NULL);
  }
  return 1;
}

int mep_nccl_await_event(void *event, int timeout_ms) {
  return event == NULL || await_until((cudaEvent_t)event, mep_nccl_now_ms() + timeout_ms);
}

int mep_nccl_await_sent(const mep_nccl_sent_t *const *sent, int n, int timeout_ms) {
  const int64_t deadline = mep_nccl_now_ms() + timeout_ms;
  for (int i = 0; i < n; i++) {
    for (int set = 0; set < MEP_NUM_BUFFER_SETS; set++) {
      cudaEvent_t ev = (cudaEvent_t)sent[i]->event[set];
      if (ev != NULL && !await_until(ev, deadline)) return 0;
    }
  }
  return 1;
}

static int end_kernels(const mep_nccl_sent_t *const *sent, int n, int timeout_ms,
                       void (*raise_abort)(void *ctx, cudaStream_t stream), void *ctx) {
  /* only while a kernel may still run; the flag's copy lands before the
   * caller frees the state */
  if (raise_abort != NULL && !mep_nccl_await_sent(sent, n, 0) &&
      !mep_nccl_on_side_stream(raise_abort, ctx, timeout_ms))
    return 0;
  return mep_nccl_await_sent(sent, n, timeout_ms);
}

static moe_ep_status_t abandoned(const moe_ep_group_t *g, uint64_t window_bytes) {
  return mep_error(MOE_EP_ERR_TIMEOUT,
                   "group_destroy on rank %d: the group's last kernels had not ended within "
                   "bootstrap.timeout_ms=%d (they wait behind earlier work on their streams); "
                   "its window (%llu bytes), device state, handle storage, error records and "
                   "communicator are left allocated "
                   "for the life of the process, since those kernels may still use them",
                   g->rank, g->cfg.bootstrap_timeout_ms, (unsigned long long)window_bytes);
}

/* The contract lets graphs that hold the group's calls outlive it as long
 * as they are never launched again; one still alive is said (the engine's
 * log) because a launch of it after this point would use freed memory. */
static void warn_graphs(const moe_ep_group_t *g, int64_t graphs) {
  const int one = graphs == 1;
  MEP_LOG_WARN("group",
               "rank %d: group_destroy: %lld CUDA graph%s (or graph capture%s) holding this "
               "group's calls %s still alive %d ms after the call; the group's memory is given "
               "up now, so %s must never be launched again (a launch would write memory that "
               "may belong to another allocation by then). Destroy the graphs that hold a "
               "group's calls, and the executable graphs made from them, before group_destroy",
               g->rank, (long long)graphs, one ? "" : "s", one ? "" : "s", one ? "is" : "are",
               MEP_NCCL_GRAPH_GRACE_MS, one ? "it" : "they");
}

int mep_nccl_quiesce(const moe_ep_group_t *g, mep_nccl_t *nccl, const mep_nccl_sent_t *const *sent,
                     int n, void (*raise_abort)(void *ctx, cudaStream_t stream), void *ctx,
                     moe_ep_status_t *st) {
  const int64_t graphs = mep_graph_watch_live(mep_nccl_graphs(nccl), MEP_NCCL_GRAPH_GRACE_MS);
  if (graphs > 0) warn_graphs(g, graphs);
  if (end_kernels(sent, n, g->cfg.bootstrap_timeout_ms, raise_abort, ctx)) return 1;
  *st = abandoned(g, mep_nccl_bytes_allocated(nccl));
  return 0;
}

static moe_ep_status_t left_registered(const moe_ep_group_t *g, uint64_t window_bytes) {
  return mep_error(MOE_EP_ERR_TIMEOUT,
                   "group_destroy on rank %d: releasing the window (its device communicator and "
                   "registration, or the setup stream's last work) failed or did not end within "
                   "bootstrap.timeout_ms=%d; the window (%llu bytes), the setup's scratch and "
                   "its stream are left allocated for the life of the process%s",
                   g->rank, g->cfg.bootstrap_timeout_ms, (unsigned long long)window_bytes,
                   g->nccl_comm != NULL ? ", and stay registered on the engine's communicator, "
                                          "which the engine must abort (ncclCommAbort) before "
                                          "using it again" : "");
}

moe_ep_status_t mep_nccl_release(const moe_ep_group_t *g, mep_nccl_t *nccl, int ended, int abort,
                                 moe_ep_status_t st) {
  if (!ended) {
    mep_nccl_abandon(nccl);
    return st;
  }
  const uint64_t bytes = nccl != NULL ? mep_nccl_bytes_allocated(nccl) : 0;
  if (!mep_nccl_destroy(nccl, abort) && st == MOE_EP_OK) return left_registered(g, bytes);
  return st;
}

/* The id of the graph capture `stream` is in, 0 when none. A capture
 * already invalidated is an error: nothing recorded there would run. */
static cudaError_t capture_of(void *stream, unsigned long long *id) {
  enum cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long got = 0;
  cudaError_t e = cudaStreamGetCaptureInfo((cudaStream_t)stream, &status, &got, NULL, NULL, NULL,
                                           NULL);
  if (e == cudaSuccess && status == cudaStreamCaptureStatusInvalidated)
    e = cudaErrorStreamCaptureInvalidated;
  *id = status == cudaStreamCaptureStatusActive ? got : 0;
  return e;
}

/* The engine's stream refused by CUDA where a call first asks about it,
 * before anything is queued there (mep_nccl_stream_open): bad input,
 * not a failure of the group (a destroyed stream, or one in a graph capture
 * an earlier call invalidated). */
static moe_ep_status_t stream_refused(void *stream, const char *arg, cudaError_t e) {
  /* Only the stream's own refusals; anything else (a sticky error an
   * earlier kernel left) is the device's, and fatal. */
  if (e != cudaErrorInvalidResourceHandle && e != cudaErrorInvalidValue &&
      e != cudaErrorStreamCaptureInvalidated && e != cudaErrorStreamCaptureImplicit)
    return mep_nccl_cuda_error("cudaStreamGetCaptureInfo", e);
  (void)cudaGetLastError(); /* not sticky: no later check may read it as its own */
  if (e == cudaErrorStreamCaptureInvalidated) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "%s=%p is in a CUDA graph capture that an earlier call "
                     "invalidated; nothing queued there would run (end that capture and "
                     "capture again)",
                     arg, stream);
  }
  return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                   "%s=%p is not a stream CUDA accepts on the group's device "
                   "(cudaStreamGetCaptureInfo: %s); pass a live stream of the group's GPU",
                   arg, stream, cudaGetErrorString(e));
}

/* A stream of another GPU, or of another context on this one: the
 * group's kernels there would run where its memory is not mapped (or fail
 * to launch, failing the group), so it is bad input. Asked after
 * capture_of, which turns a destroyed stream away first. */
static moe_ep_status_t stream_elsewhere(void *stream, const char *arg) {
  if (mep_nccl_stream_here(stream)) return MOE_EP_OK;
  int here = -1, there = -1;
  (void)cudaGetDevice(&here);
  if (cudaStreamGetDevice((cudaStream_t)stream, &there) != cudaSuccess) {
    (void)cudaGetLastError();
    there = -1;
  }
  if (there >= 0 && there != here) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "%s=%p is a stream of CUDA device %d, but the group runs on "
                     "device %d; pass a stream of device %d",
                     arg, stream, there, here, here);
  }
  return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                   "%s=%p belongs to a CUDA context other than device %d's primary "
                   "context, where the group's memory lives; pass a stream of the primary "
                   "context (the runtime API's streams) or of a green context of device %d",
                   arg, stream, here, here);
}

moe_ep_status_t mep_nccl_stream_open(void *stream, const char *arg, mep_nccl_stream_t *out) {
  out->stream = stream;
  out->capture = 0;
  const cudaError_t e = capture_of(stream, &out->capture);
  if (e != cudaSuccess) return stream_refused(stream, arg, e);
  return stream_elsewhere(stream, arg);
}

moe_ep_status_t mep_nccl_note_capture(mep_nccl_t *nccl, const mep_nccl_stream_t *on) {
  const cudaError_t w =
      mep_graph_watch_note(mep_nccl_graphs(nccl), (cudaStream_t)on->stream, on->capture);
  return w == cudaSuccess ? MOE_EP_OK
                          : mep_nccl_cuda_error("tying the graph capture to the group", w);
}

moe_ep_status_t mep_nccl_check_recv(moe_ep_group_t *g, const mep_op_t *op) {
  mep_nccl_caller_t caller;
  MEP_CHECK(mep_nccl_enter(g->cuda_device, &caller));
  mep_nccl_stream_t st;
  return mep_nccl_leave(&caller, mep_nccl_stream_open(op->stream, "stream", &st));
}

moe_ep_status_t mep_nccl_sent_record(mep_nccl_sent_t *sent, int set, const mep_nccl_stream_t *s) {
  cudaEvent_t ev = (cudaEvent_t)(s->capture != 0 ? sent->captured[set] : sent->event[set]);
  const cudaError_t e = cudaEventRecord(ev, (cudaStream_t)s->stream);
  if (e != cudaSuccess) return mep_nccl_cuda_error("cudaEventRecord", e);
  if (s->capture != 0) {
    sent->captured_stream[set] = s->stream;
    sent->capture[set] = s->capture;
  } else {
    sent->stream[set] = s->stream;
  }
  sent->last_capture[set] = s->capture;
  return MOE_EP_OK;
}

/* Whether two halves on `a` and `b` are in stream order without an event.
 * cudaStreamPerThread names a different stream on every host thread, so
 * two halves given it may be on two streams. Comparing handles is enough
 * otherwise: CUDA frees a destroyed stream's handle only once its queued
 * work has completed, so a new stream at the same address comes after the
 * earlier half. */
static int same_stream(void *a, void *b) { return a == b && a != (void *)cudaStreamPerThread; }

moe_ep_status_t mep_nccl_sent_order(const mep_nccl_sent_t *sent, int set,
                                    const mep_nccl_stream_t *s) {
  int ordered;
  return mep_nccl_sent_order_if(sent, set, s, &ordered);
}

moe_ep_status_t mep_nccl_sent_order_if(const mep_nccl_sent_t *sent, int set,
                                       const mep_nccl_stream_t *s, int *ordered) {
  *ordered = s->capture == sent->last_capture[set];
  cudaEvent_t ev;
  if (s->capture == 0) {
    /* Before any eager half the event was never recorded: waiting on it
     * is a no-op (and NULL is the legacy default stream, not "none"). */
    if (same_stream(s->stream, sent->stream[set])) return MOE_EP_OK;
    ev = (cudaEvent_t)sent->event[set];
  } else {
    if (s->capture != sent->capture[set] || same_stream(s->stream, sent->captured_stream[set]))
      return MOE_EP_OK;
    ev = (cudaEvent_t)sent->captured[set];
  }
  const cudaError_t e = cudaStreamWaitEvent((cudaStream_t)s->stream, ev, 0);
  return e == cudaSuccess ? MOE_EP_OK : mep_nccl_cuda_error("cudaStreamWaitEvent", e);
}
