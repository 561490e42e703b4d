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
#include "runtime/hmac.h"

/* The one active-message id the bootstrap registers on its worker. */
#define MEP_BS_AM_ID 63u
#define MEP_BS_MAGIC 0x4d455042u /* "MEPB" */
/* The protocol version, the bootstrap's and the host data path's (its
 * region layout): ranks of different versions are refused at the gate.
 * 6: a refusal of a proven knock carries a proof; 7: every UCX message
 * carries a MAC (mep_bs_seal); 8: the MAC's keys are the connection's own
 * and every message carries its number on the connection (replays are
 * dropped), rank 0's admission carries the group's nonce, and a host count
 * word's row description is kernels/common/row_desc.h's; 9: the host
 * mesh's headers carry a number and a tag under keys derived from the
 * token (mep_bootstrap_derive), and its address exchange no key; 10: a
 * host count entry is 16 bytes, the count word and the HT prepare number,
 * and a bootstrap header carries its payload's digest under its MAC; 11: a
 * member whose wait ran out sends OVERDUE, and rank 0 answers with its
 * verdict on the ranks it still waits for. */
#define MEP_BS_VERSION 11u
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
 * the gate admitted but that has not joined may queue one empty HELLO. */
#define MEP_BS_CONN_QUEUE_MSGS 1
/* Non-zero ranks hear only rank 0, which may have ACCEPT, FORMED and a
 * RESULT (or REFUSE) in flight to a rank that has not looked yet. */
#define MEP_BS_ROOT_QUEUE_MSGS 3
/* Rank 0, all connections together: one full CONTRIB per rank
 * (bootstrap_msg.c: mep_bs_queue_cap). At 8 ranks that is about 0.5 MiB;
 * at the 1024-rank maximum about 64 MiB. */

/* The gate (bootstrap_gate.c). Rank 0's bootstrap address is a plain TCP
 * socket, not UCX. Rank 0 opens each connection with a challenge (a fresh
 * random nonce); the joiner answers with a knock: rank, world size, a nonce
 * of its own, its UCX worker address, and a proof, the HMAC-SHA-256 under
 * the job token of the challenge and all of that. Rank 0's verdict is the
 * group's nonce (the connection's message keys come from it:
 * mep_bs_peer_keys) and its own worker address, proven with the challenge
 * and the joiner's nonce (so the joiner knows it reached the real rank 0),
 * or the reason for a refusal, proven the same
 * way when the knock's proof checked out (the joiner gives up only on a
 * proven refusal; an unproven one, which anyone on the port could send, is
 * retried until the joiner's deadline). Only then do the
 * two UCX workers connect, by worker address; the token never crosses the
 * gate. Rank 0 reads at most this many unanswered connections at a
 * time, each into a fixed buffer of MEP_BS_KNOCK_MAX bytes, and closes one
 * that has not sent a whole knock within MEP_BS_KNOCK_WAIT_MS (a real
 * joiner writes it at once); past the bound the oldest is closed. Together
 * about 550 KiB, whatever outsiders send. */
#define MEP_BS_PENDING_KNOCKS 64
#define MEP_BS_KNOCK_WAIT_MS 2000
/* A UCX worker address: twice the host backend's 4096-byte slot, since a
 * bootstrap worker on a node with many NICs and GPUs lists them all. */
#define MEP_BS_ADDR_MAX 8192
#define MEP_BS_NONCE_BYTES 32
#define MEP_BS_PROOF_BYTES 32 /* MEP_SHA256_BYTES */
/* A slot reserved for a rank by an admitted knock whose HELLO has not come
 * is kept from a different process claiming the same rank for this long. */
#define MEP_BS_RESERVE_MS 5000
/* Rank 0 logs this many gate refusals one by one, then only counts them. */
#define MEP_BS_GATE_LOG_MAX 16

#define MEP_BS_KNOCK_MAGIC 0x4d45504bu /* "MEPK" */

typedef enum mep_bs_knock_type {
  MEP_BS_CHALLENGE = 1,    /* 0 -> joiner: nonce */
  MEP_BS_KNOCK = 2,        /* joiner -> 0: proof; nonce + worker address */
  MEP_BS_KNOCK_OK = 3,     /* 0 -> joiner: proof; group nonce + rank 0's worker address */
  MEP_BS_KNOCK_REFUSE = 4, /* 0 -> joiner: proof if the knock's held; reason */
  MEP_BS_KNOCK_BUSY = 5    /* 0 -> joiner: the reason; knock again */
} mep_bs_knock_type_t;

/* Gate records: this header, proof_len proof bytes, body_len body bytes. */
typedef struct mep_bs_knock_hdr {
  uint32_t magic;
  uint16_t version;
  uint16_t type; /* mep_bs_knock_type_t */
  int32_t rank;
  int32_t world_size;
  uint32_t proof_len;
  uint32_t body_len;
} mep_bs_knock_hdr_t;

#define MEP_BS_KNOCK_MAX                                                \
  (sizeof(mep_bs_knock_hdr_t) + MEP_BS_PROOF_BYTES + MEP_BS_NONCE_BYTES + \
   MEP_BS_ADDR_MAX)

/* One gate connection rank 0 is reading a knock from. */
typedef struct mep_bs_knocker {
  int fd; /* -1: slot free */
  int64_t accepted_ms;
  size_t got;
  char name[64]; /* "127.0.0.1:40312" */
  /* The host it came from (mep_bs_addr_host: 4 or 8 bytes; 0: other
   * families): which slots one host holds when they run out. */
  uint8_t host[16];
  uint8_t host_len;
  uint8_t nonce[MEP_BS_NONCE_BYTES]; /* the challenge it was sent */
  unsigned char buf[MEP_BS_KNOCK_MAX];
} mep_bs_knocker_t;

typedef enum mep_bs_msg_type {
  MEP_BS_MSG_HELLO = 1,   /* admitted joiner -> 0: first word on its ep */
  MEP_BS_MSG_ACCEPT = 2,  /* 0 -> joiner */
  MEP_BS_MSG_REFUSE = 3,  /* unused since the gate refuses; number kept */
  MEP_BS_MSG_FORMED = 4,  /* 0 -> all: every rank joined */
  MEP_BS_MSG_ABORT = 5,   /* 0 -> all: status + reason; the group is dead */
  MEP_BS_MSG_CONTRIB = 6, /* joiner -> 0: one collective's input */
  MEP_BS_MSG_RESULT = 7,  /* 0 -> joiner: that collective's output */
  /* joined rank -> 0, empty: its wait for the result of collective `seq`
   * (0: for FORMED) ran out. Rank 0 may have entered that step late and
   * still be waiting for another rank; it then fails the step naming that
   * rank at once, instead of the member blaming rank 0's silence. Rank 0
   * keeps only the latest one per connection (mep_bs_peer_t.overdue_seq),
   * never queues it. */
  MEP_BS_MSG_OVERDUE = 8
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
  /* This message's number among those its sender sent on this connection
   * (1, 2, ...): a number the receiver has taken already marks a replay
   * (mep_bs_fresh). */
  uint64_t ctr;
  uint64_t payload_len;
  /* SHA-256 of the payload: under the MAC with the rest of the header, so
   * a receiver checks the header (and its number) before it hashes a
   * payload, and an outsider's message costs it one header's MAC. */
  uint8_t digest[MEP_SHA256_BYTES];
  /* HMAC-SHA-256 under the connection's key for this direction of the
   * header, this field zeroed (mep_bs_seal): UCX ties a message to an
   * endpoint by an id the packet carries, so the key, not the endpoint, is
   * what says a message came from the rank at the other end of this
   * connection, in this group. */
  uint8_t mac[MEP_SHA256_BYTES];
} mep_bs_hdr_t;

typedef enum mep_bs_peer_state {
  MEP_BS_PEER_CONNECTING = 0, /* ep exists, no HELLO / ACCEPT yet */
  MEP_BS_PEER_JOINED = 1,     /* HELLO and ACCEPT exchanged */
  MEP_BS_PEER_CLOSED = 2      /* ep closed (or never opened) */
} mep_bs_peer_state_t;

/* One endpoint: on rank 0 one per knock the gate admitted, on the others
 * the one to rank 0. Freed only in destroy, after its ep is closed,
 * because the ep's error callback holds a pointer to it. */
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
  char name[64];       /* "127.0.0.1:40312" (rank 0: the knock's address) */
  void *close_req; /* pending ucp_ep_close_nbx request */
  /* Rank 0: the worker address the admitted knock carried and when, so the
   * same process knocking again keeps its slot (and its ep). */
  void *addr;
  size_t addr_len;
  int64_t reserved_ms;
  /* The connection's message keys (mep_bs_peer_keys), set before its ep
   * exists: what arrives is checked under key_in, what leaves sealed
   * under key_out. */
  uint8_t key_in[MEP_SHA256_BYTES];
  uint8_t key_out[MEP_SHA256_BYTES];
  uint64_t sent;      /* the last ctr sealed for this connection */
  uint64_t recv_top;  /* the highest ctr taken from it */
  uint64_t recv_seen; /* bit i: ctr recv_top - i taken (i < 64) */
  /* Rank 0: the step the rank's latest OVERDUE named (its seq; 0 for the
   * group forming), valid when overdue is set. */
  int overdue;
  uint64_t overdue_seq;
  /* Rank 0's ABORT header to this rank, sealed for it: here so that
   * telling the peers the group is dead needs no allocation, and UCX may
   * read it until the worker is destroyed (peers are freed after). */
  mep_bs_hdr_t abort_hdr;
} mep_bs_peer_t;

/* A received message; payload owned by the node. Its sender is the
 * connection it arrived on (`peer`), never the rank its header names. */
typedef struct mep_bs_msg {
  struct mep_bs_msg *next;
  mep_bs_hdr_t hdr;
  struct mep_bs_peer *peer;
  void *payload;
  size_t len;
} mep_bs_msg_t;

/* A message's header (its ctr and MAC unset) and payload, shared by the
 * sends of one result to every rank: rank 0 keeps one copy of a
 * world-sized result, not one per rank, and hashes it once. Only the
 * bootstrap's own thread touches the count. */
typedef struct mep_bs_blob {
  int refs;
  mep_bs_hdr_t hdr;
  uint8_t digest[MEP_SHA256_BYTES]; /* SHA-256 of the payload */
  /* hdr.payload_len bytes follow */
} mep_bs_blob_t;

/* A send in flight: its own header, sealed for its connection, and a
 * reference to the payload, freed by whoever sees the completion last, so
 * a send abandoned at a deadline never reads freed caller memory. */
typedef struct mep_bs_send {
  mep_bs_blob_t *blob;
  mep_bs_hdr_t hdr;
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
  /* Rank 0's, fresh for each group, and sent in its proven admissions: in
   * every connection's keys, so that no message of another group with the
   * same token (of this job, or of a job run again) is taken here. */
  uint8_t group_nonce[MEP_BS_NONCE_BYTES];
  struct sockaddr_storage saddr;
  socklen_t saddr_len;

  ucp_context_h context;
  ucp_worker_h worker;
  ucp_address_t *self_addr; /* this worker's address (ranks > 1 only) */
  size_t self_addr_len;

  /* Rank 0's gate: the listening socket while the group forms, then a
   * bound socket that does not listen, so the kernel refuses connections
   * and does not hand the port out as an ephemeral port until destroy
   * (both set SO_REUSEADDR, so a program that binds the port by number
   * may still listen on it; a group of one never listens). -1 when
   * closed. */
  int gate_fd;
  int hold_fd;
  mep_bs_knocker_t *knockers; /* MEP_BS_PENDING_KNOCKS slots */
  int64_t gate_refused;       /* connections refused or closed unanswered */
  int formed;

  mep_bs_peer_t *peers;    /* every peer struct ever made (freed in destroy) */
  mep_bs_peer_t **by_rank; /* rank 0: joined peer per rank; others: [0] */
  mep_bs_msg_t *msgs;      /* received, not yet consumed */
  size_t queued_bytes;     /* payload + node bytes of msgs, all peers */
  size_t queue_cap;        /* bound on queued_bytes (mep_bs_queue_cap) */
  int evict_pending;       /* a peer awaits its close (mep_bs_peer_evict) */

  uint64_t seq;
  /* Sticky failure: once set, every later collective returns it. */
  moe_ep_status_t fail_status;
  char fail_msg[MEP_ERROR_MAX];
  /* Rank 0's ABORT reason (each peer has its header), kept in this struct
   * so that telling the peers the group is dead needs no allocation (rank
   * 0 may be failing for want of memory); sent at most once, and UCX may
   * read it until the worker is destroyed. */
  char abort_reason[MEP_BS_REASON_MAX];
  int abort_sent;
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
/* "127.0.0.1:40312" / "[::1]:40312". */
void mep_bs_addr_name(const struct sockaddr_storage *a, char *buf, size_t len);
/* What names a's host into host[16]; returns its length: the 4 bytes of an
 * IPv4 address (an IPv4-mapped IPv6 one too), the 8 of an IPv6 address's
 * /64 (one machine may use every address in it), 0 for another family. */
size_t mep_bs_addr_host(const struct sockaddr_storage *a, uint8_t host[16]);
/* The slot a connection from `host` takes when all `n` are in use: the
 * oldest of those held by the host holding the most, the newcomer counted
 * with its own host. A flood from one host then only ever replaces its own
 * connections, while a joiner from another host keeps its slot. */
int mep_bs_gate_victim(const mep_bs_knocker_t *slots, int n, const uint8_t *host,
                       size_t host_len);

/* ---- bootstrap_gate.c (rank 0) ---- */
/* Listens on the bootstrap address (errno text when the port is taken). */
moe_ep_status_t mep_bs_gate_open(mep_bootstrap_t *bs);
/* Accepts, reads knocks, answers each complete one through
 * mep_bs_root_admit; never blocks. */
void mep_bs_gate_poll(mep_bootstrap_t *bs);
/* Stops listening; with `hold`, keeps the port bound (see gate_fd). */
void mep_bs_gate_close(mep_bootstrap_t *bs, int hold);

/* ---- bootstrap_knock.c ---- */
/* Fills a gate record's header. */
void mep_bs_knock_hdr_init(mep_bs_knock_hdr_t *h, int type, int rank,
                           int world_size, size_t proof_len, size_t body_len);
/* Writes all of buf to a non-blocking socket by the deadline; 0 or -1. */
int mep_bs_fd_write(int fd, const void *buf, size_t len, int64_t deadline_ms);
/* A fresh random nonce; 0, or -1 when the kernel gives none. */
int mep_bs_nonce(uint8_t out[MEP_BS_NONCE_BYTES]);
/* The proof of a gate record: HMAC-SHA-256 under the job token of `label`,
 * nonces a and b, the record's header and its body. */
void mep_bs_proof(const mep_bootstrap_t *bs, const char *label,
                  const uint8_t *a, const uint8_t *b,
                  const mep_bs_knock_hdr_t *h, const void *body,
                  uint8_t out[MEP_BS_PROOF_BYTES]);
#define MEP_BS_PROOF_KNOCK "moe-ep knock"
#define MEP_BS_PROOF_VERDICT "moe-ep verdict"
#define MEP_BS_PROOF_REFUSAL "moe-ep refusal"
/* REFUSED: a refusal rank 0 proved (final). UNPROVEN: an admission or a
 * refusal that carried no valid proof (retried, and named in the final
 * error even if later attempts only time out). */
enum { MEP_BS_KNOCK_RETRY = 0, MEP_BS_KNOCK_ADMITTED = 1,
       MEP_BS_KNOCK_REFUSED = 2, MEP_BS_KNOCK_UNPROVEN = 3 };
/* A joiner's knock: connects to the gate, takes its challenge, presents
 * rank, world size and this worker's address with the proof, and reads
 * the verdict. ADMITTED fills addr/addr_len (rank 0's worker address,
 * proven; addr holds MEP_BS_ADDR_MAX) and bs->group_nonce; the others
 * fill `why`. */
int mep_bs_knock(mep_bootstrap_t *bs, int64_t deadline_ms, void *addr,
                 size_t *addr_len, char *why, size_t why_len);

/* ---- bootstrap_msg.c ---- */
int64_t mep_bs_now_ms(void);
/* One progress pass; sleeps briefly when idle (`idle` counts idle passes so
 * the sleep grows from nothing to 1 ms). */
void mep_bs_progress(mep_bootstrap_t *bs, int *idle);
moe_ep_status_t mep_bs_worker_setup(mep_bootstrap_t *bs);
/* Sends header + payload on peer's ep. With out == NULL the send is
 * fire-and-forget; otherwise *out (NULL when the send could not be made:
 * UCS_ERR_NO_MEMORY, this rank's own memory, or UCS_ERR_NOT_CONNECTED)
 * must later go to mep_bs_send_wait. */
ucs_status_t mep_bs_send(mep_bs_peer_t *peer, const mep_bs_hdr_t *hdr, const void *payload,
                         mep_bs_send_t **out);
/* A member: tells rank 0 that its wait for step `seq` (a collective's
 * sequence number; 0: the group forming) ran out (MEP_BS_MSG_OVERDUE),
 * fire-and-forget. */
ucs_status_t mep_bs_send_overdue(mep_bootstrap_t *bs, uint64_t seq);
/* Rank 0: the first joined rank whose latest OVERDUE named step `seq`, or
 * -1. */
int mep_bs_root_overdue(const mep_bootstrap_t *bs, uint64_t seq);
/* How long rank 0's verdict says the missing ranks were waited for:
 * "<timeout_ms> ms", or, when `asker` (> 0) sent OVERDUE, "the <timeout_ms>
 * ms rank <asker> waits" (bootstrap_coll.c). */
void mep_bs_waited(const mep_bootstrap_t *bs, int asker, char *buf, size_t len);
/* A blob of hdr and its payload_len bytes of payload (one reference, the
 * caller's), or NULL when out of memory (or mep_bs_fail_alloc_after,
 * bootstrap_fault.h, says so); each send record takes one more reference,
 * and mep_bs_blob_drop (accepts NULL) gives one back. */
mep_bs_blob_t *mep_bs_blob_new(const mep_bs_hdr_t *hdr, const void *payload);
void mep_bs_blob_drop(mep_bs_blob_t *b);
/* A send in two halves, so that a sender can make every record of a step
 * before it starts any: mep_bs_send_new takes one more reference to blob
 * (NULL when out of memory); mep_bs_send_start seals it for peer (the
 * connection's next number), starts it and
 * takes the record over (*out as for mep_bs_send, never NULL: a send that
 * failed at once is done, with its status). A record never started goes
 * back with mep_bs_send_release (accepts NULL). */
mep_bs_send_t *mep_bs_send_new(mep_bs_blob_t *blob);
ucs_status_t mep_bs_send_start(mep_bs_peer_t *peer, mep_bs_send_t *s, mep_bs_send_t **out);
void mep_bs_send_release(mep_bs_send_t *s);
/* Rank 0: sends blobs[r] to each rank r in 1..world_size-1, every record
 * made before any send starts, so that a rank 0 out of memory sends no
 * rank anything. Returns -1 with sends[r] for mep_bs_send_wait; or, having
 * started nothing (sends[r] all NULL), the first rank whose record could
 * not be made or whose blobs[r] is NULL. */
int mep_bs_send_each(mep_bootstrap_t *bs, mep_bs_blob_t *const *blobs, mep_bs_send_t **sends);
/* Starts a send of a sealed header and its payload that allocates nothing
 * of this library's: both are the caller's and must stay valid until the
 * worker is destroyed. Returns UCX's request while the send is in flight
 * (poll with ucp_request_check_status, give back with ucp_request_free),
 * or NULL when it finished at once or could not start. */
void *mep_bs_send_fixed(mep_bs_peer_t *peer, const mep_bs_hdr_t *hdr, const void *payload);
/* Waits until done or deadline (UCS_ERR_TIMED_OUT); releases the send. */
ucs_status_t mep_bs_send_wait(mep_bootstrap_t *bs, mep_bs_send_t *s,
                              int64_t deadline_ms);
/* The keys of the connection between rank 0 and `rank`, whose worker
 * address joined it (peer->key_in and key_out, as seen from this side):
 * HMAC-SHA-256 under the job token (the gate admits only its holders) of
 * a label naming the direction, the group's nonce, the rank and the
 * address. Another connection, another group or the other direction has
 * other keys, so none of their messages passes for one of this one's. */
void mep_bs_peer_keys(const mep_bootstrap_t *bs, mep_bs_peer_t *peer, int rank,
                      const void *joiner_addr, size_t addr_len);
/* Numbers hdr as the connection's next message (hdr->ctr), records the
 * payload's SHA-256 in it and fills its MAC under key_out. */
void mep_bs_seal(mep_bs_peer_t *peer, mep_bs_hdr_t *hdr,
                 const uint8_t digest[MEP_SHA256_BYTES]);
/* 1 when hdr->mac is the MAC under key_in of hdr and hdr->digest the
 * SHA-256 of the `len` payload bytes. */
int mep_bs_sealed(const mep_bs_peer_t *peer, const mep_bs_hdr_t *hdr, const void *payload,
                  size_t len);
/* For a sealed message: 1 when its ctr is new on this connection (then
 * recorded), 0 for a replay, a zero ctr, or one 64 or more below the
 * highest taken (too old to tell). The ranks' messages may arrive out of
 * order on UCX's lanes, so any new number within the window is taken. */
int mep_bs_fresh(mep_bs_peer_t *peer, uint64_t ctr);
/* What a received message is before anything in it is believed. */
typedef enum mep_bs_taken {
  MEP_BS_TAKEN = 0,    /* sealed for this connection and new: *h holds its header */
  MEP_BS_UNSEALED = 1, /* not shaped like a message, or not sealed with the key */
  MEP_BS_REPLAYED = 2  /* sealed, but its number was taken before */
} mep_bs_taken_t;
/* The check every message on `peer`'s connection passes first: a header of
 * the message's size and magic whose payload_len is `length`, an eager
 * message (`rndv` 0) of at most `longest` bytes, the header's MAC, a new
 * number, then the payload's digest; only then is the number recorded
 * (mep_bs_fresh), so an unsealed message cannot use up the number of the
 * real one. The payload is hashed only for a sealed header of a new
 * number: what an outsider sends, or a replay of any size, is refused on
 * its header alone. */
mep_bs_taken_t mep_bs_take(mep_bs_peer_t *peer, const void *header, size_t header_length,
                           const void *data, size_t length, int rndv, size_t longest,
                           mep_bs_hdr_t *h);
void mep_bs_hdr_init(const mep_bootstrap_t *bs, mep_bs_hdr_t *hdr, int type);
/* Unlinks the first message of `type` that arrived on `from` (NULL =
 * any connection). */
mep_bs_msg_t *mep_bs_msg_take(mep_bootstrap_t *bs, int type,
                              const mep_bs_peer_t *from);
void mep_bs_msg_free(mep_bs_msg_t *m);
mep_bs_peer_t *mep_bs_peer_new(mep_bootstrap_t *bs);
/* Frees a peer struct no list holds any more (its address, its keys
 * wiped first). */
void mep_bs_peer_free(mep_bs_peer_t *p);
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
/* Bound on all queued message bytes (see MEP_BS_CONN_QUEUE_MSGS). */
size_t mep_bs_queue_cap(const mep_bootstrap_t *bs);
/* Starts closing the peer's ep (force when failed); poll close_req. */
void mep_bs_peer_close(mep_bootstrap_t *bs, mep_bs_peer_t *peer, int force);
/* Waits for every started close, up to deadline. */
void mep_bs_close_wait(mep_bootstrap_t *bs, int64_t deadline_ms);

/* Creates the peer's ep to a worker address (error callback set). */
ucs_status_t mep_bs_peer_connect(mep_bootstrap_t *bs, mep_bs_peer_t *peer,
                                 const void *addr);

/* ---- bootstrap_root.c / bootstrap_join.c ---- */
moe_ep_status_t mep_bs_root_form(mep_bootstrap_t *bs, int64_t deadline_ms);
/* The gate's verdict on a knock whose proof checked out: MEP_BS_KNOCK_OK
 * when admitted (the rank's slot is reserved and rank 0's ep to `addr`
 * created), else MEP_BS_KNOCK_REFUSE or MEP_BS_KNOCK_BUSY with `why`. */
int mep_bs_root_admit(mep_bootstrap_t *bs, const mep_bs_knock_hdr_t *h,
                      const void *addr, size_t addr_len, const char *name,
                      char *why, size_t why_len);
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
