/* host_mesh_recv.c: the receiving side of the host mesh, run by the
 * progress thread: one active-message handler drops what it cannot
 * authenticate (host_mesh_seal.c), writes incoming puts into the local region (eager data
 * copied at once, rendezvous data pulled straight into place), applies
 * signals only after every earlier put from the same source has landed,
 * and notes wire-up and goodbye messages. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/error.h"
#include "runtime/host/host_mesh_impl.h"
#include "runtime/log.h"

static void recv_fail(struct mep_host_mesh *m, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void recv_fail(struct mep_host_mesh *m, const char *fmt, ...) {
  pthread_mutex_lock(&m->lock);
  if (!m->recv_error) {
    m->recv_error = 1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->recv_error_msg, sizeof m->recv_error_msg, fmt, ap);
    va_end(ap);
    pthread_cond_broadcast(&m->cond);
  }
  pthread_mutex_unlock(&m->lock);
}

/* The release store publishes the data the signal announces; last_op is
 * stored after it, so a waiter that sees last_op reach its value and then
 * re-reads the signal word sees the signal if it was ever sent. */
static void store_signal(struct mep_host_mesh *m, int src, uint64_t off, uint64_t value) {
  __atomic_store_n((uint64_t *)(m->region + off), value, __ATOMIC_RELEASE);
  if (value > __atomic_load_n(&m->last_op[src], __ATOMIC_RELAXED)) {
    __atomic_store_n(&m->last_op[src], value, __ATOMIC_RELEASE);
  }
  m->landed = 1;
}

static void apply_queued(mep_host_source_t *s) {
  for (size_t i = 0; i < s->nqueued; i++) {
    store_signal(s->mesh, s->rank, s->queued[i].offset, s->queued[i].value);
  }
  s->nqueued = 0;
}

/* The peer's goodbye takes effect: every signal it sent before it has
 * been applied, so last_op[src] is the last it will ever send. */
static void take_bye(struct mep_host_mesh *m, int src) {
  pthread_mutex_lock(&m->lock);
  m->peers[src].said_bye = 1;
  pthread_cond_broadcast(&m->cond);
  pthread_mutex_unlock(&m->lock);
  m->sources[src].bye_pending = 0;
}

/* The source's rendezvous receives have all landed: the signals behind
 * them apply, then a goodbye that came behind those. */
static void source_landed(mep_host_source_t *s) {
  apply_queued(s);
  if (s->bye_pending) take_bye(s->mesh, s->rank);
}

static int has_recv_error(struct mep_host_mesh *m) {
  pthread_mutex_lock(&m->lock);
  int e = m->recv_error;
  pthread_mutex_unlock(&m->lock);
  return e;
}

static void on_rndv_done(void *request, ucs_status_t status, size_t length,
                         void *user_data) {
  mep_host_source_t *s = user_data;
  if (status != UCS_OK) {
    /* Never announce data that did not land: the queued signals stay
     * unapplied and the waiter reports recv_error. */
    recv_fail(s->mesh, "receiving rank %d's rendezvous data (%llu bytes) failed: %s", s->rank,
              (unsigned long long)length, ucs_status_string(status));
  }
  if (--s->inflight == 0 && !has_recv_error(s->mesh)) source_landed(s);
  ucp_request_free(request);
}

/* Signals one source may have waiting behind its rendezvous data. An
 * honest peer has a few per operation in flight and runs at most its
 * buffer sets ahead; the bound keeps a peer that streams signals from
 * growing this rank's memory. */
#define MAX_QUEUED_SIGNALS 1024

static void queue_signal(mep_host_source_t *s, uint64_t off, uint64_t value) {
  if (s->nqueued >= MAX_QUEUED_SIGNALS) {
    recv_fail(s->mesh, "rank %d sent more than %d signals ahead of its rendezvous data still "
              "landing (the latest at %llu)", s->rank, MAX_QUEUED_SIGNALS,
              (unsigned long long)off);
    return;
  }
  if (s->nqueued == s->capqueued) {
    size_t cap = s->capqueued ? s->capqueued * 2 : 16;
    mep_host_signal_t *grown = realloc(s->queued, cap * sizeof(*grown));
    if (grown == NULL) {
      recv_fail(s->mesh, "out of memory queueing rank %d's signal at %llu (%llu)", s->rank,
                (unsigned long long)off, (unsigned long long)value);
      return;
    }
    s->queued = grown;
    s->capqueued = cap;
  }
  s->queued[s->nqueued++] = (mep_host_signal_t){off, value};
}

/* HELLO, HELLO_ACK, BYE, BYE_ACK: connection state, no region access. */
static void on_control(struct mep_host_mesh *m, const mep_host_msg_t *h) {
  if (h->kind == MEP_HOST_MSG_HELLO || h->kind == MEP_HOST_MSG_BYE) {
    int ack = h->kind == MEP_HOST_MSG_HELLO ? MEP_HOST_MSG_HELLO_ACK : MEP_HOST_MSG_BYE_ACK;
    /* Queued, not sent from inside the handler; an out-of-memory failure
     * leaves the peer to its bounded wait. */
    (void)mep_host_mesh_enqueue(m, h->src, ack, 0, 0, NULL, 0, 0);
  }
  mep_host_source_t *s = &m->sources[h->src];
  /* For waits, a goodbye counts after the source's rendezvous data still
   * landing, if any (source_landed); for sends, at once. */
  if (h->kind == MEP_HOST_MSG_BYE) s->bye_pending = s->inflight > 0;
  pthread_mutex_lock(&m->lock);
  mep_host_peer_t *p = &m->peers[h->src];
  if (h->kind == MEP_HOST_MSG_HELLO_ACK) p->acked = 1;
  if (h->kind == MEP_HOST_MSG_BYE_ACK) p->bye_acked = 1;
  if (h->kind == MEP_HOST_MSG_BYE) {
    p->bye_heard = 1;
    if (!s->bye_pending) p->said_bye = 1;
  }
  pthread_cond_broadcast(&m->cond);
  pthread_mutex_unlock(&m->lock);
}

/* A message this rank cannot take as its group's: nothing in it is
 * believed, not even the rank it names, so it fails nothing. Returning
 * UCS_OK drops its data, a rendezvous one's unfetched. */
static ucs_status_t drop_stranger(struct mep_host_mesh *m, const char *why, size_t header_length,
                                  size_t length) {
  uint64_t n = __atomic_add_fetch(&m->strangers, 1, __ATOMIC_RELAXED);
  if (n <= MEP_HOST_STRANGERS_LOGGED) {
    MEP_LOG_WARN("host", "rank %d dropped a message it could not authenticate (%s; header %zu "
                 "bytes, data %zu bytes): a UCX process outside the group reached its data "
                 "path, or replayed a message it saw", m->rank, why, header_length, length);
  }
  return UCS_OK;
}

/* NULL when h is a message of this group's, sent by h->src to this rank
 * and not taken before (its number now taken); else why not. The number
 * is taken only once the tag holds, so a forgery cannot use up a number
 * the sender will send. */
static const char *authenticate(struct mep_host_mesh *m, const mep_host_msg_t *h,
                                size_t length) {
  if (!m->keyed) return "before the group's keys";
  if (h->src < 0 || h->src >= m->world) return "names a rank outside the group";
  mep_host_source_t *s = &m->sources[h->src];
  if (!mep_host_msg_sealed(&s->key_in, h)) return "its tag is not its sender's";
  if (h->dst != m->rank || h->zero != 0) return "addressed elsewhere";
  if (h->bytes != length) return "its data is not the length its header says";
  if (!mep_host_seq_fresh(s, h->seq)) return "a number its sender used before";
  return NULL;
}

static ucs_status_t on_message(void *arg, const void *header, size_t header_length,
                               void *data, size_t length, const ucp_am_recv_param_t *param) {
  struct mep_host_mesh *m = arg;
  mep_host_msg_t h;
  if (header_length != sizeof(h)) {
    return drop_stranger(m, "not a header's size", header_length, length);
  }
  memcpy(&h, header, sizeof(h));
  const char *why = authenticate(m, &h, length);
  if (why != NULL) return drop_stranger(m, why, header_length, length);
  if (h.kind != MEP_HOST_MSG_PUT && h.kind != MEP_HOST_MSG_SIGNAL) {
    on_control(m, &h);
    return UCS_OK;
  }
  size_t span = h.kind == MEP_HOST_MSG_SIGNAL ? sizeof(uint64_t) : length;
  if (h.offset > m->region_bytes || span > m->region_bytes - h.offset) {
    recv_fail(m, "rank %d sent a %s outside the region (offset %llu, %llu bytes)", h.src,
              h.kind == MEP_HOST_MSG_SIGNAL ? "signal" : "put", (unsigned long long)h.offset,
              (unsigned long long)span);
    return UCS_OK;
  }
  if (h.kind == MEP_HOST_MSG_SIGNAL && h.offset % sizeof(uint64_t) != 0) {
    /* A signal is one atomic 8-byte store: misaligned, it would not be. */
    recv_fail(m, "rank %d sent a signal at offset %llu, not a multiple of 8", h.src,
              (unsigned long long)h.offset);
    return UCS_OK;
  }
  mep_host_source_t *s = &m->sources[h.src];
  if (h.kind == MEP_HOST_MSG_PUT) (void)__atomic_load_n(&m->reads_done, __ATOMIC_ACQUIRE);
  if (h.kind == MEP_HOST_MSG_SIGNAL) {
    if (s->inflight > 0) {
      queue_signal(s, h.offset, h.value);
    } else {
      store_signal(m, h.src, h.offset, h.value);
    }
    return UCS_OK;
  }
  if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
    memcpy(m->region + h.offset, data, length);
    return UCS_OK;
  }
  ucp_request_param_t p = {
      .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
      .cb.recv_am = on_rndv_done,
      .user_data = s,
  };
  s->inflight++;
  void *req = ucp_am_recv_data_nbx(m->worker, data, m->region + h.offset, length, &p);
  if (req == NULL) {
    if (--s->inflight == 0) source_landed(s);
  } else if (UCS_PTR_IS_ERR(req)) {
    s->inflight--;
    recv_fail(m, "pulling rank %d's data at offset %llu (%llu bytes) failed: %s", h.src,
              (unsigned long long)h.offset, (unsigned long long)length,
              ucs_status_string(UCS_PTR_STATUS(req)));
  }
  return UCS_OK;
}

moe_ep_status_t mep_host_mesh_recv_start(struct mep_host_mesh *m) {
  m->sources = calloc((size_t)m->world, sizeof(*m->sources));
  if (m->sources == NULL) return mep_error(MOE_EP_ERR_NO_MEMORY, "host mesh: out of memory");
  for (int r = 0; r < m->world; r++) {
    m->sources[r].mesh = m;
    m->sources[r].rank = r;
  }
  ucp_am_handler_param_t hp = {
      .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG,
      .id = MEP_HOST_AM_ID,
      .cb = on_message,
      .arg = m,
  };
  ucs_status_t us = ucp_worker_set_am_recv_handler(m->worker, &hp);
  if (us != UCS_OK) {
    return mep_error(MOE_EP_ERR_UCX, "host mesh: ucp_worker_set_am_recv_handler: %s",
                     ucs_status_string(us));
  }
  m->handler_set = 1;
  return MOE_EP_OK;
}

/* After the progress thread stopped and the worker was destroyed. */
void mep_host_mesh_recv_stop(struct mep_host_mesh *m) {
  m->handler_set = 0;
  for (int r = 0; m->sources != NULL && r < m->world; r++) free(m->sources[r].queued);
  free(m->sources);
  m->sources = NULL;
}
