/* nccl_common.h: what the nccl backend's two modes (LL: nccl_backend.c,
 * HT: nccl_ht.c) share: the group's GPU, the host-mapped records kernels
 * write when a wait expires, entering and leaving the GPU around a launch,
 * the launchers' statuses, and NCCL's unique id over the bootstrap. */
#ifndef MEP_NCCL_COMMON_H_
#define MEP_NCCL_COMMON_H_

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "kernels/common/kernels_error.h"
#include "kernels/common/kernels_types.h"
#include "kernels/common/error_record.h"
#include "kernels/common/limits.h"
#include "moe_ep.h"
#include "runtime/nccl/nccl_context.h"
#include "runtime/op.h"

struct mep_nccl; /* nccl_setup.h */

#ifdef __cplusplus
extern "C" {
#endif

moe_ep_status_t mep_nccl_cuda_error(const char *what, int cuda_error);

/* Makes the group's GPU (params->cuda_device, or the current one) current
 * and reports its SM count; sets g->cuda_device and g->max_sms. */
moe_ep_status_t mep_nccl_pick_device(moe_ep_group_t *g, int *device, int *sms);

/* Two host-mapped records, zeroed: [0] a timed-out wait (fatal), [1] a
 * notice. *host goes back with mep_nccl_free_records (to the process's
 * pinned pool: cudaFreeHost waits for the whole device); *dev is its
 * alias. */
moe_ep_status_t mep_nccl_alloc_records(mep_error_record_t **host,
                                       mep_error_record_t **dev);
void mep_nccl_free_records(mep_error_record_t *host);
/* A record the GPU finished writing (read fresh: host-mapped memory). */
int mep_nccl_record_ready(const mep_error_record_t *r);
/* The sentence of a notice record of an out-of-range topk_idx entry
 * (MEP_LL_OP_BAD_ROUTING, MEP_HT_OP_BAD_ROUTING: expert = the value,
 * expected = token, seen = k): INVALID_ARGUMENT, the group usable. */
moe_ep_status_t mep_nccl_bad_routing(const moe_ep_group_t *g, const mep_error_record_t *r);


/* A launcher's status as moe-ep's, with its sentence and this rank. */
moe_ep_status_t mep_nccl_launched(const moe_ep_group_t *g, mep_kstatus_t k, const char *what);

/* What orders one half after an earlier one on the same buffer set (a
 * receive after its send; a send after the set's last receive): an event
 * per set recorded after the earlier half, the stream it was recorded on,
 * and the graph capture that stream was in then (0: none). An earlier half
 * recorded in a capture goes to a second event, so `event` stays the last
 * eager one: the host can wait for that (teardown, HT's row count), while
 * an event last recorded in a capture can only be waited on inside it. */
typedef struct mep_nccl_sent {
  void *event[MEP_NUM_BUFFER_SETS];    /* cudaEvent_t: the last eager half */
  void *stream[MEP_NUM_BUFFER_SETS];   /* its stream */
  void *captured[MEP_NUM_BUFFER_SETS]; /* cudaEvent_t: the last captured half */
  void *captured_stream[MEP_NUM_BUFFER_SETS];
  unsigned long long capture[MEP_NUM_BUFFER_SETS]; /* that half's capture id */
  /* The capture id of the set's last half, eager or captured (0: eager,
   * or none yet): whether an event can order a later half after it. */
  unsigned long long last_capture[MEP_NUM_BUFFER_SETS];
} mep_nccl_sent_t;

moe_ep_status_t mep_nccl_sent_create(mep_nccl_sent_t *sent);
void mep_nccl_sent_destroy(mep_nccl_sent_t *sent); /* accepts a zeroed one */

/* The engine's stream as a call found it on entry: the graph capture it
 * is in (0: none). A call cannot end a capture, so one look serves every
 * half and record the call queues there. */
typedef struct mep_nccl_stream {
  void *stream;
  unsigned long long capture;
} mep_nccl_stream_t;

/* A call's one question about its stream, asked on the group's device
 * (mep_nccl_enter) before anything is queued there: CUDA accepts it (a
 * destroyed stream, or one in a capture an earlier call invalidated, is
 * INVALID_ARGUMENT naming `arg`), and it runs in the group's context (a
 * stream of another GPU, or of another context on this one, is
 * INVALID_ARGUMENT too); a device error stays a fatal CUDA error. */
moe_ep_status_t mep_nccl_stream_open(void *stream, const char *arg, mep_nccl_stream_t *out);
/* Right before a call queues its first work in a capture: ties the
 * capture's graph to the group (graph_watch.h), once per capture, so that
 * group_destroy knows of it. Eager work (on->capture 0): nothing. */
moe_ep_status_t mep_nccl_note_capture(struct mep_nccl *nccl, const mep_nccl_stream_t *on);
/* LL's check_recv (backend.h): hook_run's stream (op->stream, named
 * `stream`), refused as mep_nccl_stream_open refuses it, before the hook
 * counts as run. */
moe_ep_status_t mep_nccl_check_recv(moe_ep_group_t *g, const mep_op_t *op);

/* After the earlier half on `s` into buffer set `set`. */
moe_ep_status_t mep_nccl_sent_record(mep_nccl_sent_t *sent, int set, const mep_nccl_stream_t *s);
/* Before the later half on `s`: the same stream is already ordered;
 * another eager stream waits for the last eager half's event, another
 * stream in the same capture for the last captured half's. Across
 * captures, or from a capture to eager work, an event cannot order
 * anything (CUDA refuses a capturing stream's wait on an event recorded
 * outside its capture): the order of the graph's launch is its stream's,
 * the engine's to set. */
moe_ep_status_t mep_nccl_sent_order(const mep_nccl_sent_t *sent, int set,
                                    const mep_nccl_stream_t *s);
/* mep_nccl_sent_order, and *ordered: 1 when `s` now comes after the set's
 * last half (both eager, or both in the capture `s` is in), 0 when no
 * event could order them (a capture and eager work, or two captures). */
moe_ep_status_t mep_nccl_sent_order_if(const mep_nccl_sent_t *sent, int set,
                                       const mep_nccl_stream_t *s, int *ordered);

/* Teardown's wait for the group's last eager work: until the eager event
 * of every set in each of the `n` trackers has completed, polled with
 * short sleeps within timeout_ms (cudaEventSynchronize has no bound). An
 * event recorded in the same stream after earlier halves, or ordered after
 * them (mep_nccl_sent_order), covers those too. Work in CUDA graphs the
 * engine launches is the engine's to have finished. 1 when everything
 * ended (or the device reports an error: nothing more of it will run), 0
 * when the bound passed first. */
int mep_nccl_await_sent(const mep_nccl_sent_t *const *sent, int n, int timeout_ms);
/* One event (cudaEvent_t) the same way: 1 when it completed, 0 when
 * timeout_ms passed first. */
int mep_nccl_await_event(void *event, int timeout_ms);
/* Teardown's first step: whether the group's memory can be freed.
 *  - A CUDA graph (or capture) still holding the group's calls
 *    (graph_watch.h, after MEP_NCCL_GRAPH_GRACE_MS) is logged at WARN:
 *    moe_ep.h lets it outlive the group as long as it is never launched
 *    again.
 *  - The group's last eager kernels (mep_nccl_await_sent) must end within
 *    bootstrap.timeout_ms: 1 when they did; 0, with *st the TIMEOUT
 *    sentence saying what is left allocated, when they did not. With
 *    raise_abort set (a failed group) and a kernel still running,
 *    raise_abort(ctx, s) first runs on a stream of its own
 *    (mep_nccl_on_side_stream), so waiting kernels give up at their next
 *    check. */
int mep_nccl_quiesce(const moe_ep_group_t *g, struct mep_nccl *nccl,
                     const mep_nccl_sent_t *const *sent, int n,
                     void (*raise_abort)(void *ctx, cudaStream_t stream), void *ctx,
                     moe_ep_status_t *st);
/* How long teardown waits, when graphs holding the group's calls are
 * alive, for CUDA's release of those destroyed just before it (CUDA
 * releases them on a thread of its own). */
#define MEP_NCCL_GRAPH_GRACE_MS 200
/* The backends' last teardown step: nccl's communicator side torn down
 * (ended: the group's kernels ended, mep_nccl_await_sent) or abandoned
 * (they may still run). Returns st, or, when st is OK and the teardown
 * left the window in place (mep_nccl_destroy), TIMEOUT saying so. */
moe_ep_status_t mep_nccl_release(const moe_ep_group_t *g, struct mep_nccl *nccl, int ended, int abort,
                                 moe_ep_status_t st);

/* prepare's optional layout outputs (h->out_*): one kernel on the
 * caller's stream, no sync and no allocation, so prepare may be captured
 * in a CUDA graph. Both modes compute them alike. */
moe_ep_status_t mep_nccl_prepare_layout(moe_ep_group_t *g, struct mep_nccl *nccl, int device,
                                        mep_handle_state_t *h);

/* The kernels' LSA addressing (base, stride, local; mep_ll_lsa_from_desc)
 * from nccl's window descriptor, read back on its setup stream within the
 * setup bound (nccl_setup.h). Sentences name `rank`. */
struct mep_nccl;
moe_ep_status_t mep_nccl_resolve_lsa(struct mep_nccl *nccl, int rank, uint64_t *base,
                                     uint64_t *stride, uint64_t *local);

/* NCCL's unique id travels over the UCX bootstrap (user: mep_bootstrap_t). */
moe_ep_status_t mep_nccl_share_uid(void *user, int32_t rank, int32_t world, void *uid,
                                   size_t bytes);

#ifdef __cplusplus
}
#endif

#endif /* MEP_NCCL_COMMON_H_ */
