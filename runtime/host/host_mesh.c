/* host_mesh.c: the host mesh's lifecycle: its own UCX context and worker
 * (the data path never depends on the bootstrap's worker being
 * progressed), endpoints to every rank wired up eagerly with a round trip
 * in group_create, the progress thread, and an orderly goodbye at destroy
 * so peers can tell a rank that left from one that died.
 * Active messages rather than RMA: UCX 1.13 emulates RMA over TCP with
 * acknowledgements, and an acknowledgement to a peer that just died aborts
 * the process inside UCX; a failed active message is only a failed request. */
#define _GNU_SOURCE /* posix_memalign under -std=c11 */
#include <stdlib.h>
#include <string.h>
#include <ucp/api/ucp.h>

#include "runtime/error.h"
#include "runtime/host/host_mesh_impl.h"
#include "runtime/log.h"
#include "runtime/ucx_quiet.h"

#define BLOB_MAX 4096 /* a rank's slot in the address exchange */
/* Bound on destroy's goodbye: peers that do not answer are gone or stuck. */
#define GOODBYE_MAX_MS 2000

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status) {
  mep_host_peer_t *p = arg;
  struct mep_host_mesh *m = p->mesh;
  pthread_mutex_lock(&m->lock);
  if (!p->failed) {
    p->failed = 1;
    p->fail_status = status;
    /* A peer that said goodbye closes its endpoints next: expected, and
     * no death (its goodbye may still wait for its data to land). */
    if (m->first_failed < 0 && !p->bye_heard) m->first_failed = (int)(p - m->peers);
  }
  pthread_cond_broadcast(&m->cond);
  pthread_mutex_unlock(&m->lock);
  MEP_LOG_DEBUG("host", "rank %d: endpoint to rank %d failed: %s", m->rank,
                (int)(p - m->peers), ucs_status_string(status));
}

/* A rank's slot in the address exchange: the address's length, then the
 * address. No key: each pair's keys are derived on both sides
 * (host_mesh_seal.c), never sent. */
#define SLOT_ADDRESS 8

/* Allgathers every rank's worker address in fixed slots. */
static moe_ep_status_t allgather_slots(struct mep_host_mesh *m, mep_bootstrap_t *bs,
                                       const void *addr, size_t len, uint8_t **all) {
  if (len + SLOT_ADDRESS > BLOB_MAX) {
    return mep_error(MOE_EP_ERR_UCX, "host mesh: rank %d: UCX worker address of %zu bytes "
                     "exceeds %d", m->rank, len, BLOB_MAX - SLOT_ADDRESS);
  }
  uint8_t *mine = calloc(1, BLOB_MAX);
  *all = calloc((size_t)m->world, BLOB_MAX);
  if (mine == NULL || *all == NULL) {
    free(mine);
    free(*all);
    *all = NULL;
    (void)mep_bootstrap_fail_step(bs, MOE_EP_ERR_NO_MEMORY); /* the peers hear it at once */
    return mep_error(MOE_EP_ERR_NO_MEMORY,
                     "host mesh: rank %d: out of memory for %d ranks' worker addresses", m->rank,
                     m->world);
  }
  uint64_t l = len;
  memcpy(mine, &l, sizeof(l));
  memcpy(mine + SLOT_ADDRESS, addr, len);
  moe_ep_status_t st = mep_bootstrap_allgather(bs, mine, *all, BLOB_MAX);
  free(mine);
  if (st != MOE_EP_OK) {
    free(*all);
    *all = NULL;
  }
  return st;
}

/* A context of the mesh's own: WAKEUP lets the progress thread sleep on
 * the worker's event fd. The worker is SERIALIZED: the API thread uses it
 * before the progress thread starts and after it joined, never at once. */
static moe_ep_status_t open_worker(struct mep_host_mesh *m) {
  ucp_params_t cp = {.field_mask = UCP_PARAM_FIELD_FEATURES,
                     .features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP};
  ucs_status_t us = ucp_init(&cp, NULL, &m->context);
  if (us != UCS_OK) {
    m->context = NULL;
    return mep_error(MOE_EP_ERR_UCX, "host mesh: rank %d: ucp_init failed: %s", m->rank,
                     ucs_status_string(us));
  }
  ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                            .thread_mode = UCS_THREAD_MODE_SERIALIZED};
  us = ucp_worker_create(m->context, &wp, &m->worker);
  if (us != UCS_OK) {
    m->worker = NULL;
    return mep_error(MOE_EP_ERR_UCX, "host mesh: rank %d: ucp_worker_create failed: %s",
                     m->rank, ucs_status_string(us));
  }
  return MOE_EP_OK;
}

/* The worker's address, kept for mep_host_mesh_address and the keys. */
static moe_ep_status_t own_address(struct mep_host_mesh *m) {
  ucp_address_t *addr;
  size_t addr_len;
  ucs_status_t us = ucp_worker_get_address(m->worker, &addr, &addr_len);
  if (us != UCS_OK) {
    return mep_error(MOE_EP_ERR_UCX, "host mesh: rank %d: ucp_worker_get_address: %s",
                     m->rank, ucs_status_string(us));
  }
  m->address = malloc(addr_len);
  if (m->address != NULL) {
    memcpy(m->address, addr, addr_len);
    m->address_len = addr_len;
  }
  ucp_worker_release_address(m->worker, addr);
  if (m->address == NULL) return mep_error(MOE_EP_ERR_NO_MEMORY, "host mesh: out of memory");
  return MOE_EP_OK;
}

/* Every pair's keys, before any endpoint exists: the receiver takes
 * nothing until `keyed`. Each slot's length is checked again here, since
 * the keys read the address it bounds. */
static moe_ep_status_t derive_keys(struct mep_host_mesh *m, const mep_bootstrap_t *bs,
                                   const uint8_t *all) {
  for (int p = 0; p < m->world; p++) {
    const uint8_t *slot = all + (size_t)p * BLOB_MAX;
    uint64_t len;
    memcpy(&len, slot, sizeof(len));
    if (len > BLOB_MAX - SLOT_ADDRESS) {
      return mep_error(MOE_EP_ERR_BOOTSTRAP, "host mesh: rank %d got a worker address of %llu "
                       "bytes from rank %d (at most %d)", m->rank, (unsigned long long)len, p,
                       BLOB_MAX - SLOT_ADDRESS);
    }
    MEP_CHECK(mep_host_mesh_derive_keys(m, bs, p, slot + SLOT_ADDRESS, (size_t)len));
  }
  m->keyed = 1;
  return MOE_EP_OK;
}

static moe_ep_status_t connect_peers(struct mep_host_mesh *m, mep_bootstrap_t *bs) {
  MEP_CHECK(own_address(m));
  uint8_t *all;
  moe_ep_status_t st = allgather_slots(m, bs, m->address, m->address_len, &all);
  if (st != MOE_EP_OK) return st;
  st = derive_keys(m, bs, all);
  for (int p = 0; p < m->world && st == MOE_EP_OK; p++) {
    ucp_ep_params_t ep = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address = (const ucp_address_t *)(all + (size_t)p * BLOB_MAX + SLOT_ADDRESS),
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = on_ep_error, .arg = &m->peers[p]},
    };
    ucs_status_t us = ucp_ep_create(m->worker, &ep, &m->peers[p].ep);
    if (us != UCS_OK) {
      st = mep_error(MOE_EP_ERR_UCX, "host mesh: rank %d cannot connect to rank %d: %s",
                     m->rank, p, ucs_status_string(us));
    }
  }
  free(all);
  return st;
}

/* Waits (lock held) until `done(peer)` holds for every rank or the
 * deadline passes; returns the first rank it does not hold for, or -1. */
static int wait_every_peer(struct mep_host_mesh *m, int (*done)(const mep_host_peer_t *),
                           int64_t deadline) {
  for (;;) {
    int missing = -1;
    for (int p = 0; p < m->world && missing < 0; p++) {
      if (!done(&m->peers[p])) missing = p;
    }
    if (missing < 0 || mep_host_now_ns() > deadline) return missing;
    struct timespec ts = {deadline / 1000000000LL, deadline % 1000000000LL};
    pthread_cond_timedwait(&m->cond, &m->lock, &ts);
  }
}

static int acked_or_lost(const mep_host_peer_t *p) {
  return p->acked || p->failed || p->bye_heard;
}

/* Lock held: the first other rank that said goodbye, or -1. */
static int first_goodbye(const struct mep_host_mesh *m) {
  for (int r = 0; r < m->world; r++) {
    if (r != m->rank && m->peers[r].bye_heard) return r;
  }
  return -1;
}

/* A round trip with every rank (self included) before group_create
 * returns: each endpoint is connected both ways before the first
 * operation, and a rank that cannot be reached fails group_create. */
static moe_ep_status_t wire_up(struct mep_host_mesh *m) {
  for (int p = 0; p < m->world; p++) {
    MEP_CHECK(mep_host_mesh_enqueue(m, p, MEP_HOST_MSG_HELLO, 0, 0, NULL, 0, 1));
  }
  int64_t deadline = mep_host_now_ns() + (int64_t)m->timeout_ms * 1000000LL;
  moe_ep_status_t st = MOE_EP_OK;
  pthread_mutex_lock(&m->lock);
  int missing = wait_every_peer(m, acked_or_lost, deadline);
  const int quitter = first_goodbye(m);
  if (missing >= 0) {
    st = mep_error(MOE_EP_ERR_BOOTSTRAP,
                   "group_create: rank %d could not reach rank %d over the host data path: "
                   "rank %d did not answer the wire-up message within timeouts.kernel_ms=%d",
                   m->rank, missing, missing, m->timeout_ms);
  } else if (quitter >= 0) {
    st = mep_error(MOE_EP_ERR_BOOTSTRAP,
                   "group_create: rank %d lost rank %d while wiring up the host data path: "
                   "rank %d gave up on the group (its group_create failed; its own error says "
                   "why)",
                   m->rank, quitter, quitter);
  } else if (m->first_failed >= 0) {
    st = mep_error(MOE_EP_ERR_BOOTSTRAP,
                   "group_create: rank %d could not connect to rank %d over the host data "
                   "path: %s",
                   m->rank, m->first_failed,
                   ucs_status_string(m->peers[m->first_failed].fail_status));
  }
  pthread_mutex_unlock(&m->lock);
  return st;
}

static moe_ep_status_t alloc_region(struct mep_host_mesh *m) {
  if (posix_memalign((void **)&m->region, 4096, m->region_bytes) != 0) {
    m->region = NULL;
    return mep_error(MOE_EP_ERR_NO_MEMORY,
                     "host mesh: cannot allocate %zu bytes of buffers", m->region_bytes);
  }
  memset(m->region, 0, m->region_bytes);
  return MOE_EP_OK;
}

static moe_ep_status_t init_sync(struct mep_host_mesh *m) {
  pthread_condattr_t ca;
  if (pthread_condattr_init(&ca) != 0) goto out_fail;
  int ok = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 &&
           pthread_cond_init(&m->cond, &ca) == 0;
  pthread_condattr_destroy(&ca);
  if (!ok) goto out_fail;
  if (pthread_mutex_init(&m->lock, NULL) != 0) {
    pthread_cond_destroy(&m->cond);
    goto out_fail;
  }
  m->lock_ready = 1;
  return MOE_EP_OK;
out_fail:
  return mep_error(MOE_EP_ERR_INTERNAL, "host mesh: rank %d cannot create its lock", m->rank);
}

moe_ep_status_t mep_host_mesh_create(mep_bootstrap_t *bs, size_t region_bytes,
                                     int timeout_ms, mep_host_mesh_t **out) {
  mep_host_mesh_t *m = calloc(1, sizeof(*m));
  if (m == NULL) return mep_error(MOE_EP_ERR_NO_MEMORY, "host mesh: out of memory");
  m->rank = mep_bootstrap_rank(bs);
  m->world = mep_bootstrap_world_size(bs);
  m->timeout_ms = timeout_ms;
  m->region_bytes = region_bytes;
  m->first_failed = -1;
  m->epoll_fd = m->wake_fd = m->worker_fd = -1;
  m->peers = calloc((size_t)m->world, sizeof(mep_host_peer_t));
  m->last_op = calloc((size_t)m->world, sizeof(uint64_t));
  for (int p = 0; m->peers != NULL && p < m->world; p++) m->peers[p].mesh = m;
  moe_ep_status_t st;
  if (m->peers == NULL || m->last_op == NULL) {
    st = mep_error(MOE_EP_ERR_NO_MEMORY, "host mesh: out of memory");
    goto out_destroy;
  }
  MEP_CHECK_GOTO(init_sync(m), st, out_destroy);
  MEP_CHECK_GOTO(alloc_region(m), st, out_destroy);
  MEP_CHECK_GOTO(open_worker(m), st, out_destroy);
  /* The handler is in place before any peer learns this worker's address. */
  MEP_CHECK_GOTO(mep_host_mesh_recv_start(m), st, out_destroy);
  MEP_CHECK_GOTO(connect_peers(m, bs), st, out_destroy);
  MEP_CHECK_GOTO(mep_host_mesh_thread_start(m), st, out_destroy);
  MEP_CHECK_GOTO(wire_up(m), st, out_destroy);
  *out = m;
  return MOE_EP_OK;
out_destroy:
  mep_host_mesh_destroy(m);
  return st;
}

static int goodbye_done(const mep_host_peer_t *p) {
  return p->bye_acked || p->bye_heard || p->failed || p->ep == NULL;
}

/* Tells every peer this rank is leaving, and waits (bounded) until each
 * one has seen it or is leaving too, so a peer still in an operation
 * reports "left", not "died". */
static void say_goodbye(struct mep_host_mesh *m) {
  for (int p = 0; p < m->world; p++) {
    if (p == m->rank) continue;
    if (mep_host_mesh_enqueue(m, p, MEP_HOST_MSG_BYE, 0, 0, NULL, 0, 0) != MOE_EP_OK) return;
  }
  int64_t ms = m->timeout_ms < GOODBYE_MAX_MS ? m->timeout_ms : GOODBYE_MAX_MS;
  pthread_mutex_lock(&m->lock);
  m->peers[m->rank].bye_acked = 1; /* nobody to tell */
  int missing = wait_every_peer(m, goodbye_done, mep_host_now_ns() + ms * 1000000LL);
  pthread_mutex_unlock(&m->lock);
  if (missing >= 0) {
    MEP_LOG_DEBUG("host", "rank %d: rank %d did not answer the goodbye within %lld ms",
                  m->rank, missing, (long long)ms);
  }
}

void mep_host_mesh_close_eps(struct mep_host_mesh *m) {
  if (m->peers == NULL) return;
  /* Force close: a peer may already be gone, so never wait on it. Every
   * close is started before any is waited for, under one deadline, so a
   * close UCX is slow to finish costs the teardown once, not once per
   * peer. */
  ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                             .flags = UCP_EP_CLOSE_FLAG_FORCE};
  int pending = 0;
  for (int p = 0; p < m->world; p++) {
    ucp_ep_h ep = m->peers[p].ep;
    m->peers[p].close_req = NULL;
    if (ep == NULL) continue;
    /* Dead once its close is asked for: nothing is issued on it again. */
    pthread_mutex_lock(&m->lock);
    m->peers[p].ep = NULL;
    pthread_mutex_unlock(&m->lock);
    void *req = ucp_ep_close_nbx(ep, &prm);
    if (UCS_PTR_IS_PTR(req)) {
      m->peers[p].close_req = req;
      pending++;
    }
  }
  const int64_t deadline = mep_host_now_ns() + 1000000000LL;
  while (pending > 0 && mep_host_now_ns() < deadline) {
    mep_ucx_progress(m->worker);
    pending = 0;
    for (int p = 0; p < m->world; p++) {
      void *req = m->peers[p].close_req;
      pending += req != NULL && ucp_request_check_status(req) == UCS_INPROGRESS;
    }
  }
  for (int p = 0; p < m->world; p++) {
    /* UCX finishes a close still in flight on its own. */
    if (m->peers[p].close_req != NULL) ucp_request_free(m->peers[p].close_req);
    m->peers[p].close_req = NULL;
  }
}

/* Runs on the API thread once the progress thread has joined: endpoints
 * first (UCX completes or cancels their sends, which frees the queued
 * commands), then rendezvous data still landing in the region. */
static void close_endpoints(struct mep_host_mesh *m) {
  mep_host_mesh_close_eps(m);
  int64_t deadline = mep_host_now_ns() + 1000000000LL;
  for (int r = 0; m->sources != NULL && r < m->world; r++) {
    while (m->sources[r].inflight > 0 && mep_host_now_ns() < deadline) {
      mep_ucx_progress(m->worker);
    }
  }
}

void mep_host_mesh_destroy(mep_host_mesh_t *m) {
  if (m == NULL) return;
  if (m->thread_started) say_goodbye(m);
  mep_host_mesh_thread_stop(m);
  if (m->worker != NULL) close_endpoints(m);
  /* Sends queued but never issued (the thread stopped first). */
  while (m->queue_head != NULL) {
    mep_host_cmd_t *next = m->queue_head->next;
    free(m->queue_head);
    m->queue_head = next;
  }
  if (m->strangers > MEP_HOST_STRANGERS_LOGGED) {
    MEP_LOG_WARN("host", "rank %d dropped %llu messages it could not authenticate in all (the "
                 "first %d are logged above)", m->rank, (unsigned long long)m->strangers,
                 MEP_HOST_STRANGERS_LOGGED);
  }
  if (m->worker != NULL) ucp_worker_destroy(m->worker);
  /* After the worker: a rendezvous receive close_endpoints gave up on may
   * complete as canceled while the worker is destroyed, and its callback
   * reads its source. */
  mep_host_mesh_forget_keys(m);
  mep_host_mesh_recv_stop(m);
  if (m->context != NULL) ucp_cleanup(m->context);
  if (m->lock_ready) {
    pthread_cond_destroy(&m->cond);
    pthread_mutex_destroy(&m->lock);
  }
  free(m->region);
  free(m->address);
  free(m->peers);
  free(m->last_op);
  free(m);
}

uint8_t *mep_host_mesh_local(mep_host_mesh_t *m) { return m->region; }

const void *mep_host_mesh_address(const mep_host_mesh_t *m, size_t *len) {
  *len = m->address_len;
  return m->address;
}

uint64_t mep_host_mesh_strangers(const mep_host_mesh_t *m) {
  return __atomic_load_n(&m->strangers, __ATOMIC_RELAXED);
}
