/* host_mesh.c: the sending side of the host mesh: a full mesh of UCX
 * endpoints, puts and signals as active messages (see host_mesh_recv.c for
 * the receiver), local completion, and bounded waits on local signals.
 * Active messages rather than RMA: UCX 1.13 emulates RMA over TCP with
 * acknowledgements, and an acknowledgement to a peer that just died aborts
 * the process inside UCX; a failed active message is only a failed request. */
#define _GNU_SOURCE /* clock_gettime, posix_memalign under -std=c11 */
#include "runtime/host/host_mesh_impl.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <ucp/api/ucp.h>

#include "runtime/error.h"
#include "runtime/log.h"

#define BLOB_MAX 4096 /* worker address exchange slot */

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status) {
  mep_host_peer_t *p = arg;
  p->failed = 1;
  p->fail_status = status;
  if (p->mesh->first_failed < 0) p->mesh->first_failed = (int)(p - p->mesh->peers);
}

static moe_ep_status_t peer_failed_error(mep_host_mesh_t *m, int peer,
                                         const char *what) {
  return mep_error(MOE_EP_ERR_PEER_FAILED,
                   "%s: rank %d lost its connection to rank %d (%s); the peer "
                   "process died or closed the group",
                   what, m->rank, peer, ucs_status_string(m->peers[peer].fail_status));
}

/* Allgathers a variable-size blob (a worker address) in fixed slots. */
static moe_ep_status_t allgather_blob(mep_host_mesh_t *m, const void *blob,
                                      size_t len, uint8_t **all) {
  if (len + sizeof(uint64_t) > BLOB_MAX) {
    return mep_error(MOE_EP_ERR_UCX, "host mesh: UCX blob of %zu bytes exceeds %d",
                     len, BLOB_MAX);
  }
  uint8_t *mine = calloc(1, BLOB_MAX);
  *all = calloc((size_t)m->world, BLOB_MAX);
  if (mine == NULL || *all == NULL) {
    free(mine);
    free(*all);
    *all = NULL;
    return mep_error(MOE_EP_ERR_NO_MEMORY, "host mesh: out of memory");
  }
  uint64_t l = len;
  memcpy(mine, &l, sizeof(l));
  memcpy(mine + sizeof(l), blob, len);
  moe_ep_status_t st = mep_bootstrap_allgather(m->bs, mine, *all, BLOB_MAX);
  free(mine);
  if (st != MOE_EP_OK) {
    free(*all);
    *all = NULL;
  }
  return st;
}

static moe_ep_status_t connect_peers(mep_host_mesh_t *m) {
  ucp_address_t *addr;
  size_t addr_len;
  ucs_status_t us = ucp_worker_get_address(m->worker, &addr, &addr_len);
  if (us != UCS_OK) {
    return mep_error(MOE_EP_ERR_UCX, "host mesh: ucp_worker_get_address: %s",
                     ucs_status_string(us));
  }
  uint8_t *all;
  moe_ep_status_t st = allgather_blob(m, addr, addr_len, &all);
  ucp_worker_release_address(m->worker, addr);
  if (st != MOE_EP_OK) return st;
  for (int p = 0; p < m->world && st == MOE_EP_OK; p++) {
    ucp_ep_params_t ep = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address = (const ucp_address_t *)(all + (size_t)p * BLOB_MAX + 8),
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = on_ep_error, .arg = &m->peers[p]},
    };
    us = ucp_ep_create(m->worker, &ep, &m->peers[p].ep);
    if (us != UCS_OK) {
      st = mep_error(MOE_EP_ERR_UCX, "host mesh: rank %d cannot connect to rank %d: %s",
                     m->rank, p, ucs_status_string(us));
    }
  }
  free(all);
  return st;
}

static moe_ep_status_t alloc_region(mep_host_mesh_t *m) {
  if (posix_memalign((void **)&m->region, 4096, m->region_bytes) != 0) {
    return mep_error(MOE_EP_ERR_NO_MEMORY,
                     "host mesh: cannot allocate %zu bytes of buffers", m->region_bytes);
  }
  memset(m->region, 0, m->region_bytes);
  return MOE_EP_OK;
}

moe_ep_status_t mep_host_mesh_create(mep_bootstrap_t *bs, size_t region_bytes,
                                     int timeout_ms, mep_host_mesh_t **out) {
  mep_host_mesh_t *m = calloc(1, sizeof(*m));
  if (m == NULL) return mep_error(MOE_EP_ERR_NO_MEMORY, "host mesh: out of memory");
  m->bs = bs;
  m->worker = mep_bootstrap_ucp_worker(bs);
  m->rank = mep_bootstrap_rank(bs);
  m->world = mep_bootstrap_world_size(bs);
  m->timeout_ms = timeout_ms;
  m->region_bytes = region_bytes;
  m->first_failed = -1;
  m->peers = calloc((size_t)m->world, sizeof(mep_host_peer_t));
  for (int p = 0; m->peers != NULL && p < m->world; p++) m->peers[p].mesh = m;
  moe_ep_status_t st;
  if (m->peers == NULL) {
    st = mep_error(MOE_EP_ERR_NO_MEMORY, "host mesh: out of memory");
    goto out_destroy;
  }
  MEP_CHECK_GOTO(alloc_region(m), st, out_destroy);
  MEP_CHECK_GOTO(mep_host_mesh_recv_start(m), st, out_destroy);
  MEP_CHECK_GOTO(connect_peers(m), st, out_destroy);
  /* Nobody may put into a peer before its region is registered. */
  MEP_CHECK_GOTO(mep_bootstrap_barrier(bs), st, out_destroy);
  *out = m;
  return MOE_EP_OK;
out_destroy:
  mep_host_mesh_destroy(m);
  return st;
}

static void release_request(mep_host_mesh_t *m, size_t i) {
  ucp_request_free(m->reqs[i]);
  free(m->req_hdr[i]);
  m->nreqs--;
  m->reqs[i] = m->reqs[m->nreqs];
  m->req_hdr[i] = m->req_hdr[m->nreqs];
  m->req_peer[i] = m->req_peer[m->nreqs];
}

/* Teardown order matters: endpoints first (UCX may still read the headers
 * of unfinished sends), then those sends, then any rendezvous data still
 * landing in the region, and only then the region itself. */
void mep_host_mesh_destroy(mep_host_mesh_t *m) {
  if (m == NULL) return;
  for (int p = 0; m->peers != NULL && p < m->world; p++) {
    if (m->peers[p].ep == NULL) continue;
    /* Force close: a peer may already be gone, so never wait on it. */
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                               .flags = UCP_EP_CLOSE_FLAG_FORCE};
    void *req = ucp_ep_close_nbx(m->peers[p].ep, &prm);
    if (UCS_PTR_IS_PTR(req)) {
      int64_t deadline = now_ns() + 1000000000LL;
      while (ucp_request_check_status(req) == UCS_INPROGRESS && now_ns() < deadline) {
        ucp_worker_progress(m->worker);
      }
      ucp_request_free(req);
    }
  }
  while (m->nreqs > 0) {
    ucp_request_cancel(m->worker, m->reqs[0]);
    release_request(m, 0);
  }
  free(m->reqs);
  free(m->req_hdr);
  free(m->req_peer);
  int64_t deadline = now_ns() + 1000000000LL;
  for (int r = 0; m->sources != NULL && r < m->world; r++) {
    while (m->sources[r].inflight > 0 && now_ns() < deadline) ucp_worker_progress(m->worker);
  }
  mep_host_mesh_recv_stop(m);
  free(m->region);
  free(m->peers);
  free(m);
}

uint8_t *mep_host_mesh_local(mep_host_mesh_t *m) { return m->region; }

void mep_host_mesh_begin(mep_host_mesh_t *m) {
  m->deadline_ns = now_ns() + (int64_t)m->timeout_ms * 1000000LL;
}

/* Keeps a send (and its header, which UCX reads until the send completes). */
static moe_ep_status_t track(mep_host_mesh_t *m, void *req, mep_host_msg_t *hdr, int peer,
                             const char *what) {
  if (req == NULL) {
    free(hdr);
    return MOE_EP_OK;
  }
  if (UCS_PTR_IS_ERR(req)) {
    free(hdr);
    if (m->peers[peer].failed) return peer_failed_error(m, peer, what);
    return mep_error(MOE_EP_ERR_UCX, "%s to rank %d: %s", what, peer,
                     ucs_status_string(UCS_PTR_STATUS(req)));
  }
  if (m->nreqs == m->reqcap) {
    size_t cap = m->reqcap ? m->reqcap * 2 : 256;
    void **grown = realloc(m->reqs, cap * sizeof(void *));
    if (grown != NULL) m->reqs = grown;
    mep_host_msg_t **grown_hdr = realloc(m->req_hdr, cap * sizeof(*grown_hdr));
    if (grown_hdr != NULL) m->req_hdr = grown_hdr;
    int *grown_peer = realloc(m->req_peer, cap * sizeof(int));
    if (grown_peer != NULL) m->req_peer = grown_peer;
    if (grown == NULL || grown_hdr == NULL || grown_peer == NULL) {
      /* The send is in flight: wait for it rather than leak its header. */
      while (ucp_request_check_status(req) == UCS_INPROGRESS) ucp_worker_progress(m->worker);
      ucp_request_free(req);
      free(hdr);
      return mep_error(MOE_EP_ERR_NO_MEMORY, "host mesh: out of memory");
    }
    m->reqcap = cap;
  }
  m->req_peer[m->nreqs] = peer;
  m->req_hdr[m->nreqs] = hdr;
  m->reqs[m->nreqs++] = req;
  return MOE_EP_OK;
}

static moe_ep_status_t send_msg(mep_host_mesh_t *m, int peer, int kind, uint64_t offset,
                                uint64_t value, const void *data, size_t bytes,
                                const char *what) {
  if (m->peers[peer].failed) return peer_failed_error(m, peer, what);
  mep_host_msg_t *hdr = malloc(sizeof(*hdr));
  if (hdr == NULL) return mep_error(MOE_EP_ERR_NO_MEMORY, "host mesh: out of memory");
  *hdr = (mep_host_msg_t){.offset = offset, .value = value, .src = m->rank, .kind = kind};
  ucp_request_param_t prm = {.op_attr_mask = 0};
  void *req = ucp_am_send_nbx(m->peers[peer].ep, MEP_HOST_AM_ID, hdr, sizeof(*hdr), data,
                              bytes, &prm);
  return track(m, req, hdr, peer, what);
}

moe_ep_status_t mep_host_mesh_put(mep_host_mesh_t *m, int peer, const void *src,
                                  size_t bytes, size_t remote_off) {
  if (bytes == 0) return MOE_EP_OK;
  return send_msg(m, peer, MEP_HOST_MSG_PUT, remote_off, 0, src, bytes, "put");
}

moe_ep_status_t mep_host_mesh_signal(mep_host_mesh_t *m, int peer,
                                     size_t remote_off, uint64_t value) {
  return send_msg(m, peer, MEP_HOST_MSG_SIGNAL, remote_off, value, NULL, 0, "signal");
}

static moe_ep_status_t recv_error(mep_host_mesh_t *m, const char *what) {
  return mep_error(MOE_EP_ERR_UCX, "%s: rank %d: %s", what, m->rank, m->recv_error_msg);
}

moe_ep_status_t mep_host_mesh_complete(mep_host_mesh_t *m, const char *what) {
  int64_t deadline = m->deadline_ns;
  moe_ep_status_t st = MOE_EP_OK;
  size_t i = 0;
  while (i < m->nreqs) {
    ucs_status_t us = ucp_request_check_status(m->reqs[i]);
    if (us == UCS_INPROGRESS) {
      if (m->first_failed >= 0) return peer_failed_error(m, m->first_failed, what);
      if (now_ns() > deadline) {
        return mep_error(MOE_EP_ERR_TIMEOUT,
                         "%s: rank %d's puts to rank %d did not complete within "
                         "timeouts.kernel_ms=%d; rank %d is not receiving (it did not "
                         "take part in the operation)",
                         what, m->rank, m->req_peer[i], m->timeout_ms, m->req_peer[i]);
      }
      ucp_worker_progress(m->worker);
      continue;
    }
    if (us != UCS_OK && st == MOE_EP_OK) {
      int p = m->peers[m->req_peer[i]].failed ? m->req_peer[i] : m->first_failed;
      st = p >= 0 ? peer_failed_error(m, p, what)
                  : mep_error(MOE_EP_ERR_PEER_FAILED,
                              "%s: rank %d's send to rank %d failed: %s (the peer died or "
                              "closed the group)",
                              what, m->rank, m->req_peer[i], ucs_status_string(us));
    }
    release_request(m, i);
  }
  return st;
}

moe_ep_status_t mep_host_mesh_wait(mep_host_mesh_t *m, size_t local_off,
                                   uint64_t value, int peer, const char *what) {
  const uint64_t *flag = (const uint64_t *)(m->region + local_off);
  int64_t deadline = m->deadline_ns;
  while (__atomic_load_n(flag, __ATOMIC_ACQUIRE) != value) {
    /* Any lost peer dooms the collective operation, whoever we wait on. */
    if (m->first_failed >= 0) return peer_failed_error(m, m->first_failed, what);
    if (m->recv_error) return recv_error(m, what);
    if (now_ns() > deadline) {
      return mep_error(MOE_EP_ERR_TIMEOUT,
                       "%s: rank %d waited timeouts.kernel_ms=%d for rank %d's "
                       "signal (expected %llu, saw %llu); the peer did not "
                       "take part in the operation",
                       what, m->rank, m->timeout_ms, peer,
                       (unsigned long long)value,
                       (unsigned long long)__atomic_load_n(flag, __ATOMIC_ACQUIRE));
    }
    if (ucp_worker_progress(m->worker) == 0) sched_yield();
  }
  return m->recv_error ? recv_error(m, what) : MOE_EP_OK;
}
