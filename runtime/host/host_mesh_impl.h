/* host_mesh_impl.h: the host mesh's internal state, shared by the sending
 * side (host_mesh.c) and the active-message receiver (host_mesh_recv.c). */
#ifndef MEP_HOST_MESH_IMPL_H_
#define MEP_HOST_MESH_IMPL_H_

#include <stdint.h>
#include <ucp/api/ucp.h>

#include "runtime/host/host_mesh.h"

/* The bootstrap owns active-message id 63 on the same worker. */
#define MEP_HOST_AM_ID 62u

enum { MEP_HOST_MSG_PUT = 1, MEP_HOST_MSG_SIGNAL = 2 };

/* Header of every data-path message: "write these bytes (or this 64-bit
 * value) at this offset of my region", from rank src. */
typedef struct mep_host_msg {
  uint64_t offset;
  uint64_t value; /* SIGNAL only */
  int32_t src;
  int32_t kind;
} mep_host_msg_t;

typedef struct mep_host_signal {
  uint64_t offset, value;
} mep_host_signal_t;

/* Per source rank on the receiving side: rendezvous receives still landing,
 * and the signals that arrived behind them (applied once they land, so a
 * signal never overtakes the data it announces). */
typedef struct mep_host_source {
  struct mep_host_mesh *mesh;
  int rank;
  int inflight;
  mep_host_signal_t *queued;
  size_t nqueued, capqueued;
} mep_host_source_t;

typedef struct mep_host_peer {
  struct mep_host_mesh *mesh;
  ucp_ep_h ep;
  int failed; /* set by the endpoint error callback */
  ucs_status_t fail_status;
} mep_host_peer_t;

struct mep_host_mesh {
  mep_bootstrap_t *bs;
  ucp_worker_h worker;
  int rank, world;
  int timeout_ms;
  int64_t deadline_ns; /* of the current send or receive half */
  uint8_t *region;
  size_t region_bytes;
  int handler_set;
  mep_host_peer_t *peers;
  mep_host_source_t *sources;
  int first_failed;        /* first peer whose endpoint failed, or -1 */
  int recv_error;          /* a malformed message or failed receive */
  char recv_error_msg[256];
  void **reqs;             /* outstanding sends */
  mep_host_msg_t **req_hdr; /* their headers (UCX reads them until done) */
  int *req_peer;
  size_t nreqs, reqcap;
};

/* host_mesh_recv.c */
moe_ep_status_t mep_host_mesh_recv_start(struct mep_host_mesh *m);
void mep_host_mesh_recv_stop(struct mep_host_mesh *m);

#endif /* MEP_HOST_MESH_IMPL_H_ */
