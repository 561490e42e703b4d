/* bootstrap_msg.c: message framing and transport for the bootstrap: one
 * active-message handler that queues what arrives, sends from private
 * copies with bounded waits, endpoint error callbacks and bounded closes. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/bootstrap_types.h"
#include "runtime/error.h"
#include "runtime/log.h"

int64_t mep_bs_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Rendezvous receives are started outside the AM callback (UCX forbids
 * progress-driving calls inside it). */
static void msg_rndv_done(void *request, ucs_status_t status, size_t length,
                          void *user_data) {
  mep_bs_msg_t *m = (mep_bs_msg_t *)user_data;
  m->rndv_status = status;
  m->ready = 1;
  (void)length;
  ucp_request_free(request);
}

static void msgs_start_rndv(mep_bootstrap_t *bs) {
  for (mep_bs_msg_t *m = bs->msgs; m != NULL; m = m->next) {
    if (m->rndv_desc == NULL) continue;
    void *desc = m->rndv_desc;
    m->rndv_desc = NULL;
    ucp_request_param_t p;
    memset(&p, 0, sizeof(p));
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.recv_am = msg_rndv_done;
    p.user_data = m;
    ucs_status_ptr_t r =
        ucp_am_recv_data_nbx(bs->worker, desc, m->payload, m->len, &p);
    if (r == NULL) {
      m->ready = 1;
    } else if (UCS_PTR_IS_ERR(r)) {
      m->rndv_status = UCS_PTR_STATUS(r);
      m->ready = 1;
    }
  }
}

void mep_bs_progress(mep_bootstrap_t *bs, int *idle) {
  unsigned n = 0;
  while (ucp_worker_progress(bs->worker) != 0) n++;
  msgs_start_rndv(bs);
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

static ucs_status_t msg_am_cb(void *arg, const void *header,
                              size_t header_length, void *data, size_t length,
                              const ucp_am_recv_param_t *param) {
  mep_bootstrap_t *bs = (mep_bootstrap_t *)arg;
  int rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  if (header_length != sizeof(mep_bs_hdr_t)) {
    MEP_LOG_DEBUG("bootstrap", "dropped a message with a %zu-byte header",
                  header_length);
    return UCS_OK;
  }
  mep_bs_hdr_t h;
  memcpy(&h, header, sizeof(h));
  if (h.magic != MEP_BS_MAGIC || h.payload_len != length) {
    MEP_LOG_DEBUG("bootstrap", "dropped a message with magic 0x%x", h.magic);
    return UCS_OK;
  }
  if (h.type == MEP_BS_MSG_ABORT && !rndv && bs->rank != 0) {
    msg_note_abort(bs, &h, (const char *)data, length);
    return UCS_OK;
  }
  mep_bs_msg_t *m = (mep_bs_msg_t *)calloc(1, sizeof(*m));
  void *payload = length != 0 ? malloc(length) : NULL;
  if (m == NULL || (length != 0 && payload == NULL)) {
    free(m);
    free(payload);
    /* Lost message: the wait for it will time out and say so. */
    return UCS_OK;
  }
  m->hdr = h;
  m->payload = payload;
  m->len = length;
  m->reply_ep = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)
                    ? param->reply_ep
                    : NULL;
  m->rndv_status = UCS_OK;
  /* Append: per-source order is the order the waits expect. */
  mep_bs_msg_t **tail = &bs->msgs;
  while (*tail != NULL) tail = &(*tail)->next;
  *tail = m;
  if (rndv) {
    m->rndv_desc = data;
    return UCS_INPROGRESS;
  }
  if (length != 0) memcpy(payload, data, length);
  m->ready = 1;
  return UCS_OK;
}

moe_ep_status_t mep_bs_worker_setup(mep_bootstrap_t *bs) {
  ucp_params_t cp;
  memset(&cp, 0, sizeof(cp));
  cp.field_mask = UCP_PARAM_FIELD_FEATURES;
  /* The host backend reuses this context for its data path. */
  cp.features = UCP_FEATURE_TAG | UCP_FEATURE_RMA | UCP_FEATURE_AM |
                UCP_FEATURE_AMO64;
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
    free(s->buf);
    free(s);
    return;
  }
  s->status = status;
  s->done = 1;
}

ucs_status_t mep_bs_send(mep_bootstrap_t *bs, mep_bs_peer_t *peer,
                         const mep_bs_hdr_t *hdr, const void *payload,
                         mep_bs_send_t **out) {
  if (out != NULL) *out = NULL;
  if (peer == NULL || peer->ep == NULL) return UCS_ERR_NOT_CONNECTED;
  size_t len = (size_t)hdr->payload_len;
  mep_bs_send_t *s = (mep_bs_send_t *)calloc(1, sizeof(*s));
  void *buf = malloc(sizeof(*hdr) + len);
  if (s == NULL || buf == NULL) {
    free(s);
    free(buf);
    return UCS_ERR_NO_MEMORY;
  }
  memcpy(buf, hdr, sizeof(*hdr));
  if (len != 0) memcpy((char *)buf + sizeof(*hdr), payload, len);
  s->buf = buf;
  s->orphaned = (out == NULL);
  ucp_request_param_t p;
  memset(&p, 0, sizeof(p));
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                   UCP_OP_ATTR_FIELD_FLAGS;
  p.cb.send = send_done;
  p.user_data = s;
  /* Eager only: the receive side then always gets whole, inline data. The
   * reply flag lets rank 0 tie a HELLO to the endpoint it arrived on. */
  p.flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY;
  ucs_status_ptr_t r = ucp_am_send_nbx(peer->ep, MEP_BS_AM_ID, buf,
                                       sizeof(*hdr), (char *)buf + sizeof(*hdr),
                                       len, &p);
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
    free(buf);
    free(s);
  }
  return st;
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
  free(s->buf);
  free(s);
  return st;
}

mep_bs_msg_t *mep_bs_msg_take(mep_bootstrap_t *bs, int type, int src) {
  for (mep_bs_msg_t **pp = &bs->msgs; *pp != NULL; pp = &(*pp)->next) {
    mep_bs_msg_t *m = *pp;
    if (!m->ready || m->hdr.type != type) continue;
    if (src >= 0 && m->hdr.src != src) continue;
    *pp = m->next;
    m->next = NULL;
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
  }
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

void mep_bs_peer_ep_params(mep_bs_peer_t *peer, ucp_ep_params_t *p) {
  memset(p, 0, sizeof(*p));
  p->field_mask =
      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  p->err_mode = UCP_ERR_HANDLING_MODE_PEER;
  p->err_handler.cb = peer_err_cb;
  p->err_handler.arg = peer;
}

void mep_bs_peer_close(mep_bootstrap_t *bs, mep_bs_peer_t *peer, int force) {
  if (peer->ep == NULL) return;
  ucp_request_param_t p;
  memset(&p, 0, sizeof(p));
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = (force || peer->failed) ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucs_status_ptr_t r = ucp_ep_close_nbx(peer->ep, &p);
  peer->ep = NULL;
  if (peer->state != MEP_BS_PEER_REFUSED) peer->state = MEP_BS_PEER_CLOSED;
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
