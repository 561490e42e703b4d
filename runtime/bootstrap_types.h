/* bootstrap_types.h: the bootstrap's internal state (struct mep_bootstrap,
 * peers, queued messages, send tracking), the wire header, and the helpers
 * shared by the bootstrap*.c files. Not part of any public interface. */
#ifndef MEP_BOOTSTRAP_TYPES_H_
#define MEP_BOOTSTRAP_TYPES_H_

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include <ucp/api/ucp.h>

#include "runtime/bootstrap.h"
#include "runtime/error.h"

/* The one active-message id the bootstrap registers on its worker. */
#define MEP_BS_AM_ID 63u
#define MEP_BS_MAGIC 0x4d455042u /* "MEPB" */
#define MEP_BS_VERSION 1u
/* Bounds the wire fields the handshake carries. */
#define MEP_BS_TOKEN_MAX 256
#define MEP_BS_REASON_MAX 512
/* Ranks in one group (per-peer arrays are sized by it) and the longest
 * bounded wait: the project-wide limits, one copy. */
#include "kernels/common/limits.h"
#define MEP_BS_MAX_RANKS MEP_MAX_RANKS
#define MEP_BS_MAX_TIMEOUT_MS MEP_MAX_TIMEOUT_MS

/* Memory bounds. Rank 0 listens on a port anyone can reach, so what a
 * connection may make it hold is bounded by what the protocol needs, and a
 * connection that goes past it is closed before anything is allocated.
 *
 * MEP_BS_PAYLOAD_MAX: the largest per-rank byte count of one allgather or
 * broadcast (the CONTRIB payload a rank sends per step). The product's
 * largest is the host backend's 4096-byte worker-address slot (then the
 * 1024-byte canonical config, 4 * world bytes of HT counts, NCCL's 128-byte
 * unique id); 64 KiB leaves 16x headroom. Larger collectives are refused
 * as bad arguments. */
#define MEP_BS_PAYLOAD_MAX (64u * 1024u)
/* Rank 0, per connection: a joined rank sends its next CONTRIB only after
 * the RESULT of the previous op, which rank 0 sends after taking that
 * CONTRIB, so one queued message is all a real rank ever has. A connection
 * that has not joined may queue one HELLO (token only). */
#define MEP_BS_CONN_QUEUE_MSGS 1
/* Non-zero ranks hear only rank 0, which may have ACCEPT, FORMED and a
 * RESULT (or REFUSE) in flight to a rank that has not looked yet. */
#define MEP_BS_ROOT_QUEUE_MSGS 3
/* Rank 0, all connections together: one full CONTRIB per rank plus one
 * HELLO for each of this many connections still waiting for a verdict
 * (bootstrap_msg.c: mep_bs_queue_cap). At 8 ranks that is about 0.6 MiB;
 * at the 1024-rank maximum about 64 MiB. */
#define MEP_BS_PENDING_HELLOS 64

typedef enum mep_bs_msg_type {
  MEP_BS_MSG_HELLO = 1,   /* joiner -> 0: rank, world, token */
  MEP_BS_MSG_ACCEPT = 2,  /* 0 -> joiner */
  MEP_BS_MSG_REFUSE = 3,  /* 0 -> joiner, payload: reason */
  MEP_BS_MSG_FORMED = 4,  /* 0 -> all: every rank joined */
  MEP_BS_MSG_ABORT = 5,   /* 0 -> all: status + reason; the group is dead */
  MEP_BS_MSG_CONTRIB = 6, /* joiner -> 0: one collective's input */
  MEP_BS_MSG_RESULT = 7   /* 0 -> joiner: that collective's output */
} mep_bs_msg_type_t;

typedef enum mep_bs_op {
  MEP_BS_OP_NONE = 0,
  MEP_BS_OP_ALLGATHER = 1,
  MEP_BS_OP_BROADCAST = 2,
  MEP_BS_OP_BARRIER = 3,
  MEP_BS_OP_AGREE = 4 /* an allgather of int32 statuses (mep_bootstrap_agree) */
} mep_bs_op_t;

/* Every message starts with this header; the payload follows it in the same
 * active message. Both ends are the same build, so host byte order. */
typedef struct mep_bs_hdr {
  uint32_t magic;
  uint16_t version;
  uint16_t type;       /* mep_bs_msg_type_t */
  int32_t src;         /* sender's rank */
  int32_t world_size;  /* sender's world size */
  uint64_t seq;        /* collective sequence number (1, 2, ...) */
  int32_t op;          /* mep_bs_op_t */
  int32_t root;        /* broadcast root */
  uint64_t bytes;      /* the op's per-rank byte count */
  int32_t status;      /* ABORT: moe_ep_status_t */
  int32_t failed_rank; /* ABORT: the rank that failed, or -1 */
  uint64_t payload_len;
} mep_bs_hdr_t;

typedef enum mep_bs_peer_state {
  MEP_BS_PEER_CONNECTING = 0, /* ep exists, no verdict yet */
  MEP_BS_PEER_JOINED = 1,     /* handshake accepted */
  MEP_BS_PEER_REFUSED = 2,    /* rank 0 said no; closing */
  MEP_BS_PEER_CLOSED = 3      /* ep closed (or never opened) */
} mep_bs_peer_state_t;

/* One endpoint: on rank 0 every accepted connection (strangers too), on the
 * others each attempt to reach rank 0. Freed only in destroy, after its ep
 * is closed, because the ep's error callback holds a pointer to it. */
typedef struct mep_bs_peer {
  struct mep_bs_peer *next;
  struct mep_bootstrap *bs;
  ucp_ep_h ep;
  int rank; /* -1 until the handshake names it; then fixed for life */
  int state;
  int failed;
  ucs_status_t fail_status;
  int64_t fail_ms;     /* when the failure was seen (mep_bs_now_ms) */
  /* Set when this side cut the connection (a protocol violation or a
   * memory bound): what the peer did, for the log and the failure text. */
  char why[160];
  int evict;           /* close at the next progress pass (not in a callback) */
  int queued_msgs;     /* messages from this peer not yet taken */
  size_t queued_bytes; /* their payload bytes */
  char name[64];       /* "127.0.0.1:40312" (rank 0: the client's address) */
  void *close_req; /* pending ucp_ep_close_nbx request */
} mep_bs_peer_t;

/* A received message; payload owned by the node. Its sender is the
 * connection it arrived on (`peer`), never the rank its header names. */
typedef struct mep_bs_msg {
  struct mep_bs_msg *next;
  mep_bs_hdr_t hdr;
  struct mep_bs_peer *peer;
  void *payload;
  size_t len;
  int ready;        /* 0 while a rendezvous receive is still in flight */
  void *rndv_desc;  /* rendezvous descriptor not yet handed to UCX */
  ucs_status_t rndv_status;
} mep_bs_msg_t;

/* A send in flight. The message buffer is a private copy, freed by whoever
 * sees the completion last, so a send abandoned at a deadline never reads
 * freed caller memory. */
typedef struct mep_bs_send {
  void *buf;
  int done;
  int orphaned;
  ucs_status_t status;
} mep_bs_send_t;

struct mep_bootstrap {
  int rank;
  int world_size;
  int timeout_ms;
  char address[MOE_EP_ADDRESS_MAX];
  char token[MEP_BS_TOKEN_MAX];
  struct sockaddr_storage saddr;
  socklen_t saddr_len;

  ucp_context_h context;
  ucp_worker_h worker;
  ucp_listener_h listener;
  /* Rank 0, once the group formed: the listener is closed (the accepted
   * connections of the other ranks hold the port until destroy, so the
   * kernel does not hand it out as an ephemeral port and the next group on
   * the same address can listen; a group of one never listens). */
  int formed;

  mep_bs_peer_t *peers;    /* every peer struct ever made (freed in destroy) */
  mep_bs_peer_t **by_rank; /* rank 0: joined peer per rank; others: [0] */
  mep_bs_msg_t *msgs;      /* received, not yet consumed */
  size_t queued_bytes;     /* payload + node bytes of msgs, all peers */
  size_t queue_cap;        /* bound on queued_bytes (mep_bs_queue_cap) */
  int evict_pending;       /* a peer awaits its close (mep_bs_peer_evict) */

  ucp_conn_request_h *conn_reqs; /* rank 0: connection requests to accept */
  int num_conn_reqs;
  int cap_conn_reqs;

  uint64_t seq;
  /* Sticky failure: once set, every later collective returns it. */
  moe_ep_status_t fail_status;
  char fail_msg[MEP_ERROR_MAX];
  /* ABORT received from rank 0 (non-root ranks). */
  int abort_seen;
  moe_ep_status_t abort_status;
  int abort_rank;
  char abort_msg[MEP_BS_REASON_MAX];
};

/* ---- bootstrap_addr.c ---- */
/* Parses "host:port" ("[v6]:port" too) into storage. */
moe_ep_status_t mep_bs_addr_parse(const char *address,
                                  struct sockaddr_storage *out,
                                  socklen_t *out_len);
/* Binds a plain socket to the address (as UCX's listener will) so a port in
 * use is reported with errno text instead of a UCX log line. */
moe_ep_status_t mep_bs_addr_check_bindable(const mep_bootstrap_t *bs);
/* 1 when something accepts TCP connections at the address now. */
int mep_bs_addr_probe(const mep_bootstrap_t *bs, int wait_ms);

/* ---- bootstrap_msg.c ---- */
int64_t mep_bs_now_ms(void);
/* One progress pass; sleeps briefly when idle (`idle` counts idle passes so
 * the sleep grows from nothing to 1 ms). */
void mep_bs_progress(mep_bootstrap_t *bs, int *idle);
moe_ep_status_t mep_bs_worker_setup(mep_bootstrap_t *bs);
/* Sends header + payload on peer's ep. With out == NULL the send is
 * fire-and-forget; otherwise *out must later go to mep_bs_send_wait or
 * mep_bs_send_release. */
ucs_status_t mep_bs_send(mep_bootstrap_t *bs, mep_bs_peer_t *peer,
                         const mep_bs_hdr_t *hdr, const void *payload,
                         mep_bs_send_t **out);
/* Waits until done or deadline (UCS_ERR_TIMED_OUT); releases the send. */
ucs_status_t mep_bs_send_wait(mep_bootstrap_t *bs, mep_bs_send_t *s,
                              int64_t deadline_ms);
void mep_bs_hdr_init(const mep_bootstrap_t *bs, mep_bs_hdr_t *hdr, int type);
/* Unlinks the first ready message of `type` that arrived on `from` (NULL =
 * any connection). */
mep_bs_msg_t *mep_bs_msg_take(mep_bootstrap_t *bs, int type,
                              const mep_bs_peer_t *from);
void mep_bs_msg_free(mep_bs_msg_t *m);
mep_bs_peer_t *mep_bs_peer_new(mep_bootstrap_t *bs);
/* ep params shared by both sides: PEER error mode + our error callback. */
void mep_bs_peer_ep_params(mep_bs_peer_t *peer, ucp_ep_params_t *p);
/* Cuts a connection that broke the protocol or a bound: records `why`,
 * marks it failed (a joined rank then fails the group naming it), logs at
 * WARN naming it, and closes it at the next progress pass. */
void mep_bs_peer_evict(mep_bootstrap_t *bs, mep_bs_peer_t *peer,
                       const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* "rank 3" for a joined peer, else "a connection from 127.0.0.1:40312". */
const char *mep_bs_peer_label(const mep_bs_peer_t *peer, char *buf,
                              size_t len);
/* What happened to a failed peer's connection, in words, without the rank:
 * "its connection broke 3 ms into the op: ..." (since_ms: the op's start,
 * or -1 for no timing), or why this rank cut it. */
void mep_bs_peer_describe_failure(const mep_bs_peer_t *peer, int64_t since_ms,
                                  char *buf, size_t len);
/* Bound on all queued message bytes (see MEP_BS_PENDING_HELLOS). */
size_t mep_bs_queue_cap(const mep_bootstrap_t *bs);
/* Starts closing the peer's ep (force when failed); poll close_req. */
void mep_bs_peer_close(mep_bootstrap_t *bs, mep_bs_peer_t *peer, int force);
/* Waits for every started close, up to deadline. */
void mep_bs_close_wait(mep_bootstrap_t *bs, int64_t deadline_ms);

/* ---- bootstrap_root.c / bootstrap_join.c ---- */
moe_ep_status_t mep_bs_root_form(mep_bootstrap_t *bs, int64_t deadline_ms);
moe_ep_status_t mep_bs_join(mep_bootstrap_t *bs, int64_t start_ms);
/* Rank 0: tells every live joined rank the group is dead, briefly waiting
 * for the sends. */
void mep_bs_root_abort(mep_bootstrap_t *bs, moe_ep_status_t status,
                       int failed_rank, const char *msg);
/* "1, 3, 5" (truncated politely). */
void mep_bs_format_ranks(char *buf, size_t len, const int *ranks, int n);

/* ---- bootstrap_coll.c ---- */
/* Extra time non-root ranks wait past timeout_ms, so rank 0's verdict (which
 * names the culprit) reaches them before their own deadline fires. */
int mep_bs_slack_ms(const mep_bootstrap_t *bs);

#endif /* MEP_BOOTSTRAP_TYPES_H_ */
