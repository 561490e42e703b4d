/* host_mesh_thread.c: the host mesh's progress thread. While it runs it
 * alone drives the mesh's UCX worker: it issues the sends the API thread
 * queues, and lands peers' puts and signals (host_mesh_recv.c). A peer's
 * data therefore lands and its sends complete while this process's engine
 * is busy outside moe-ep. With nothing to do it sleeps in epoll on the
 * worker's event fd and a wake-up eventfd, so an idle group costs no CPU. */
#define _GNU_SOURCE /* clock_gettime, eventfd under -std=c11 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "runtime/error.h"
#include "runtime/host/host_mesh_impl.h"
#include "runtime/progress.h"
#include "runtime/log.h"
#include "runtime/ucx_quiet.h"

/* Longest sleep: a UCX event that never fires only delays progress by
 * this much, it cannot stall the mesh. */
#define IDLE_SLEEP_MS 50

int64_t mep_host_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void wake(struct mep_host_mesh *m) {
  uint64_t one = 1;
  /* EAGAIN only when the counter is saturated: the thread wakes anyway. */
  ssize_t n = write(m->wake_fd, &one, sizeof one);
  (void)n;
}

void mep_host_mesh_notify(struct mep_host_mesh *m) {
  pthread_mutex_lock(&m->lock);
  pthread_cond_broadcast(&m->cond);
  pthread_mutex_unlock(&m->lock);
}

moe_ep_status_t mep_host_mesh_enqueue(struct mep_host_mesh *m, int peer, int kind,
                                      uint64_t offset, uint64_t value, const void *data,
                                      size_t bytes, int counted) {
  if (mep_host_mesh_enqueue_quiet(m, peer, kind, offset, value, data, bytes, counted) != 0) {
    return mep_error(MOE_EP_ERR_NO_MEMORY, "host mesh: rank %d: out of memory queueing a send "
                     "to rank %d", m->rank, peer);
  }
  return MOE_EP_OK;
}

int mep_host_mesh_keep_sent = 0;

int mep_host_mesh_enqueue_quiet(struct mep_host_mesh *m, int peer, int kind, uint64_t offset,
                                uint64_t value, const void *data, size_t bytes, int counted) {
  mep_host_cmd_t *c = malloc(sizeof(*c));
  if (c == NULL) return -1;
  *c = (mep_host_cmd_t){.mesh = m,
                        .hdr = {.offset = offset,
                                .value = value,
                                .bytes = bytes,
                                .src = m->rank,
                                .dst = peer,
                                .kind = kind},
                        .peer = peer,
                        .data = data,
                        .bytes = bytes,
                        .counted = counted};
  pthread_mutex_lock(&m->lock);
  /* Numbered under the lock that orders the queue: the queue is issued in
   * order on the peer's one endpoint, so numbers leave in order. */
  c->hdr.seq = ++m->peers[peer].sent;
  mep_host_msg_seal(&m->peers[peer].key_out, &c->hdr);
  if (mep_host_mesh_keep_sent) m->last_sent = c->hdr;
  int was_empty = m->queue_head == NULL;
  if (was_empty) {
    m->queue_head = c;
  } else {
    m->queue_tail->next = c;
  }
  m->queue_tail = c;
  if (counted) {
    m->issued++;
    m->peers[peer].unsent++;
  }
  pthread_mutex_unlock(&m->lock);
  if (was_empty) wake(m);
  return 0;
}

/* A send left this rank (or failed): account for it, wake a waiter when
 * the last outstanding send is done or something went wrong. */
static void finish(mep_host_cmd_t *c, ucs_status_t status) {
  struct mep_host_mesh *m = c->mesh;
  pthread_mutex_lock(&m->lock);
  mep_host_peer_t *p = &m->peers[c->peer];
  if (status != UCS_OK && !p->send_failed) {
    p->send_failed = 1;
    p->send_status = status;
  }
  if (c->counted) {
    m->completed++;
    p->unsent--;
  }
  if (status != UCS_OK || m->completed == m->issued) pthread_cond_broadcast(&m->cond);
  pthread_mutex_unlock(&m->lock);
  free(c);
}

static void on_sent(void *request, ucs_status_t status, void *user_data) {
  finish(user_data, status);
  ucp_request_free(request);
}

static void issue(struct mep_host_mesh *m, mep_host_cmd_t *c) {
  if (m->peers[c->peer].ep == NULL) { /* cut by mep_host_mesh_quiesce */
    finish(c, UCS_ERR_CANCELED);
    return;
  }
  ucp_request_param_t prm = {
      .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
      .cb.send = on_sent,
      .user_data = c,
  };
  void *req = ucp_am_send_nbx(m->peers[c->peer].ep, MEP_HOST_AM_ID, &c->hdr, sizeof(c->hdr),
                              c->data, c->bytes, &prm);
  if (req == NULL) {
    finish(c, UCS_OK);
  } else if (UCS_PTR_IS_ERR(req)) {
    finish(c, UCS_PTR_STATUS(req));
  }
}

/* Issues every queued send, in order (one endpoint keeps its messages in
 * order, so a signal still follows the puts queued before it). Returns
 * whether the thread was asked to stop. */
static int drain_queue(struct mep_host_mesh *m) {
  pthread_mutex_lock(&m->lock);
  mep_host_cmd_t *c = m->queue_head;
  m->queue_head = m->queue_tail = NULL;
  int stop = m->stop;
  pthread_mutex_unlock(&m->lock);
  while (c != NULL) {
    mep_host_cmd_t *next = c->next;
    issue(m, c);
    c = next;
  }
  return stop;
}

static int queue_empty(struct mep_host_mesh *m) {
  pthread_mutex_lock(&m->lock);
  int empty = m->queue_head == NULL;
  pthread_mutex_unlock(&m->lock);
  return empty;
}

static void sleep_until_event(struct mep_host_mesh *m) {
  ucs_status_t us = ucp_worker_arm(m->worker);
  if (us == UCS_ERR_BUSY) return; /* events arrived meanwhile: progress again */
  struct epoll_event ev[2];
  /* If arming failed, the bounded sleep degrades to slow polling. */
  int n = epoll_wait(m->epoll_fd, ev, 2, us == UCS_OK ? IDLE_SLEEP_MS : 1);
  for (int i = 0; i < n; i++) {
    if (ev[i].data.fd == m->wake_fd) {
      uint64_t v;
      ssize_t r = read(m->wake_fd, &v, sizeof v);
      (void)r;
    }
  }
}

/* mep_host_mesh_quiesce's request, on the thread that drives the worker. */
static void cut_if_asked(struct mep_host_mesh *m) {
  pthread_mutex_lock(&m->lock);
  int asked = m->cut == 1;
  pthread_mutex_unlock(&m->lock);
  if (!asked) return;
  mep_host_mesh_close_eps(m);
  pthread_mutex_lock(&m->lock);
  m->cut = 2;
  pthread_cond_broadcast(&m->cond);
  pthread_mutex_unlock(&m->lock);
}

int mep_host_mesh_quiesce(struct mep_host_mesh *m) {
  pthread_mutex_lock(&m->lock);
  int busy = m->completed != m->issued;
  if (busy && m->cut == 0) m->cut = 1;
  pthread_mutex_unlock(&m->lock);
  if (!busy) return 0;
  wake(m);
  /* Closing the endpoints takes up to a second (all at once); the canceled
   * sends' callbacks run as it does; two more for the thread to get to it. */
  int64_t deadline = mep_host_now_ns() + 3 * 1000000000LL;
  pthread_mutex_lock(&m->lock);
  while ((m->cut != 2 || m->completed != m->issued) && mep_host_now_ns() < deadline) {
    struct timespec ts = {deadline / 1000000000LL, deadline % 1000000000LL};
    pthread_cond_timedwait(&m->cond, &m->lock, &ts);
  }
  const int ended = m->cut == 2 && m->completed == m->issued;
  pthread_mutex_unlock(&m->lock);
  return ended ? 1 : 2;
}

static void *progress_main(void *arg) {
  struct mep_host_mesh *m = arg;
  mep_log_thread_level(m->log_level); /* it works for the group that started it */
  mep_ucx_quiet_enter(); /* the library's thread: every UCX line it causes is the library's */
  for (;;) {
    cut_if_asked(m);
    int stop = drain_queue(m);
    /* Capped, so that a busy worker (a peer's stream of messages, or
     * outsiders' dropped ones) cannot keep the thread from its queue, its
     * cut and its stop. */
    for (unsigned n = 0; n < MEP_PROGRESS_PASS_MAX && mep_ucx_progress(m->worker) != 0; n++) {
    }
    if (m->landed) {
      m->landed = 0;
      mep_host_mesh_notify(m);
    }
    if (stop) break;
    if (queue_empty(m)) sleep_until_event(m);
  }
  return NULL;
}

moe_ep_status_t mep_host_mesh_thread_start(struct mep_host_mesh *m) {
  m->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  m->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  ucs_status_t us = ucp_worker_get_efd(m->worker, &m->worker_fd);
  if (m->wake_fd < 0 || m->epoll_fd < 0 || us != UCS_OK) {
    return mep_error(MOE_EP_ERR_UCX, "host mesh: rank %d cannot set up its progress thread's "
                     "event fds (%s)", m->rank,
                     us != UCS_OK ? ucs_status_string(us) : "eventfd/epoll_create1 failed");
  }
  int fds[2] = {m->wake_fd, m->worker_fd};
  for (int i = 0; i < 2; i++) {
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = fds[i]};
    if (epoll_ctl(m->epoll_fd, EPOLL_CTL_ADD, fds[i], &ev) != 0) {
      return mep_error(MOE_EP_ERR_UCX, "host mesh: rank %d: epoll_ctl on fd %d failed",
                       m->rank, fds[i]);
    }
  }
  m->log_level = mep_log_thread_level_now(); /* group_create's: the group's level */
  /* The engine's signal handlers stay on its own threads. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(&m->thread, NULL, progress_main, m);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc != 0) {
    return mep_error(MOE_EP_ERR_INTERNAL, "host mesh: rank %d cannot start its progress "
                     "thread: %s", m->rank, strerror(rc));
  }
  m->thread_started = 1;
  return MOE_EP_OK;
}

void mep_host_mesh_thread_stop(struct mep_host_mesh *m) {
  if (m->thread_started) {
    pthread_mutex_lock(&m->lock);
    m->stop = 1;
    pthread_mutex_unlock(&m->lock);
    wake(m);
    pthread_join(m->thread, NULL);
    m->thread_started = 0;
  }
  if (m->epoll_fd >= 0) close(m->epoll_fd);
  if (m->wake_fd >= 0) close(m->wake_fd);
  m->epoll_fd = m->wake_fd = -1; /* worker_fd belongs to the worker */
}
