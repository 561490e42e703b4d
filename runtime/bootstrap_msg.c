/* bootstrap_msg.c: message framing and transport for the bootstrap: the
 * connections' keys, each message's MAC and number (sealed for its
 * connection, checked and replays dropped on arrival), one active-message
 * handler that queues what arrives, sends from private copies with bounded
 * waits, endpoint error callbacks and bounded closes. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/bootstrap_fault.h"
#include "runtime/bootstrap_types.h"
#include "runtime/progress.h"
#include "runtime/replay_window.h"
#include "runtime/error.h"
#include "runtime/log.h"
#include "runtime/ucx_quiet.h"

int64_t mep_bs_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Closes the connections the AM callback condemned (closing inside the
 * callback is not allowed); their queued messages go too. */
static void peers_close_evicted(mep_bootstrap_t *bs) {
  if (!bs->evict_pending) return;
  bs->evict_pending = 0;
  for (mep_bs_peer_t *p = bs->peers; p != NULL; p = p->next) {
    if (!p->evict || p->ep == NULL) continue;
    for (mep_bs_msg_t **pp = &bs->msgs; *pp != NULL;) {
      mep_bs_msg_t *m = *pp;
      if (m->peer != p) {
        pp = &m->next;
        continue;
      }
      *pp = m->next;
      p->queued_msgs--;
      p->queued_bytes -= m->len;
      bs->queued_bytes -= m->len + sizeof(*m);
      mep_bs_msg_free(m);
    }
    mep_bs_peer_close(bs, p, 1);
  }
}

void mep_bs_progress(mep_bootstrap_t *bs, int *idle) {
  unsigned n = 0;
  /* A condemned connection is closed before more is read from it: a flood
   * would otherwise keep this loop (and UCX's reassembly buffers) busy. The
   * pass is capped too, so that traffic which keeps the worker busy cannot
   * keep the caller from its deadline. */
  while (n < MEP_PROGRESS_PASS_MAX && !bs->evict_pending && mep_ucx_progress(bs->worker) != 0)
    n++;
  peers_close_evicted(bs);
  if (n != 0) {
    *idle = 0;
    return;
  }
  /* Up to 8 ranks share 2 cores in CI: spinning would starve the very peer
   * we wait for. */
  if (++*idle > 16) {
    long us = (*idle - 16) * 20L;
    if (us > 1000) us = 1000;
    struct timespec ts = {.tv_sec = 0, .tv_nsec = us * 1000L};
    nanosleep(&ts, NULL);
  }
}

/* Abort from rank 0 is recorded at once: it may arrive while this rank
 * waits for anything at all. */
static void msg_note_abort(mep_bootstrap_t *bs, const mep_bs_hdr_t *h,
                           const char *payload, size_t len) {
  if (bs->abort_seen) return;
  bs->abort_seen = 1;
  bs->abort_status = (moe_ep_status_t)h->status;
  bs->abort_rank = h->failed_rank;
  if (len >= sizeof(bs->abort_msg)) len = sizeof(bs->abort_msg) - 1;
  memcpy(bs->abort_msg, payload, len);
  bs->abort_msg[len] = '\0';
}

static const char *msg_type_name(int type) {
  switch (type) {
    case MEP_BS_MSG_HELLO: return "HELLO";
    case MEP_BS_MSG_ACCEPT: return "ACCEPT";
    case MEP_BS_MSG_REFUSE: return "REFUSE";
    case MEP_BS_MSG_FORMED: return "FORMED";
    case MEP_BS_MSG_ABORT: return "ABORT";
    case MEP_BS_MSG_CONTRIB: return "CONTRIB";
    case MEP_BS_MSG_RESULT: return "RESULT";
    case MEP_BS_MSG_OVERDUE: return "OVERDUE";
    default: return "unknown message";
  }
}

size_t mep_bs_queue_cap(const mep_bootstrap_t *bs) {
  size_t node = sizeof(mep_bs_msg_t);
  size_t world = (size_t)bs->world_size;
  if (bs->rank == 0) return world * (MEP_BS_PAYLOAD_MAX + node);
  return (size_t)MEP_BS_ROOT_QUEUE_MSGS *
         (world * MEP_BS_PAYLOAD_MAX + MEP_BS_REASON_MAX + node);
}

/* The bootstrap connection a message arrived on, or NULL: no reply
 * endpoint (the sender did not set the reply flag), an endpoint of another
 * subsystem on the shared worker, or a connection already being cut. */
static mep_bs_peer_t *msg_sender(mep_bootstrap_t *bs,
                                 const ucp_am_recv_param_t *param) {
  if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) return NULL;
  for (mep_bs_peer_t *p = bs->peers; p != NULL; p = p->next) {
    if (p->ep != NULL && p->ep == param->reply_ep) return p->evict ? NULL : p;
  }
  return NULL;
}

/* Rank 0: what each connection may send. Returns 0, or 1 with `why`. */
static int msg_admit_root(const mep_bootstrap_t *bs, const mep_bs_peer_t *peer,
                          const mep_bs_hdr_t *h, size_t length, char *why,
                          size_t n) {
  if (peer->state != MEP_BS_PEER_JOINED) {
    /* Admitted by the gate (which checked the token): only its HELLO. */
    if (h->type != MEP_BS_MSG_HELLO) {
      snprintf(why, n, "sent a %s (labelled rank %d) before joining",
               msg_type_name(h->type), h->src);
    } else if (length != 0) {
      snprintf(why, n, "sent a %zu-byte HELLO; a HELLO is empty", length);
    } else if (peer->queued_msgs >= MEP_BS_CONN_QUEUE_MSGS) {
      snprintf(why, n, "sent a second HELLO before the verdict on its first");
    } else {
      return 0;
    }
  } else if (h->type != MEP_BS_MSG_CONTRIB && h->type != MEP_BS_MSG_OVERDUE) {
    snprintf(why, n, "sent a %s after joining", msg_type_name(h->type));
  } else if (h->src != peer->rank) {
    snprintf(why, n, "sent a message labelled rank %d on the connection that "
             "joined as rank %d", h->src, peer->rank);
  } else if (h->type == MEP_BS_MSG_OVERDUE && length != 0) {
    snprintf(why, n, "sent a %zu-byte OVERDUE; an OVERDUE is empty", length);
  } else if (h->type == MEP_BS_MSG_OVERDUE) {
    return 0; /* recorded on the connection, not queued */
  } else if (length > MEP_BS_PAYLOAD_MAX) {
    snprintf(why, n, "sent a %zu-byte contribution; the bound is %u bytes",
             length, MEP_BS_PAYLOAD_MAX);
  } else if (peer->queued_msgs >= MEP_BS_CONN_QUEUE_MSGS) {
    snprintf(why, n, "sent a contribution before rank 0 took its previous "
             "one (at most %d queued)", MEP_BS_CONN_QUEUE_MSGS);
  } else {
    return 0;
  }
  return 1;
}

/* Non-zero ranks: only rank 0's answers, bounded by what it can owe us. */
static int msg_admit_member(const mep_bootstrap_t *bs,
                            const mep_bs_peer_t *peer, const mep_bs_hdr_t *h,
                            size_t length, char *why, size_t n) {
  size_t max = MEP_BS_REASON_MAX;
  if (h->type == MEP_BS_MSG_RESULT) {
    max = (size_t)bs->world_size * MEP_BS_PAYLOAD_MAX;
  }
  if (h->type == MEP_BS_MSG_HELLO || h->type == MEP_BS_MSG_CONTRIB ||
      h->type == MEP_BS_MSG_OVERDUE || h->type < MEP_BS_MSG_HELLO ||
      h->type > MEP_BS_MSG_OVERDUE) {
    snprintf(why, n, "sent a %s, which only rank 0 receives",
             msg_type_name(h->type));
  } else if (h->src != 0) {
    snprintf(why, n, "sent a message labelled rank %d", h->src);
  } else if (length > max) {
    snprintf(why, n, "sent a %zu-byte %s; the bound is %zu bytes", length,
             msg_type_name(h->type), max);
  } else if (peer->queued_msgs >= MEP_BS_ROOT_QUEUE_MSGS) {
    snprintf(why, n, "sent more than %d messages this rank had not taken",
             MEP_BS_ROOT_QUEUE_MSGS);
  } else {
    return 0;
  }
  return 1;
}

/* Everything is checked before anything is allocated. A message the
 * connection's key did not seal, or one it has taken already, is dropped,
 * the connection left alone (it may not have come on it, or be a copy
 * someone replayed); a fresh sealed one that breaks the protocol is
 * dropped and its connection cut. The queue holds at most queue_cap
 * bytes. */
static ucs_status_t msg_am_cb(void *arg, const void *header,
                              size_t header_length, void *data, size_t length,
                              const ucp_am_recv_param_t *param) {
  mep_bootstrap_t *bs = (mep_bootstrap_t *)arg;
  int rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  mep_bs_peer_t *peer = msg_sender(bs, param);
  if (peer == NULL) {
    MEP_LOG_DEBUG("bootstrap",
                  "rank %d: dropped a %zu-byte message from an endpoint that "
                  "is not a bootstrap connection", bs->rank, length);
    return UCS_OK;
  }
  /* Not sealed with this connection's key (or not even shaped like a
   * message): not from the rank at its other end, whatever endpoint UCX
   * tied it to (by an id the packet itself carries), so it is dropped
   * without being believed, and that endpoint is not blamed for it. The
   * group's ranks send eagerly only, so a rendezvous message, whose
   * payload is not here to check, is dropped too. */
  mep_bs_hdr_t h;
  /* Longer than any message a rank sends here is not worth hashing. */
  const size_t longest = bs->rank == 0 ? MEP_BS_PAYLOAD_MAX
                                       : (size_t)bs->world_size * MEP_BS_PAYLOAD_MAX;
  const mep_bs_taken_t taken =
      mep_bs_take(peer, header, header_length, data, length, rndv, longest, &h);
  if (taken == MEP_BS_UNSEALED) {
    MEP_LOG_DEBUG("bootstrap",
                  "rank %d: dropped a %zu-byte message on rank %d's connection that the "
                  "connection's key did not seal",
                  bs->rank, length, peer->rank);
    return UCS_OK;
  }
  /* Sealed for this connection, but its number was taken before: a copy
   * of an earlier message, sent again by whoever saw it pass. */
  if (taken == MEP_BS_REPLAYED) {
    MEP_LOG_DEBUG("bootstrap",
                  "rank %d: dropped a replayed %zu-byte message (number %llu) on rank %d's "
                  "connection",
                  bs->rank, length, (unsigned long long)h.ctr, peer->rank);
    return UCS_OK;
  }
  char why[sizeof(peer->why)];
  int bad = bs->rank == 0
                ? msg_admit_root(bs, peer, &h, length, why, sizeof(why))
                : msg_admit_member(bs, peer, &h, length, why, sizeof(why));
  if (!bad && h.type == MEP_BS_MSG_OVERDUE) {
    peer->overdue = 1;
    peer->overdue_seq = h.seq;
    return UCS_OK;
  }
  size_t cost = length + sizeof(mep_bs_msg_t);
  if (!bad && bs->queued_bytes + cost > bs->queue_cap) {
    snprintf(why, sizeof(why),
             "sent a %zu-byte %s that would take the queued messages past "
             "%zu bytes", length, msg_type_name(h.type), bs->queue_cap);
    bad = 1;
  }
  if (bad) {
    mep_bs_peer_evict(bs, peer, "%s", why);
    return UCS_OK;
  }
  if (h.type == MEP_BS_MSG_ABORT) {
    msg_note_abort(bs, &h, (const char *)data, length);
    return UCS_OK;
  }
  mep_bs_msg_t *m = (mep_bs_msg_t *)calloc(1, sizeof(*m));
  void *payload = length != 0 ? malloc(length) : NULL;
  if (m == NULL || (length != 0 && payload == NULL)) {
    free(m);
    free(payload);
    /* A lost message leaves the protocol out of step with this peer: cut
     * it, so the wait for it fails now, naming this rank's memory as the
     * cause, rather than timing out and blaming the sender. */
    mep_bs_peer_evict(bs, peer,
                      "sent a %zu-byte %s that rank %d had no memory to receive (not the "
                      "sender's fault; the message was lost)",
                      length, msg_type_name(h.type), bs->rank);
    return UCS_OK;
  }
  m->hdr = h;
  m->payload = payload;
  m->len = length;
  m->peer = peer;
  peer->queued_msgs++;
  peer->queued_bytes += length;
  bs->queued_bytes += cost;
  /* Append: per-source order is the order the waits expect. */
  mep_bs_msg_t **tail = &bs->msgs;
  while (*tail != NULL) tail = &(*tail)->next;
  *tail = m;
  if (length != 0) memcpy(payload, data, length);
  return UCS_OK;
}

moe_ep_status_t mep_bs_worker_setup(mep_bootstrap_t *bs) {
  ucp_params_t cp;
  memset(&cp, 0, sizeof(cp));
  cp.field_mask = UCP_PARAM_FIELD_FEATURES;
  /* Active messages only: the host backend's data path has a context and
   * worker of its own (runtime/host/host_mesh.c). */
  cp.features = UCP_FEATURE_AM;
  ucs_status_t st = ucp_init(&cp, NULL, &bs->context);
  if (st != UCS_OK) {
    bs->context = NULL;
    return mep_error(MOE_EP_ERR_UCX, "rank %d: ucp_init failed: %s", bs->rank,
                     ucs_status_string(st));
  }
  ucp_worker_params_t wp;
  memset(&wp, 0, sizeof(wp));
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  st = ucp_worker_create(bs->context, &wp, &bs->worker);
  if (st != UCS_OK) {
    bs->worker = NULL;
    return mep_error(MOE_EP_ERR_UCX, "rank %d: ucp_worker_create failed: %s",
                     bs->rank, ucs_status_string(st));
  }
  ucp_am_handler_param_t ap;
  memset(&ap, 0, sizeof(ap));
  ap.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                  UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                  UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
  ap.id = MEP_BS_AM_ID;
  ap.flags = UCP_AM_FLAG_WHOLE_MSG;
  ap.cb = msg_am_cb;
  ap.arg = bs;
  st = ucp_worker_set_am_recv_handler(bs->worker, &ap);
  if (st != UCS_OK) {
    return mep_error(MOE_EP_ERR_UCX,
                     "rank %d: ucp_worker_set_am_recv_handler(id %u) failed: "
                     "%s",
                     bs->rank, MEP_BS_AM_ID, ucs_status_string(st));
  }
  return MOE_EP_OK;
}

#define KEY_TO_ROOT_LABEL "moe-ep message key, rank to rank 0"
#define KEY_FROM_ROOT_LABEL "moe-ep message key, rank 0 to rank"
#define MSG_LABEL "moe-ep message"

static void peer_key(const mep_bootstrap_t *bs, const char *label, int32_t rank,
                     const void *joiner_addr, size_t addr_len, uint8_t out[MEP_SHA256_BYTES]) {
  const void *parts[4] = {label, bs->group_nonce, &rank, joiner_addr};
  const size_t lens[4] = {strlen(label) + 1, sizeof(bs->group_nonce), sizeof(rank), addr_len};
  mep_hmac_sha256(bs->token, strlen(bs->token), 4, parts, lens, out);
}

void mep_bs_peer_keys(const mep_bootstrap_t *bs, mep_bs_peer_t *peer, int rank,
                      const void *joiner_addr, size_t addr_len) {
  const int root = bs->rank == 0;
  peer_key(bs, root ? KEY_TO_ROOT_LABEL : KEY_FROM_ROOT_LABEL, rank, joiner_addr, addr_len,
           peer->key_in);
  peer_key(bs, root ? KEY_FROM_ROOT_LABEL : KEY_TO_ROOT_LABEL, rank, joiner_addr, addr_len,
           peer->key_out);
}

/* The MAC of a header (its own MAC field read as zeros), which holds its
 * payload's digest: a result sent to every rank is hashed once, sealed
 * per rank. */
static void msg_mac(const uint8_t key[MEP_SHA256_BYTES], const mep_bs_hdr_t *hdr,
                    uint8_t out[MEP_SHA256_BYTES]) {
  mep_bs_hdr_t h = *hdr;
  memset(h.mac, 0, sizeof(h.mac));
  const void *parts[2] = {MSG_LABEL, &h};
  const size_t lens[2] = {sizeof(MSG_LABEL), sizeof(h)};
  mep_hmac_sha256(key, MEP_SHA256_BYTES, 2, parts, lens, out);
}

void mep_bs_seal(mep_bs_peer_t *peer, mep_bs_hdr_t *hdr, const uint8_t digest[MEP_SHA256_BYTES]) {
  hdr->ctr = ++peer->sent;
  memcpy(hdr->digest, digest, MEP_SHA256_BYTES);
  msg_mac(peer->key_out, hdr, hdr->mac);
}

static int header_sealed(const mep_bs_peer_t *peer, const mep_bs_hdr_t *hdr) {
  uint8_t want[MEP_SHA256_BYTES];
  msg_mac(peer->key_in, hdr, want);
  return mep_bytes_equal(hdr->mac, want, sizeof(want));
}

static int payload_matches(const mep_bs_hdr_t *hdr, const void *payload, size_t len) {
  uint8_t digest[MEP_SHA256_BYTES];
  mep_sha256(payload, len, digest);
  return mep_bytes_equal(hdr->digest, digest, sizeof(digest));
}

int mep_bs_sealed(const mep_bs_peer_t *peer, const mep_bs_hdr_t *hdr, const void *payload,
                  size_t len) {
  return header_sealed(peer, hdr) && payload_matches(hdr, payload, len);
}

mep_bs_taken_t mep_bs_take(mep_bs_peer_t *peer, const void *header, size_t header_length,
                           const void *data, size_t length, int rndv, size_t longest,
                           mep_bs_hdr_t *h) {
  memset(h, 0, sizeof(*h));
  if (header_length != sizeof(*h)) return MEP_BS_UNSEALED;
  memcpy(h, header, sizeof(*h));
  if (h->magic != MEP_BS_MAGIC || h->payload_len != length || rndv || length > longest ||
      !header_sealed(peer, h))
    return MEP_BS_UNSEALED;
  if (!mep_replay_fresh(peer->recv_top, peer->recv_seen, h->ctr)) return MEP_BS_REPLAYED;
  if (!payload_matches(h, data, length)) return MEP_BS_UNSEALED;
  return mep_bs_fresh(peer, h->ctr) ? MEP_BS_TAKEN : MEP_BS_REPLAYED;
}

int mep_bs_fresh(mep_bs_peer_t *peer, uint64_t ctr) {
  return mep_replay_take(&peer->recv_top, &peer->recv_seen, ctr);
}

void mep_bs_hdr_init(const mep_bootstrap_t *bs, mep_bs_hdr_t *hdr, int type) {
  memset(hdr, 0, sizeof(*hdr));
  hdr->magic = MEP_BS_MAGIC;
  hdr->version = MEP_BS_VERSION;
  hdr->type = (uint16_t)type;
  hdr->src = bs->rank;
  hdr->world_size = bs->world_size;
  hdr->failed_rank = -1;
}

static void send_done(void *request, ucs_status_t status, void *user_data) {
  mep_bs_send_t *s = (mep_bs_send_t *)user_data;
  ucp_request_free(request);
  if (s->orphaned) {
    mep_bs_send_release(s);
    return;
  }
  s->status = status;
  s->done = 1;
}

int mep_bs_fail_alloc_after = -1;

mep_bs_blob_t *mep_bs_blob_new(const mep_bs_hdr_t *hdr, const void *payload) {
  if (mep_bs_fail_alloc_after == 0) return NULL;
  if (mep_bs_fail_alloc_after > 0) mep_bs_fail_alloc_after--;
  const size_t len = (size_t)hdr->payload_len;
  mep_bs_blob_t *b = (mep_bs_blob_t *)malloc(sizeof(*b) + len);
  if (b == NULL) return NULL;
  b->refs = 1;
  b->hdr = *hdr;
  if (len != 0) memcpy(b + 1, payload, len);
  mep_sha256(b + 1, len, b->digest);
  return b;
}

void mep_bs_blob_drop(mep_bs_blob_t *b) {
  if (b != NULL && --b->refs == 0) free(b);
}

void mep_bs_send_release(mep_bs_send_t *s) {
  if (s == NULL) return;
  mep_bs_blob_drop(s->blob);
  free(s);
}

/* Starts one eager active message. Eager only: the receive side then
 * always gets whole, inline data. The reply flag lets the receiver tie
 * the message to the endpoint it arrived on (msg_sender). */
static ucs_status_ptr_t msg_am_send(mep_bs_peer_t *peer, const mep_bs_hdr_t *hdr,
                                    const void *payload, ucp_request_param_t *p) {
  p->op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
  p->flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY;
  return ucp_am_send_nbx(peer->ep, MEP_BS_AM_ID, hdr, sizeof(*hdr), payload,
                         (size_t)hdr->payload_len, p);
}

mep_bs_send_t *mep_bs_send_new(mep_bs_blob_t *blob) {
  mep_bs_send_t *s = (mep_bs_send_t *)calloc(1, sizeof(*s));
  if (s == NULL) return NULL;
  blob->refs++;
  s->blob = blob;
  s->hdr = blob->hdr;
  return s;
}

/* Starts s as sealed (s->hdr) to peer. */
static ucs_status_t send_start(mep_bs_peer_t *peer, mep_bs_send_t *s, mep_bs_send_t **out) {
  if (out != NULL) *out = NULL;
  ucs_status_ptr_t r = UCS_STATUS_PTR(UCS_ERR_NOT_CONNECTED);
  s->orphaned = (out == NULL);
  if (peer != NULL && peer->ep != NULL) {
    ucp_request_param_t p;
    memset(&p, 0, sizeof(p));
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = send_done;
    p.user_data = s;
    r = msg_am_send(peer, &s->hdr, s->blob + 1, &p);
  }
  if (UCS_PTR_IS_PTR(r)) {
    if (out != NULL) *out = s;
    return UCS_INPROGRESS;
  }
  ucs_status_t st = UCS_PTR_STATUS(r);
  if (out != NULL) {
    s->done = 1;
    s->status = st;
    *out = s;
  } else {
    mep_bs_send_release(s);
  }
  return st;
}

int mep_bs_send_unsealed_first = 0;
int mep_bs_send_replayed_first = 0;

/* bootstrap_fault.h: a copy of s (NULL when none is due or there is no
 * memory), with one bit of its MAC flipped when `spoil`. */
static mep_bs_send_t *fault_copy(const mep_bs_send_t *s, int *due, int spoil) {
  if (*due <= 0) return NULL;
  (*due)--;
  mep_bs_send_t *c = mep_bs_send_new(s->blob);
  if (c == NULL) return NULL;
  c->hdr = s->hdr;
  if (spoil) {
    /* A number far past the original's: taken as real (its MAC not
     * checked), or its number recorded before the MAC is checked, it puts
     * the original and the messages after it out of the window, and the
     * connection stalls, which is what the tests look for. */
    c->hdr.ctr += 1000;
    c->hdr.mac[0] ^= 1u;
  }
  return c;
}

ucs_status_t mep_bs_send_start(mep_bs_peer_t *peer, mep_bs_send_t *s, mep_bs_send_t **out) {
  mep_bs_send_t *spoiled = NULL, *replayed = NULL;
  if (peer != NULL && peer->ep != NULL) {
    mep_bs_seal(peer, &s->hdr, s->blob->digest);
    /* Made now: s may be done, and freed, as soon as it starts. */
    spoiled = fault_copy(s, &mep_bs_send_unsealed_first, 1);
    replayed = fault_copy(s, &mep_bs_send_replayed_first, 0);
  }
  if (spoiled != NULL) (void)send_start(peer, spoiled, NULL);
  const ucs_status_t st = send_start(peer, s, out);
  if (replayed != NULL) (void)send_start(peer, replayed, NULL);
  return st;
}

ucs_status_t mep_bs_send(mep_bs_peer_t *peer, const mep_bs_hdr_t *hdr, const void *payload,
                         mep_bs_send_t **out) {
  if (out != NULL) *out = NULL;
  if (peer == NULL || peer->ep == NULL) return UCS_ERR_NOT_CONNECTED;
  mep_bs_blob_t *blob = mep_bs_blob_new(hdr, payload);
  mep_bs_send_t *s = blob != NULL ? mep_bs_send_new(blob) : NULL;
  mep_bs_blob_drop(blob);
  if (s == NULL) return UCS_ERR_NO_MEMORY;
  return mep_bs_send_start(peer, s, out);
}

ucs_status_t mep_bs_send_overdue(mep_bootstrap_t *bs, uint64_t seq) {
  mep_bs_hdr_t h;
  mep_bs_hdr_init(bs, &h, MEP_BS_MSG_OVERDUE);
  h.seq = seq;
  return mep_bs_send(bs->by_rank[0], &h, NULL, NULL);
}

int mep_bs_root_overdue(const mep_bootstrap_t *bs, uint64_t seq) {
  for (int r = 1; r < bs->world_size; r++) {
    const mep_bs_peer_t *p = bs->by_rank[r];
    if (p != NULL && p->state == MEP_BS_PEER_JOINED && p->overdue && p->overdue_seq == seq) {
      return r;
    }
  }
  return -1;
}

int mep_bs_send_each(mep_bootstrap_t *bs, mep_bs_blob_t *const *blobs, mep_bs_send_t **sends) {
  int short_of = -1;
  for (int r = 1; r < bs->world_size; r++) {
    sends[r] = blobs[r] != NULL ? mep_bs_send_new(blobs[r]) : NULL;
    if (sends[r] == NULL && short_of < 0) short_of = r;
  }
  for (int r = 1; r < bs->world_size; r++) {
    if (short_of > 0) {
      mep_bs_send_release(sends[r]);
      sends[r] = NULL;
    } else {
      (void)mep_bs_send_start(bs->by_rank[r], sends[r], &sends[r]);
    }
  }
  return short_of;
}

void *mep_bs_send_fixed(mep_bs_peer_t *peer, const mep_bs_hdr_t *hdr, const void *payload) {
  if (peer == NULL || peer->ep == NULL) return NULL;
  ucp_request_param_t p;
  memset(&p, 0, sizeof(p));
  ucs_status_ptr_t r = msg_am_send(peer, hdr, payload, &p);
  return UCS_PTR_IS_PTR(r) ? r : NULL;
}

ucs_status_t mep_bs_send_wait(mep_bootstrap_t *bs, mep_bs_send_t *s,
                              int64_t deadline_ms) {
  if (s == NULL) return UCS_ERR_NO_ELEM;
  int idle = 0;
  while (!s->done && mep_bs_now_ms() < deadline_ms) mep_bs_progress(bs, &idle);
  if (!s->done) {
    /* The completion callback frees it whenever UCX finishes with it. */
    s->orphaned = 1;
    return UCS_ERR_TIMED_OUT;
  }
  ucs_status_t st = s->status;
  mep_bs_send_release(s);
  return st;
}

mep_bs_msg_t *mep_bs_msg_take(mep_bootstrap_t *bs, int type,
                              const mep_bs_peer_t *from) {
  for (mep_bs_msg_t **pp = &bs->msgs; *pp != NULL; pp = &(*pp)->next) {
    mep_bs_msg_t *m = *pp;
    if (m->hdr.type != type) continue;
    if (from != NULL && m->peer != from) continue;
    *pp = m->next;
    m->next = NULL;
    m->peer->queued_msgs--;
    m->peer->queued_bytes -= m->len;
    bs->queued_bytes -= m->len + sizeof(*m);
    return m;
  }
  return NULL;
}

void mep_bs_msg_free(mep_bs_msg_t *m) {
  if (m == NULL) return;
  free(m->payload);
  free(m);
}

static void peer_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status) {
  mep_bs_peer_t *peer = (mep_bs_peer_t *)arg;
  (void)ep;
  if (!peer->failed) {
    peer->failed = 1;
    peer->fail_status = status;
    peer->fail_ms = mep_bs_now_ms();
  }
}

const char *mep_bs_peer_label(const mep_bs_peer_t *peer, char *buf,
                              size_t len) {
  if (peer->rank >= 0) {
    snprintf(buf, len, "rank %d", peer->rank);
  } else {
    snprintf(buf, len, "a connection from %s",
             peer->name[0] != '\0' ? peer->name : "an unknown address");
  }
  return buf;
}

void mep_bs_peer_evict(mep_bootstrap_t *bs, mep_bs_peer_t *peer,
                       const char *fmt, ...) {
  if (peer->evict || peer->ep == NULL) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(peer->why, sizeof(peer->why), fmt, ap);
  va_end(ap);
  peer->evict = 1;
  bs->evict_pending = 1;
  if (!peer->failed) {
    peer->failed = 1;
    peer->fail_status = UCS_ERR_REJECTED;
    peer->fail_ms = mep_bs_now_ms();
  }
  char who[96];
  MEP_LOG_WARN("bootstrap", "rank %d closed %s on %s: it %s", bs->rank,
               mep_bs_peer_label(peer, who, sizeof(who)), bs->address,
               peer->why);
}

void mep_bs_peer_describe_failure(const mep_bs_peer_t *peer, int64_t since_ms,
                                  char *buf, size_t len) {
  if (peer->why[0] != '\0') {
    snprintf(buf, len, "rank %d cut its connection because it %s",
             peer->bs->rank, peer->why);
    return;
  }
  /* UCX's status says how the transport noticed (a SIGKILLed process's
   * socket often reads as "Endpoint timeout" at once); what happened is
   * that the connection broke, so that is what the sentence says. */
  char when[64] = "";
  if (since_ms < 0) {
    /* No op to time it against. */
  } else if (peer->fail_ms >= since_ms) {
    snprintf(when, sizeof(when), " %lld ms into the op",
             (long long)(peer->fail_ms - since_ms));
  } else {
    snprintf(when, sizeof(when), " before the op began");
  }
  snprintf(buf, len,
           "its connection broke%s: the process exited, was killed or "
           "closed the group (UCX status: %s)",
           when, ucs_status_string(peer->fail_status));
}

void mep_bs_peer_free(mep_bs_peer_t *p) {
  free(p->addr);
  explicit_bzero(p->key_in, sizeof(p->key_in));
  explicit_bzero(p->key_out, sizeof(p->key_out));
  free(p);
}

mep_bs_peer_t *mep_bs_peer_new(mep_bootstrap_t *bs) {
  mep_bs_peer_t *p = (mep_bs_peer_t *)calloc(1, sizeof(*p));
  if (p == NULL) return NULL;
  p->bs = bs;
  p->rank = -1;
  p->state = MEP_BS_PEER_CLOSED;
  p->next = bs->peers;
  bs->peers = p;
  return p;
}

ucs_status_t mep_bs_peer_connect(mep_bootstrap_t *bs, mep_bs_peer_t *peer,
                                 const void *addr) {
  ucp_ep_params_t p;
  memset(&p, 0, sizeof(p));
  p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                 UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                 UCP_EP_PARAM_FIELD_ERR_HANDLER;
  p.address = (const ucp_address_t *)addr;
  p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  p.err_handler.cb = peer_err_cb;
  p.err_handler.arg = peer;
  /* Both sides create one ep to the other's worker; UCX pairs them (its
   * per-destination connection sequence numbers match), so a message from
   * the peer names this ep as its reply ep (msg_sender). */
  ucs_status_t st = ucp_ep_create(bs->worker, &p, &peer->ep);
  if (st != UCS_OK) {
    peer->ep = NULL;
    return st;
  }
  peer->state = MEP_BS_PEER_CONNECTING;
  return UCS_OK;
}

void mep_bs_peer_close(mep_bootstrap_t *bs, mep_bs_peer_t *peer, int force) {
  if (peer->ep == NULL) return;
  ucp_request_param_t p;
  memset(&p, 0, sizeof(p));
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = (force || peer->failed) ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucs_status_ptr_t r = ucp_ep_close_nbx(peer->ep, &p);
  peer->ep = NULL;
  peer->state = MEP_BS_PEER_CLOSED;
  if (UCS_PTR_IS_PTR(r)) peer->close_req = r;
  (void)bs;
}

void mep_bs_close_wait(mep_bootstrap_t *bs, int64_t deadline_ms) {
  int idle = 0;
  for (;;) {
    int pending = 0;
    for (mep_bs_peer_t *p = bs->peers; p != NULL; p = p->next) {
      if (p->close_req == NULL) continue;
      if (ucp_request_check_status(p->close_req) != UCS_INPROGRESS) {
        ucp_request_free(p->close_req);
        p->close_req = NULL;
      } else {
        pending++;
      }
    }
    if (pending == 0) return;
    if (mep_bs_now_ms() >= deadline_ms) break;
    mep_bs_progress(bs, &idle);
  }
  /* Give up on the rest: UCX releases them when they finish. */
  for (mep_bs_peer_t *p = bs->peers; p != NULL; p = p->next) {
    if (p->close_req == NULL) continue;
    ucp_request_free(p->close_req);
    p->close_req = NULL;
  }
}
