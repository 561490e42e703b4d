/* backend.h: what a backend (host over UCX, nccl on GPUs) implements behind
 * the group. The common runtime validates every argument first, so a
 * backend sees only well-formed requests, and owns hooks / buffer sets. */
#ifndef MEP_BACKEND_H_
#define MEP_BACKEND_H_

#include <stdint.h>

#include "moe_ep.h"
#include "runtime/op.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mep_backend_ops {
  const char *name;
  /* Whether hook_free of an unrun hook leaves the group consistent. */
  int abandon_is_safe;
  /* Optional, where abandon_is_safe: told of the abandoned receive (under
   * the group lock) so that what that receive would have ordered is still
   * ordered. */
  void (*abandon)(moe_ep_group_t *group, const mep_op_t *op);
  /* The most ranks a group may have, 0 for MEP_MAX_RANKS: group_create
   * and buffer_size_hint refuse more with UNSUPPORTED. */
  int max_ranks;
  /* Exact bytes of communication buffers for the config and world size. */
  uint64_t (*buffer_bytes)(const moe_ep_config_t *cfg, int world_size);
  /* Collective. Sets group->impl; on failure leaves nothing allocated. */
  moe_ep_status_t (*create)(moe_ep_group_t *group);
  /* Accepts impl == NULL. Frees everything, or returns an error sentence
   * for what it had to leave (a backend whose kernels had not ended). */
  moe_ep_status_t (*destroy)(moe_ep_group_t *group);
  /* Routing layout (HT exchanges counts here). */
  moe_ep_status_t (*prepare)(moe_ep_group_t *group, mep_handle_state_t *h);
  /* Optional, for a prepare that is collective: this rank refused the call
   * before `prepare` (bad arguments); joins the exchange marked refused, so
   * the peers' prepares fail naming this rank instead of waiting for it. */
  moe_ep_status_t (*prepare_refused)(moe_ep_group_t *group);
  /* Optional: this rank refused a dispatch or combine before sending
   * anything (bad arguments) and reads no buffer set any more (no hook
   * pending). Takes the operation's place (op: kind, seq, buffer_set):
   * tells every peer, whose receive of it then fails naming this rank,
   * instead of waiting for it until timeouts.kernel_ms and failing the
   * group. */
  moe_ep_status_t (*op_refused)(moe_ep_group_t *group, const mep_op_t *op);
  /* Send half of an operation into buffer set op->buffer_set. */
  moe_ep_status_t (*send)(moe_ep_group_t *group, mep_op_t *op);
  /* Receive half; for deferred ops it runs from hook_run, maybe on another
   * thread (the runtime holds the group lock). */
  moe_ep_status_t (*recv)(moe_ep_group_t *group, mep_op_t *op);
  /* Optional: both halves at once for an op that is not deferred (the nccl
   * backend launches one fused kernel instead of two); NULL = send, recv. */
  moe_ep_status_t (*send_recv)(moe_ep_group_t *group, mep_op_t *op);
  /* Optional: the receive's checks of hook_run's stream (op->stream),
   * asked before the hook counts as run: a refusal (INVALID_ARGUMENT: a
   * stream CUDA refuses, of another GPU or context, or a capture the
   * receive cannot run in) leaves the hook pending, to be run on another
   * stream, where a refusal inside `recv`, after the send half went out,
   * would fail the group or abandon the receive. */
  moe_ep_status_t (*check_recv)(moe_ep_group_t *group, const mep_op_t *op);
  /* OK or the recorded asynchronous error. */
  moe_ep_status_t (*poll_error)(moe_ep_group_t *group);
  /* Transport used to reach each peer (moe_ep_transport_t). */
  int (*peer_transport)(const moe_ep_group_t *group, int peer);
  /* Optional (NULL: the entry returns UNSUPPORTED): an LL handle's slot
   * layout (moe_ep.h, handle_layout). Called under the group lock with
   * validated outputs (either may be NULL) for a handle whose dispatch
   * receive completed; the backend refuses, through its layout book, a
   * handle whose buffer set a later dispatch reused. */
  moe_ep_status_t (*handle_layout)(moe_ep_group_t *group, mep_handle_state_t *h,
                                   int32_t *src_info, int64_t *layout_range, void *stream);
} mep_backend_ops_t;

extern const mep_backend_ops_t mep_host_backend;
extern const mep_backend_ops_t mep_nccl_backend;    /* low_latency */
extern const mep_backend_ops_t mep_nccl_ht_backend; /* high_throughput */

/* The backend a config asks for; `auto` is nccl when this process sees a
 * CUDA device, else host. Sets *resolved to the concrete
 * moe_ep_backend_t. */
moe_ep_status_t mep_backend_select(int requested, int mode, const mep_backend_ops_t **ops,
                                   int *resolved);

#ifdef __cplusplus
}
#endif

#endif /* MEP_BACKEND_H_ */
