/* host_mesh.h: the host backend's put/signal/wait transport over UCX: a
 * full mesh of endpoints on a UCX worker of the mesh's own, one region per
 * rank, puts and 64-bit signals to (peer, offset) carried as active
 * messages, and bounded waits on local signals. A progress thread of the
 * mesh lands peers' data, so a rank's operation completes even while its
 * peers are busy outside moe-ep. It mirrors the GPU transports' put +
 * signal design: a signal is seen only after the puts sent before it. */
#ifndef MEP_HOST_MESH_H_
#define MEP_HOST_MESH_H_

#include <stddef.h>
#include <stdint.h>

#include "moe_ep.h"
#include "runtime/bootstrap.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mep_host_mesh mep_host_mesh_t;

/* Collective: allocates `region_bytes` on every rank, connects to every
 * peer (self included) with a round trip each, and starts the progress
 * thread; the worker's address is exchanged over the bootstrap. */
moe_ep_status_t mep_host_mesh_create(mep_bootstrap_t *bs, size_t region_bytes,
                                     int timeout_ms, mep_host_mesh_t **out);
/* Tells the peers this rank leaves, stops and joins the progress thread,
 * frees everything. Accepts NULL. */
void mep_host_mesh_destroy(mep_host_mesh_t *m);

uint8_t *mep_host_mesh_local(mep_host_mesh_t *m);

/* The mesh worker's UCX address, as this rank's peers connect to it; valid
 * until destroy. */
const void *mep_host_mesh_address(const mep_host_mesh_t *m, size_t *len);
/* Messages this rank dropped because it could not authenticate them as
 * its group's (from outside the group, or replayed); safe from any
 * thread. */
uint64_t mep_host_mesh_strangers(const mep_host_mesh_t *m);

/* Starts the clock of one send or receive half: every wait in it shares
 * one deadline, timeouts.kernel_ms from now. */
void mep_host_mesh_begin(mep_host_mesh_t *m);

/* Starts a put of src[0, bytes) to peer's region at remote_off. src must
 * stay valid until mep_host_mesh_complete returns. */
moe_ep_status_t mep_host_mesh_put(mep_host_mesh_t *m, int peer, const void *src,
                                  size_t bytes, size_t remote_off);
/* Writes the 64-bit value at peer's remote_off; the peer sees it only
 * after every put this rank sent it before. */
moe_ep_status_t mep_host_mesh_signal(mep_host_mesh_t *m, int peer,
                                     size_t remote_off, uint64_t value);
/* As mep_host_mesh_signal, for a signal whose failure is another wait's to
 * report: sets no error. A peer already lost is skipped (what waits on it
 * reports that); a send that fails is reported by this rank's next
 * mep_host_mesh_complete. */
void mep_host_mesh_signal_quiet(mep_host_mesh_t *m, int peer, size_t remote_off, uint64_t value);
/* Waits until every put and signal issued so far has left this rank (their
 * source buffers may be reused); bounded by the half's deadline. */
moe_ep_status_t mep_host_mesh_complete(mep_host_mesh_t *m, const char *what);
/* Waits until the local u64 at local_off equals value; `peer` is who
 * writes it (named in the error). Bounded by the half's deadline; fails at
 * once (MOE_EP_ERR_MISMATCH) when `peer` has already signalled this
 * operation elsewhere or a later one, since this signal cannot come. */
moe_ep_status_t mep_host_mesh_wait(mep_host_mesh_t *m, size_t local_off,
                                   uint64_t value, int peer, const char *what);
/* As mep_host_mesh_wait, also ended by the u64 at alt_off reaching value
 * instead (*took_alt = 1 then, else 0): a peer's other answer for the same
 * operation (its refusal). */
moe_ep_status_t mep_host_mesh_wait_either(mep_host_mesh_t *m, size_t local_off, size_t alt_off,
                                          uint64_t value, int peer, const char *what,
                                          int *took_alt);

/* Waits until the local u64 at local_off, or the one at alt_off, has
 * reached at least value: a word `peer` raises out of step with its
 * operations (it answers an earlier operation of this rank's after its own
 * later ones), so peers ahead are not an error here; bounded by the half's
 * deadline, and blamed on `peer` as not having read this rank's operation
 * value - 1. */
moe_ep_status_t mep_host_mesh_wait_read(mep_host_mesh_t *m, size_t local_off, size_t alt_off,
                                        uint64_t value, int peer, const char *what);

/* Waits until `peer` has signalled this rank for its operation value - 1
 * or a later one, whatever the signal (its sends of those operations have
 * started); bounded and blamed as mep_host_mesh_wait. */
moe_ep_status_t mep_host_mesh_wait_progress(mep_host_mesh_t *m, uint64_t value, int peer,
                                            const char *what);

/* After a failed send half: while any of its sends has not left, UCX may
 * still read the caller's buffers (the engine frees them once the call has
 * failed). Force-closes every endpoint, ending those sends as canceled, and
 * waits (bounded) for them; returns 0 when nothing was outstanding, 1 when
 * every send ended, 2 when some had not by the bound (UCX may still read
 * their buffers until the mesh is destroyed). The mesh is unusable after
 * 1 or 2. */
int mep_host_mesh_quiesce(mep_host_mesh_t *m);

/* A receive half has finished reading the region: peers' later puts land
 * after it. */
void mep_host_mesh_reads_done(mep_host_mesh_t *m);

#ifdef __cplusplus
}
#endif

#endif /* MEP_HOST_MESH_H_ */
