/* nccl_setup.h: the NCCL side of an nccl-backend group: communicator (created
 * from a unique id exchanged through a caller callback, or adopted from the
 * engine), version check, the symmetric LL window, the device communicator,
 * and the transport chosen for each peer. Plain C; teardown in reverse. */
#ifndef MEP_NCCL_SETUP_H_
#define MEP_NCCL_SETUP_H_

#include <stddef.h>
#include <stdint.h>

#include "moe_ep.h"
#include "runtime/nccl/graph_watch.h"

#ifdef __cplusplus
extern "C" {
#endif


/* Shares rank 0's unique id: on rank 0 `uid` holds the id to publish; on
 * every other rank the callback fills it. Returns OK or an error it has
 * written with mep_error(). Called once per create, never after a failure. */
typedef moe_ep_status_t (*mep_nccl_uid_exchange_fn)(void *user, int32_t rank, int32_t world,
                                                    void *uid, size_t uid_bytes);

typedef struct mep_nccl_params {
  int32_t rank;
  int32_t world;
  int32_t cuda_device;       /* < 0: current device */
  int32_t transport;         /* moe_ep_transport_t */
  uint64_t window_bytes;     /* symmetric buffer (e.g. mep_ll_buffer_bytes) */
  /* Bytes instead of window_bytes when the peers turn out to need the
   * staged transports' layout (transport auto: GIN across NVLink domains,
   * or gin_emulated over an LSA team not on NVLink), whose LSA form is
   * smaller; 0: window_bytes whatever the peers. */
  uint64_t window_bytes_gin;
  int32_t gin_signal_count;  /* GIN signals the kernels use (both sets) */
  int32_t reserved0;
  void *adopt_comm;          /* engine's ncclComm_t, borrowed; NULL: create */
  mep_nccl_uid_exchange_fn exchange; /* required when adopt_comm is NULL */
  void *exchange_user;
  /* 1 (LL): the LSA team must be on NVLink (lsa_link.h), checked under
   * lsa_link_policy with transport lsa or auto: lsa is refused, and auto
   * takes gin_emulated to the team's peers (window_bytes_gin), where any
   * link is PCIe or unknown. 0: no check (HT). */
  int32_t lsa_link_check;
  int32_t lsa_link_policy; /* mep_lsa_link_policy_t */
  /* > 0: how long each collective setup or teardown step waits for the
   * other ranks (the group's bootstrap.timeout_ms). A communicator created
   * here is nonblocking, so every one of its steps is bounded; an adopted
   * one bounds the setup collectives' stream waits, while its other calls
   * block as the engine configured it. */
  int32_t timeout_ms;
} mep_nccl_params_t;

typedef struct mep_nccl mep_nccl_t; /* opaque */

/* Collective over the group. On success *out is owned by the caller and
 * released with mep_nccl_destroy (collective too). The window is zeroed
 * and every rank has zeroed its own before this returns on any rank. */
moe_ep_status_t mep_nccl_create(const mep_nccl_params_t *params, mep_nccl_t **out);
/* Accepts NULL. Does not destroy an adopted communicator. Returns 1 when
 * everything was released; 0 when a teardown step on an adopted
 * communicator failed or did not end in time (or the setup stream did not
 * drain), so the window, device memory and staging were left allocated
 * (and, adopted, registered on the engine's communicator) for the life of
 * the process; the caller reports it (mep_nccl_release). No kernel may
 * still use the window or the backends' device memory: the backend waits
 * for its last work first (mep_nccl_await_sent), and calls
 * mep_nccl_abandon instead when that does not end. Nothing here waits for
 * the whole device (no cudaDeviceSynchronize, cudaFree or cudaFreeHost),
 * so other work of the engine's does not hold it; NCCL's own teardown of a
 * communicator of its own may.
 * abort != 0 (a failed group: peers may be gone or stuck): the owned
 * communicator is aborted (ncclCommAbort releases its windows and device
 * communicators without waiting for peers) instead of the collective
 * teardown. An adopted communicator belongs to the engine and is never
 * aborted here; its window is deregistered as usual. */
int mep_nccl_destroy(mep_nccl_t *nccl, int abort);
/* The group's kernels may still run (they wait behind work the engine
 * queued first): frees this side's host state only. The communicator, the
 * window, the device memory and the pinned staging stay as they are, for
 * the life of the process. Accepts NULL. */
void mep_nccl_abandon(mep_nccl_t *nccl);

/* The backends' own setup work on the setup stream (nonblocking), each
 * waited for within params' timeout_ms (TIMEOUT naming `what` past it), so
 * it neither queues behind the engine's GPU work nor races the engine's
 * streams: zeroing device memory, and reading back up to
 * MEP_NCCL_SCRATCH_MIN bytes of device memory. */
#define MEP_NCCL_SCRATCH_MIN 64
moe_ep_status_t mep_nccl_zero(mep_nccl_t *nccl, void *dev, size_t bytes, const char *what);
/* Device memory for a backend's state, zeroed: allocated in stream order
 * on the setup stream (cudaMallocAsync) and waited for, so it is usable on
 * every stream, and freed the same way (mep_nccl_free, before
 * mep_nccl_destroy), which unlike cudaFree does not wait for the whole
 * device. */
moe_ep_status_t mep_nccl_alloc_zeroed(mep_nccl_t *nccl, void **dev, uint64_t bytes,
                                      const char *what);
void mep_nccl_free(mep_nccl_t *nccl, void *dev); /* accepts NULL dev */
moe_ep_status_t mep_nccl_read_back(mep_nccl_t *nccl, void *host, const void *dev, size_t bytes,
                                   const char *what);

void *mep_nccl_comm(const mep_nccl_t *nccl);             /* ncclComm_t */
const void *mep_nccl_dev_comm(const mep_nccl_t *nccl);   /* struct ncclDevComm */
void *mep_nccl_window(const mep_nccl_t *nccl);           /* ncclWindow_t */
void *mep_nccl_window_local(const mep_nccl_t *nccl);     /* local device pointer */
uint64_t mep_nccl_bytes_allocated(const mep_nccl_t *nccl);
/* The captures and graphs that hold the group's calls (graph_watch.h). */
mep_graph_watch_t *mep_nccl_graphs(const mep_nccl_t *nccl);
int32_t mep_nccl_lsa_size(const mep_nccl_t *nccl);
/* moe_ep_transport_t for each of `len` world ranks (self included). */
void mep_nccl_peer_transports(const mep_nccl_t *nccl, int32_t *out, int32_t len);
/* 1 for each of `len` world ranks in this rank's LSA team. */
void mep_nccl_peer_nvlink(const mep_nccl_t *nccl, int32_t *out, int32_t len);
/* The worst link between GPUs of an LSA team in the group
 * (mep_lsa_link_t), as the check found it; NVLink where unchecked. */
int32_t mep_nccl_lsa_link(const mep_nccl_t *nccl);

#ifdef __cplusplus
}
#endif

#endif /* MEP_NCCL_SETUP_H_ */
