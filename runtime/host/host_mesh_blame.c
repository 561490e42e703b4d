/* host_mesh_blame.c: every failure sentence of the host data path. Each
 * names the rank that reports it and the rank that failed, and says what
 * happened to that rank: it died, it left (destroyed its group), it is
 * ahead (it already signalled this operation elsewhere, or a later one),
 * or it is alive but absent (connected, yet silent until
 * timeouts.kernel_ms).
 * Operation numbers are the group's operation counter (signal value - 1). */
#include "runtime/error.h"
#include "runtime/host/host_mesh_impl.h"

moe_ep_status_t mep_host_blame_lost(struct mep_host_mesh *m, int peer, const char *what) {
  if (m->peers[peer].bye_heard) {
    return mep_error(MOE_EP_ERR_PEER_FAILED,
                     "%s: rank %d lost rank %d: rank %d left the group (it destroyed its "
                     "group) while rank %d still needed it for this operation",
                     what, m->rank, peer, peer, m->rank);
  }
  return mep_error(MOE_EP_ERR_PEER_FAILED,
                   "%s: rank %d lost rank %d: rank %d died (its connection to rank %d "
                   "closed without a goodbye: the process exited or was killed, or the "
                   "link failed)",
                   what, m->rank, peer, peer, m->rank);
}

/* The peer has signalled operation `last` >= `want`, but not `want` into
 * this word: it has moved past this point on a different path. */
moe_ep_status_t mep_host_blame_ahead(struct mep_host_mesh *m, int peer, uint64_t want,
                                      uint64_t last, const char *what) {
  return mep_error(MOE_EP_ERR_MISMATCH,
                   "%s: rank %d is ahead of rank %d: its signals to rank %d have reached its "
                   "operation %llu, but its operation %llu was not the one rank %d waits for "
                   "here; rank %d ran an operation that rank %d did not, or started the next "
                   "one into this buffer set before rank %d ran its hook (with double_buffer: "
                   "false every rank must run each hook before any rank starts the next "
                   "operation)",
                   what, peer, m->rank, m->rank, (unsigned long long)(last - 1),
                   (unsigned long long)(want - 1), m->rank, peer, m->rank, m->rank);
}

moe_ep_status_t mep_host_blame_absent(struct mep_host_mesh *m, int peer, uint64_t want,
                                      uint64_t last, const char *what) {
  if (last == 0) {
    return mep_error(MOE_EP_ERR_TIMEOUT,
                     "%s: rank %d waited timeouts.kernel_ms=%d for rank %d's operation %llu; "
                     "rank %d is alive (connected) but did not take part in the operation: "
                     "it has signalled nothing to rank %d since the group formed",
                     what, m->rank, m->timeout_ms, peer, (unsigned long long)(want - 1), peer,
                     m->rank);
  }
  return mep_error(MOE_EP_ERR_TIMEOUT,
                   "%s: rank %d waited timeouts.kernel_ms=%d for rank %d's operation %llu; "
                   "rank %d is alive (connected) but did not take part in the operation: "
                   "its latest signal to rank %d was for its operation %llu (it is behind)",
                   what, m->rank, m->timeout_ms, peer, (unsigned long long)(want - 1), peer,
                   m->rank, (unsigned long long)(last - 1));
}

/* The peer took part in operation `want` but has not finished reading
 * what this rank sent it there (mep_host_mesh_wait_read). */
moe_ep_status_t mep_host_blame_unread(struct mep_host_mesh *m, int peer, uint64_t want,
                                      const char *what) {
  return mep_error(MOE_EP_ERR_TIMEOUT,
                   "%s: rank %d waited timeouts.kernel_ms=%d for rank %d to finish reading rank "
                   "%d's operation %llu in this buffer set, which this dispatch would overwrite; "
                   "rank %d is alive (connected) but has not run that receive (its hook is "
                   "still pending, or its process is stalled)",
                   what, m->rank, m->timeout_ms, peer, m->rank, (unsigned long long)(want - 1),
                   peer);
}

moe_ep_status_t mep_host_blame_not_receiving(struct mep_host_mesh *m, const char *what) {
  int peer = 0;
  while (peer + 1 < m->world && m->peers[peer].unsent == 0) peer++;
  return mep_error(MOE_EP_ERR_TIMEOUT,
                   "%s: rank %d's sends to rank %d did not complete within "
                   "timeouts.kernel_ms=%d although the connection is up: rank %d is not "
                   "receiving (its process is stopped or starved)",
                   what, m->rank, peer, m->timeout_ms, peer);
}

moe_ep_status_t mep_host_blame_recv_error(struct mep_host_mesh *m, const char *what) {
  return mep_error(MOE_EP_ERR_UCX, "%s: rank %d: %s", what, m->rank, m->recv_error_msg);
}
