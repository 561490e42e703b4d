/* bootstrap_root.c: rank 0's side of forming the group: the listener,
 * accepting connections, checking each handshake (magic, version, rank,
 * world size, token), refusing strangers while waiting for the real ranks,
 * and telling everyone the group formed (or why it did not). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/bootstrap_types.h"
#include "runtime/error.h"
#include "runtime/log.h"

static void root_conn_cb(ucp_conn_request_h req, void *arg) {
  mep_bootstrap_t *bs = (mep_bootstrap_t *)arg;
  if (bs->formed) {
    ucp_listener_reject(bs->listener, req);
    return;
  }
  if (bs->num_conn_reqs == bs->cap_conn_reqs) {
    int cap = bs->cap_conn_reqs ? bs->cap_conn_reqs * 2 : 16;
    void *n = realloc(bs->conn_reqs, (size_t)cap * sizeof(*bs->conn_reqs));
    if (n == NULL) {
      ucp_listener_reject(bs->listener, req);
      return;
    }
    bs->conn_reqs = (ucp_conn_request_h *)n;
    bs->cap_conn_reqs = cap;
  }
  /* Endpoints are created outside the callback, in the wait loop. */
  bs->conn_reqs[bs->num_conn_reqs++] = req;
}

static moe_ep_status_t root_listen(mep_bootstrap_t *bs) {
  MEP_CHECK(mep_bs_addr_check_bindable(bs));
  ucp_listener_params_t lp;
  memset(&lp, 0, sizeof(lp));
  lp.field_mask =
      UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  lp.sockaddr.addr = (const struct sockaddr *)&bs->saddr;
  lp.sockaddr.addrlen = bs->saddr_len;
  lp.conn_handler.cb = root_conn_cb;
  lp.conn_handler.arg = bs;
  ucs_status_t st = ucp_listener_create(bs->worker, &lp, &bs->listener);
  if (st != UCS_OK) {
    bs->listener = NULL;
    return mep_error(MOE_EP_ERR_BOOTSTRAP,
                     "rank 0 cannot listen on bootstrap address %s: "
                     "ucp_listener_create: %s",
                     bs->address, ucs_status_string(st));
  }
  return MOE_EP_OK;
}

/* "127.0.0.1:40312": how the log names a connection before it joins. */
static void root_name_client(ucp_conn_request_h req, char *buf, size_t len) {
  ucp_conn_request_attr_t a;
  memset(&a, 0, sizeof(a));
  a.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
  char host[INET6_ADDRSTRLEN] = "?";
  if (ucp_conn_request_query(req, &a) != UCS_OK) {
    snprintf(buf, len, "an unknown address");
    return;
  }
  int port = 0;
  if (a.client_address.ss_family == AF_INET) {
    const struct sockaddr_in *v4 = (const struct sockaddr_in *)&a.client_address;
    inet_ntop(AF_INET, &v4->sin_addr, host, sizeof(host));
    port = ntohs(v4->sin_port);
    snprintf(buf, len, "%s:%d", host, port);
  } else if (a.client_address.ss_family == AF_INET6) {
    const struct sockaddr_in6 *v6 =
        (const struct sockaddr_in6 *)&a.client_address;
    inet_ntop(AF_INET6, &v6->sin6_addr, host, sizeof(host));
    port = ntohs(v6->sin6_port);
    snprintf(buf, len, "[%s]:%d", host, port);
  } else {
    snprintf(buf, len, "an address of family %d", a.client_address.ss_family);
  }
}

static void root_accept_conns(mep_bootstrap_t *bs) {
  for (int i = 0; i < bs->num_conn_reqs; i++) {
    mep_bs_peer_t *peer = mep_bs_peer_new(bs);
    if (peer == NULL) {
      ucp_listener_reject(bs->listener, bs->conn_reqs[i]);
      continue;
    }
    root_name_client(bs->conn_reqs[i], peer->name, sizeof(peer->name));
    ucp_ep_params_t p;
    mep_bs_peer_ep_params(peer, &p);
    p.field_mask |= UCP_EP_PARAM_FIELD_CONN_REQUEST;
    p.conn_request = bs->conn_reqs[i];
    ucs_status_t st = ucp_ep_create(bs->worker, &p, &peer->ep);
    if (st != UCS_OK) {
      peer->ep = NULL;
      MEP_LOG_DEBUG("bootstrap", "rank 0: accepting a connection failed: %s",
                    ucs_status_string(st));
      continue;
    }
    peer->state = MEP_BS_PEER_CONNECTING;
  }
  bs->num_conn_reqs = 0;
}

/* Constant time, so a stranger cannot learn the token byte by byte. */
static int token_equal(const char *a, size_t alen, const char *b, size_t blen) {
  unsigned char diff = (unsigned char)(alen != blen);
  size_t n = alen < blen ? alen : blen;
  for (size_t i = 0; i < n; i++) diff |= (unsigned char)(a[i] ^ b[i]);
  return diff == 0;
}

/* Returns 1 and fills `why` when the HELLO must be refused. */
static int root_check_hello(const mep_bootstrap_t *bs, const mep_bs_msg_t *m,
                            char *why, size_t why_len) {
  const mep_bs_hdr_t *h = &m->hdr;
  size_t expected = strlen(bs->token);
  if (h->version != MEP_BS_VERSION) {
    snprintf(why, why_len, "protocol version %u, rank 0 speaks version %u",
             h->version, MEP_BS_VERSION);
  } else if (h->world_size != bs->world_size) {
    snprintf(why, why_len,
             "world size mismatch: rank %d says world_size %d, rank 0 has %d",
             h->src, h->world_size, bs->world_size);
  } else if (h->src < 1 || h->src >= bs->world_size) {
    snprintf(why, why_len, "rank %d is outside 1..%d", h->src,
             bs->world_size - 1);
  } else if (expected != 0 && m->len == 0) {
    snprintf(why, why_len, "no job token presented; rank 0 expects one");
  } else if (expected != 0 &&
             !token_equal((const char *)m->payload, m->len, bs->token,
                          expected)) {
    snprintf(why, why_len, "wrong job token");
  } else if (expected == 0 && m->len != 0) {
    snprintf(why, why_len,
             "a job token was presented but rank 0 expects none");
  } else if (bs->by_rank[h->src] != NULL) {
    snprintf(why, why_len, "rank %d already joined", h->src);
  } else {
    return 0;
  }
  return 1;
}

static void root_reply(mep_bootstrap_t *bs, mep_bs_peer_t *peer, int type,
                       const char *reason) {
  mep_bs_hdr_t h;
  mep_bs_hdr_init(bs, &h, type);
  h.payload_len = reason != NULL ? strlen(reason) : 0;
  (void)mep_bs_send(bs, peer, &h, reason, NULL);
}

static void root_handle_hellos(mep_bootstrap_t *bs) {
  mep_bs_msg_t *m;
  while ((m = mep_bs_msg_take(bs, MEP_BS_MSG_HELLO, NULL)) != NULL) {
    /* Only a connection still waiting for its verdict may send a HELLO
     * (bootstrap_msg.c refuses the rest), and only one. */
    mep_bs_peer_t *peer = m->peer;
    if (peer->ep == NULL || peer->state != MEP_BS_PEER_CONNECTING) {
      mep_bs_msg_free(m);
      continue;
    }
    char why[MEP_BS_REASON_MAX];
    if (root_check_hello(bs, m, why, sizeof(why))) {
      MEP_LOG_WARN("bootstrap",
                   "rank 0 refused a connection from %s claiming rank %d of "
                   "%d on %s: %s",
                   peer->name, m->hdr.src, m->hdr.world_size, bs->address,
                   why);
      /* The refused side closes; closing here could race the reply. */
      root_reply(bs, peer, MEP_BS_MSG_REFUSE, why);
      peer->state = MEP_BS_PEER_REFUSED;
    } else {
      peer->rank = m->hdr.src;
      peer->state = MEP_BS_PEER_JOINED;
      bs->by_rank[peer->rank] = peer;
      root_reply(bs, peer, MEP_BS_MSG_ACCEPT, NULL);
      MEP_LOG_DEBUG("bootstrap", "rank 0: rank %d joined", peer->rank);
    }
    mep_bs_msg_free(m);
  }
}

/* A rank that died before the group formed may come back: free its slot. */
static void root_drop_failed(mep_bootstrap_t *bs) {
  for (int r = 1; r < bs->world_size; r++) {
    mep_bs_peer_t *p = bs->by_rank[r];
    if (p == NULL || !p->failed) continue;
    MEP_LOG_WARN("bootstrap", "rank 0: rank %d left before the group formed (%s)",
                 r, ucs_status_string(p->fail_status));
    mep_bs_peer_close(bs, p, 1);
    bs->by_rank[r] = NULL;
  }
}

void mep_bs_format_ranks(char *buf, size_t len, const int *ranks, int n) {
  size_t off = 0;
  buf[0] = '\0';
  for (int i = 0; i < n && off + 16 < len; i++) {
    if (i == 12 && n > 13) {
      snprintf(buf + off, len - off, ", ... (%d in all)", n);
      return;
    }
    int w = snprintf(buf + off, len - off, "%s%d", i ? ", " : "", ranks[i]);
    if (w < 0) return;
    off += (size_t)w;
  }
}

void mep_bs_root_abort(mep_bootstrap_t *bs, moe_ep_status_t status,
                       int failed_rank, const char *msg) {
  mep_bs_send_t *sends[MEP_BS_MAX_RANKS];
  int n = 0;
  mep_bs_hdr_t h;
  mep_bs_hdr_init(bs, &h, MEP_BS_MSG_ABORT);
  h.status = (int32_t)status;
  h.failed_rank = failed_rank;
  h.payload_len = strlen(msg);
  for (int r = 1; r < bs->world_size; r++) {
    mep_bs_peer_t *p = bs->by_rank[r];
    if (p == NULL || p->failed || p->ep == NULL) continue;
    mep_bs_send_t *s = NULL;
    (void)mep_bs_send(bs, p, &h, msg, &s);
    if (s != NULL) sends[n++] = s;
  }
  /* Best effort and short: the survivors' own deadlines back this up. */
  int64_t wait = bs->timeout_ms < 500 ? bs->timeout_ms : 500;
  int64_t deadline = mep_bs_now_ms() + wait;
  for (int i = 0; i < n; i++) (void)mep_bs_send_wait(bs, sends[i], deadline);
}

static moe_ep_status_t root_announce(mep_bootstrap_t *bs, int64_t deadline_ms) {
  mep_bs_send_t *sends[MEP_BS_MAX_RANKS];
  mep_bs_hdr_t h;
  mep_bs_hdr_init(bs, &h, MEP_BS_MSG_FORMED);
  for (int r = 1; r < bs->world_size; r++) {
    sends[r] = NULL;
    (void)mep_bs_send(bs, bs->by_rank[r], &h, NULL, &sends[r]);
  }
  /* Joined a moment ago; allow a little past the form deadline. */
  int64_t deadline = deadline_ms + mep_bs_slack_ms(bs);
  int bad = -1;
  ucs_status_t bad_st = UCS_OK;
  for (int r = 1; r < bs->world_size; r++) {
    ucs_status_t st = mep_bs_send_wait(bs, sends[r], deadline);
    if (st != UCS_OK && bad < 0) {
      bad = r;
      bad_st = st;
    }
  }
  if (bad < 0) return MOE_EP_OK;
  char what[MEP_BS_REASON_MAX - 96];
  if (bs->by_rank[bad]->failed) {
    mep_bs_peer_describe_failure(bs->by_rank[bad], -1, what, sizeof(what));
  } else {
    snprintf(what, sizeof(what), "telling it so failed (UCX status: %s)",
             ucs_status_string(bad_st));
  }
  char msg[MEP_BS_REASON_MAX];
  snprintf(msg, sizeof(msg), "rank %d failed as the group formed on %s: %s",
           bad, bs->address, what);
  mep_bs_root_abort(bs, MOE_EP_ERR_BOOTSTRAP, bad, msg);
  return mep_error(MOE_EP_ERR_BOOTSTRAP, "%s", msg);
}

/* Strangers and silent connections are not part of the group. */
static void root_close_others(mep_bootstrap_t *bs) {
  for (int i = 0; i < bs->num_conn_reqs; i++) {
    ucp_listener_reject(bs->listener, bs->conn_reqs[i]);
  }
  bs->num_conn_reqs = 0;
  bs->formed = 1;
  /* No one else may join now: close the listener, so the kernel refuses
   * later connections instead of UCX holding (and, past about a thousand
   * at once, crashing on) connections it would only reject. The joined
   * ranks' accepted connections keep the port from being handed out as an
   * ephemeral port until destroy (bootstrap_types.h). */
  if (bs->listener != NULL) {
    ucp_listener_destroy(bs->listener);
    bs->listener = NULL;
  }
  for (mep_bs_peer_t *p = bs->peers; p != NULL; p = p->next) {
    if (p->ep != NULL && p->state != MEP_BS_PEER_JOINED) {
      mep_bs_peer_close(bs, p, p->state == MEP_BS_PEER_REFUSED);
    }
  }
}

moe_ep_status_t mep_bs_root_form(mep_bootstrap_t *bs, int64_t deadline_ms) {
  MEP_CHECK(root_listen(bs));
  int idle = 0;
  int joined = 0;
  while (mep_bs_now_ms() < deadline_ms) {
    mep_bs_progress(bs, &idle);
    root_accept_conns(bs);
    root_handle_hellos(bs);
    root_drop_failed(bs);
    joined = 0;
    for (int r = 1; r < bs->world_size; r++) joined += bs->by_rank[r] != NULL;
    if (joined == bs->world_size - 1) {
      root_close_others(bs);
      return root_announce(bs, deadline_ms);
    }
  }
  int missing[MEP_BS_MAX_RANKS] = {0};
  int n = 0;
  for (int r = 1; r < bs->world_size; r++) {
    if (bs->by_rank[r] == NULL) missing[n++] = r;
  }
  char list[256];
  mep_bs_format_ranks(list, sizeof(list), missing, n);
  char msg[MEP_BS_REASON_MAX];
  snprintf(msg, sizeof(msg),
           "group did not form within %d ms on %s: %s %s never joined "
           "(%d of %d ranks present)",
           bs->timeout_ms, bs->address, n == 1 ? "rank" : "ranks", list,
           joined + 1, bs->world_size);
  mep_bs_root_abort(bs, MOE_EP_ERR_BOOTSTRAP, n == 1 ? missing[0] : -1, msg);
  root_close_others(bs);
  return mep_error(MOE_EP_ERR_BOOTSTRAP, "%s", msg);
}
