/* host_mesh_impl.h: the host mesh's internal state, shared by the API side
 * (host_mesh.c), the progress thread (host_mesh_thread.c), the receiver it
 * runs (host_mesh_recv.c) and the failure sentences (host_mesh_blame.c).
 *
 * Threading: while the progress thread runs, it alone calls into UCX (the
 * worker, endpoints, requests) and writes the region; the API thread only
 * queues commands and waits. Everything both threads touch is either under
 * `lock` or an atomic (the region's signal words, `last_op`). */
#ifndef MEP_HOST_MESH_IMPL_H_
#define MEP_HOST_MESH_IMPL_H_

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <ucp/api/ucp.h>

#include "runtime/bootstrap.h"
#include "runtime/hmac.h"
#include "runtime/host/host_mesh.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The mesh has a UCX context and worker of its own, so the id only has to
 * be unique within it. */
#define MEP_HOST_AM_ID 1u

enum {
  MEP_HOST_MSG_PUT = 1,
  MEP_HOST_MSG_SIGNAL = 2,
  MEP_HOST_MSG_HELLO = 3, /* wire-up probe; answered with HELLO_ACK */
  MEP_HOST_MSG_HELLO_ACK = 4,
  MEP_HOST_MSG_BYE = 5, /* the sender is destroying its group */
  MEP_HOST_MSG_BYE_ACK = 6
};

/* The mesh's UCX worker accepts connections from any UCX process that
 * reaches its port, and UCX ties a message to an endpoint by an id the
 * packet carries, so nothing about how a message arrived says who sent
 * it. Each ordered pair of ranks (src, dst) has a key of its own, derived
 * by both from the job token, the group and both ranks' worker addresses
 * (mep_bootstrap_derive; it never travels), and every message carries its
 * number among src's messages to dst and a tag under that key over its
 * header. The receiver checks the tag and the number before it believes
 * anything in the header; what fails is counted and dropped, its data
 * unread. The tag covers the header, not the data: a reader of the
 * network can neither forge a message nor replay one that was taken, but
 * one who can change packets in flight, or send a copy of a header with
 * other data before the real message is taken (which is then dropped as
 * a replay), can change a put's bytes. */
#define MEP_HOST_TAG_BYTES 16
/* Messages from outside the group logged at WARN; the rest are counted. */
#define MEP_HOST_STRANGERS_LOGGED 16
/* How far below the highest number taken from a source a number may be
 * and still be taken (once): a source's messages leave in number order,
 * and UCX's lanes may reorder a few. */
#define MEP_HOST_SEQ_WINDOW 64

/* Header of every data-path message: "write these bytes (or this 64-bit
 * value) at this offset of my region", from rank src to rank dst. No
 * padding: the tag is over the bytes before it, as they are. */
typedef struct mep_host_msg {
  uint64_t seq; /* src's messages to dst: 1, 2, ... */
  uint64_t offset;
  uint64_t value; /* SIGNAL only */
  uint64_t bytes; /* the data that follows (a PUT's); 0 for the rest */
  int32_t src;
  int32_t dst;
  int32_t kind;
  uint32_t zero;
  uint8_t tag[MEP_HOST_TAG_BYTES]; /* mep_host_msg_seal */
} mep_host_msg_t;

/* The bytes the tag covers: the whole header before it. */
#define MEP_HOST_MSG_TAGGED offsetof(mep_host_msg_t, tag)

/* A direction's key, made ready once (hmac.h): a tag then costs two
 * SHA-256 blocks, not four. */
typedef mep_hmac_key_t mep_host_key_t;

typedef struct mep_host_signal {
  uint64_t offset, value;
} mep_host_signal_t;

/* Per source rank, on the thread that drives the worker (the progress
 * thread; the API thread before it starts and after it is joined, where
 * on_ep_error may run too): rendezvous receives still landing,
 * and the signals that arrived behind them (applied once they land, so a
 * signal never overtakes the data it announces). */
typedef struct mep_host_source {
  struct mep_host_mesh *mesh;
  int rank;
  mep_host_key_t key_in; /* what its messages to this rank are tagged under */
  uint64_t seq_top;      /* the highest number taken from it */
  uint64_t seq_seen;     /* bit i: number seq_top - i taken (i < 64) */
  int inflight;
  mep_host_signal_t *queued;
  size_t nqueued, capqueued;
  /* Its goodbye came while its data was still landing: the goodbye takes
   * effect (peer said_bye) once the signals before it are applied. */
  int bye_pending;
} mep_host_source_t;

/* One queued send: the API thread fills it, the progress thread issues it;
 * UCX reads `hdr` and `data` until the send completes. */
typedef struct mep_host_cmd {
  struct mep_host_mesh *mesh;
  mep_host_msg_t hdr;
  int peer;
  const void *data;
  size_t bytes;
  int counted; /* completes one of the API thread's sends (not a HELLO_ACK) */
  struct mep_host_cmd *next;
} mep_host_cmd_t;

/* What is known about a peer's connection; under the mesh lock. */
typedef struct mep_host_peer {
  struct mep_host_mesh *mesh;
  mep_host_key_t key_out;  /* what messages to it are tagged under; set before any send */
  uint64_t sent;           /* the number of the last message queued to it */
  ucp_ep_h ep;             /* progress thread (or API thread when stopped) */
  void *close_req;         /* its close in flight (mep_host_mesh_close_eps) */
  int failed;              /* the endpoint reported an error */
  ucs_status_t fail_status;
  /* It destroyed its group (BYE before the error). bye_heard: its
   * goodbye arrived (sends to it are pointless from then on); said_bye:
   * and every signal it sent before the goodbye is applied, so last_op
   * holds its last (what waits go by). */
  int bye_heard;
  int said_bye;
  int acked;               /* it answered this rank's HELLO */
  int bye_acked;           /* it saw this rank's BYE */
  int send_failed;         /* a send to it completed with an error */
  ucs_status_t send_status;
  int64_t unsent;          /* counted sends to it not yet complete */
} mep_host_peer_t;

struct mep_host_mesh {
  int rank, world;
  int timeout_ms;
  int log_level; /* the group's, for the progress thread (-1: none known) */
  int64_t deadline_ns; /* of the current send or receive half; API thread */
  uint8_t *region;
  size_t region_bytes;
  ucp_context_h context;
  ucp_worker_h worker;
  int handler_set;
  uint8_t *address;                /* this rank's worker address, as its peers got it */
  size_t address_len;
  uint64_t strangers;              /* messages dropped unauthenticated; atomic */
  /* Every key is derived: until then the receiver takes nothing. Set on
   * the API thread before the progress thread starts. */
  int keyed;
  mep_host_source_t *sources; /* progress thread */
  int landed;                 /* progress thread: a signal landed this round */
  /* The highest operation number (signal value) applied from each source:
   * signals from one source arrive in order, so a waiter that sees a later
   * one knows the signal it waits for will never come. Atomic. */
  uint64_t *last_op;
  /* Receive halves that finished reading the region (release); the
   * progress thread acquires it before landing a put, so a peer's later
   * put into a set is ordered after this rank's reads of it, for
   * ThreadSanitizer too (its real order comes from the protocol). */
  uint64_t reads_done;

  pthread_t thread;
  int thread_started;
  int epoll_fd, wake_fd, worker_fd;

  pthread_mutex_t lock; /* guards everything below, and peers[] state */
  pthread_cond_t cond;  /* broadcast when a signal lands or state changes */
  int lock_ready;
  mep_host_cmd_t *queue_head, *queue_tail;
  int stop;
  /* mep_host_mesh_quiesce: 1 asks the progress thread to force-close every
   * endpoint, 2 once it has (sends to a closed endpoint end as canceled). */
  int cut;
  uint64_t issued, completed; /* counted sends */
  mep_host_peer_t *peers;
  /* First peer whose endpoint failed without a goodbye before it (it
   * died: every operation is doomed), or -1. A peer that said goodbye
   * dooms only the operations it left before (mep_host_mesh_ops.c). */
  int first_failed;
  int recv_error;   /* a malformed message or failed receive */
  char recv_error_msg[256];
  mep_host_msg_t last_sent; /* the latest header queued (mep_host_mesh_keep_sent) */
};

/* Test-only seam: 0 (the default): no effect. Set before a mesh is made,
 * each header the mesh queues is also copied, sealed, into its last_sent
 * under the lock: what one reading the network sees of it. Nothing in
 * the product sets it, and libmoe_ep.so does not export it. */
extern int mep_host_mesh_keep_sent;

/* host_mesh_seal.c: keys, tags and numbers */
/* Derives the keys between this rank and `peer` (whose worker address is
 * peer_addr): peers[peer].key_out and sources[peer].key_in. */
moe_ep_status_t mep_host_mesh_derive_keys(struct mep_host_mesh *m, const mep_bootstrap_t *bs,
                                          int peer, const void *peer_addr, size_t peer_len);
/* The key's hash states (MEP_BOOTSTRAP_KEY_BYTES of key). */
void mep_host_key_init(mep_host_key_t *k, const uint8_t *key);
/* Fills h->tag: HMAC-SHA-256 under k of the header before the tag,
 * truncated. */
void mep_host_msg_seal(const mep_host_key_t *k, mep_host_msg_t *h);
/* 1 when h->tag is the tag of h under k; time independent of where it
 * differs. */
int mep_host_msg_sealed(const mep_host_key_t *k, const mep_host_msg_t *h);
/* For a sealed message: 1 when its number is new from this source (then
 * recorded), 0 for a replay, a zero number, or one MEP_HOST_SEQ_WINDOW or
 * more below the highest taken. */
int mep_host_seq_fresh(mep_host_source_t *s, uint64_t seq);
/* Wipes every key (destroy). */
void mep_host_mesh_forget_keys(struct mep_host_mesh *m);

/* host_mesh_recv.c (progress thread) */
moe_ep_status_t mep_host_mesh_recv_start(struct mep_host_mesh *m);
void mep_host_mesh_recv_stop(struct mep_host_mesh *m);

/* host_mesh_thread.c */
moe_ep_status_t mep_host_mesh_thread_start(struct mep_host_mesh *m);
void mep_host_mesh_thread_stop(struct mep_host_mesh *m); /* joins; accepts never started */
/* host_mesh.c: force-closes every peer's endpoint, all at once under one
 * bound of 1 s, by whichever thread drives the worker; their outstanding
 * sends end as canceled. */
void mep_host_mesh_close_eps(struct mep_host_mesh *m);
/* Queues a send; `counted` sends are what mep_host_mesh_complete waits
 * for. Takes the lock itself; the progress thread may call it too. */
moe_ep_status_t mep_host_mesh_enqueue(struct mep_host_mesh *m, int peer, int kind,
                                      uint64_t offset, uint64_t value, const void *data,
                                      size_t bytes, int counted);
/* As mep_host_mesh_enqueue, reporting nothing: -1 when out of memory. */
int mep_host_mesh_enqueue_quiet(struct mep_host_mesh *m, int peer, int kind, uint64_t offset,
                                uint64_t value, const void *data, size_t bytes, int counted);
/* Wakes waiters after the progress thread changed shared state. */
void mep_host_mesh_notify(struct mep_host_mesh *m);
int64_t mep_host_now_ns(void);

/* host_mesh_blame.c: the failure sentences, each naming the reporting rank
 * and the rank that failed. Called with the lock held. */
moe_ep_status_t mep_host_blame_lost(struct mep_host_mesh *m, int peer, const char *what);
moe_ep_status_t mep_host_blame_ahead(struct mep_host_mesh *m, int peer, uint64_t want,
                                      uint64_t last, const char *what);
moe_ep_status_t mep_host_blame_absent(struct mep_host_mesh *m, int peer, uint64_t want,
                                      uint64_t last, const char *what);
moe_ep_status_t mep_host_blame_not_receiving(struct mep_host_mesh *m, const char *what);
moe_ep_status_t mep_host_blame_unread(struct mep_host_mesh *m, int peer, uint64_t want,
                                      const char *what);
moe_ep_status_t mep_host_blame_recv_error(struct mep_host_mesh *m, const char *what);

#ifdef __cplusplus
}
#endif

#endif /* MEP_HOST_MESH_IMPL_H_ */
