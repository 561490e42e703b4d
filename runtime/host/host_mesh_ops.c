/* host_mesh_ops.c: the API thread's side of the host mesh: puts and
 * signals handed to the progress thread, and bounded waits (on a condition
 * variable, never a spin) for their completion and for peers' signals. */
#define _GNU_SOURCE /* clock_gettime under -std=c11 */
#include <time.h>

#include "runtime/error.h"
#include "runtime/host/host_mesh_impl.h"

void mep_host_mesh_reads_done(mep_host_mesh_t *m) {
  __atomic_fetch_add(&m->reads_done, 1, __ATOMIC_RELEASE);
}

void mep_host_mesh_begin(mep_host_mesh_t *m) {
  m->deadline_ns = mep_host_now_ns() + (int64_t)m->timeout_ms * 1000000LL;
}

/* Lock held. Sleeps until the progress thread reports something or the
 * deadline passes; callers re-check their condition either way. */
static void wait_for_news(mep_host_mesh_t *m, int64_t deadline) {
  struct timespec ts = {deadline / 1000000000LL, deadline % 1000000000LL};
  pthread_cond_timedwait(&m->cond, &m->lock, &ts);
}

/* For waits: its goodbye counts once the signals before it are applied. */
static int lost(const mep_host_peer_t *p) { return p->failed || p->said_bye; }
/* For sends: its goodbye counts as soon as it arrives. */
static int gone(const mep_host_peer_t *p) { return p->failed || p->bye_heard; }

/* Lock held: a peer that dooms an operation whose signals carry `value`,
 * whoever is waited on: one that died, or one that said goodbye before
 * signalling that operation (its goodbye follows every signal it sent,
 * so last_op is its last). A peer that left after its part is no reason
 * to fail the rest of the operation. -1: none. */
static int doomed_by(const mep_host_mesh_t *m, uint64_t value) {
  if (m->first_failed >= 0) return m->first_failed;
  for (int p = 0; p < m->world; p++) {
    if (p != m->rank && m->peers[p].said_bye &&
        __atomic_load_n(&m->last_op[p], __ATOMIC_ACQUIRE) < value) {
      return p;
    }
  }
  return -1;
}

/* Lock held: a peer that dooms this rank's outstanding sends: one that
 * died, or one that left with sends to it still outstanding. -1: none. */
static int sends_doomed_by(const mep_host_mesh_t *m) {
  if (m->first_failed >= 0) return m->first_failed;
  for (int p = 0; p < m->world; p++) {
    if (p != m->rank && m->peers[p].bye_heard && m->peers[p].unsent > 0) return p;
  }
  return -1;
}

static moe_ep_status_t queue_send(mep_host_mesh_t *m, int peer, int kind, uint64_t offset,
                                  uint64_t value, const void *data, size_t bytes,
                                  const char *what) {
  pthread_mutex_lock(&m->lock);
  moe_ep_status_t st = gone(&m->peers[peer]) ? mep_host_blame_lost(m, peer, what) : MOE_EP_OK;
  pthread_mutex_unlock(&m->lock);
  if (st != MOE_EP_OK) return st;
  return mep_host_mesh_enqueue(m, peer, kind, offset, value, data, bytes, 1);
}

moe_ep_status_t mep_host_mesh_put(mep_host_mesh_t *m, int peer, const void *src,
                                  size_t bytes, size_t remote_off) {
  if (bytes == 0) return MOE_EP_OK;
  return queue_send(m, peer, MEP_HOST_MSG_PUT, remote_off, 0, src, bytes, "put");
}

moe_ep_status_t mep_host_mesh_signal(mep_host_mesh_t *m, int peer,
                                     size_t remote_off, uint64_t value) {
  return queue_send(m, peer, MEP_HOST_MSG_SIGNAL, remote_off, value, NULL, 0, "signal");
}

void mep_host_mesh_signal_quiet(mep_host_mesh_t *m, int peer, size_t remote_off, uint64_t value) {
  pthread_mutex_lock(&m->lock);
  const int skip = gone(&m->peers[peer]);
  pthread_mutex_unlock(&m->lock);
  if (skip) return;
  if (mep_host_mesh_enqueue_quiet(m, peer, MEP_HOST_MSG_SIGNAL, remote_off, value, NULL, 0, 1) ==
      0)
    return;
  /* Not sent for want of memory: reported by the next complete, as a send
   * that failed (send_failure). */
  pthread_mutex_lock(&m->lock);
  if (!m->peers[peer].send_failed) {
    m->peers[peer].send_failed = 1;
    m->peers[peer].send_status = UCS_ERR_NO_MEMORY;
  }
  pthread_mutex_unlock(&m->lock);
}

/* Lock held: the first send that failed, blamed on its peer. */
static moe_ep_status_t send_failure(mep_host_mesh_t *m, const char *what) {
  for (int p = 0; p < m->world; p++) {
    if (!m->peers[p].send_failed) continue;
    if (gone(&m->peers[p])) return mep_host_blame_lost(m, p, what);
    return mep_error(MOE_EP_ERR_PEER_FAILED,
                     "%s: rank %d's send to rank %d failed: %s (rank %d's connection "
                     "is still up)",
                     what, m->rank, p, ucs_status_string(m->peers[p].send_status), p);
  }
  return MOE_EP_OK;
}

moe_ep_status_t mep_host_mesh_complete(mep_host_mesh_t *m, const char *what) {
  pthread_mutex_lock(&m->lock);
  moe_ep_status_t st = MOE_EP_OK;
  while (m->completed != m->issued) {
    const int doomed = sends_doomed_by(m);
    if (doomed >= 0) {
      st = mep_host_blame_lost(m, doomed, what);
      break;
    }
    if (mep_host_now_ns() > m->deadline_ns) {
      st = mep_host_blame_not_receiving(m, what);
      break;
    }
    wait_for_news(m, m->deadline_ns);
  }
  if (st == MOE_EP_OK) st = send_failure(m, what);
  pthread_mutex_unlock(&m->lock);
  return st;
}

/* at_least: the word may have passed value (mep_host_mesh_wait_read). */
static int reached(const uint64_t *word, uint64_t value, int at_least) {
  if (word == NULL) return 0;
  const uint64_t w = __atomic_load_n(word, __ATOMIC_ACQUIRE);
  return at_least ? w >= value : w == value;
}

/* The flag reached value, or else alt did (*took_alt). */
static int answered(const uint64_t *flag, const uint64_t *alt, uint64_t value, int at_least,
                    int *took_alt) {
  if (reached(flag, value, at_least)) return 1;
  if (!reached(alt, value, at_least)) return 0;
  if (took_alt != NULL) *took_alt = 1;
  return 1;
}

/* flag: the signal word that must reach `value` exactly; NULL: any signal
 * of `peer`'s for that operation or a later one. alt (may be NULL): a word
 * that ends the wait as well (*took_alt). at_least: a read word
 * (mep_host_mesh_wait_read), which may pass value and lags the peer's
 * signals of its own operations. */
static moe_ep_status_t wait_signal(mep_host_mesh_t *m, const uint64_t *flag, const uint64_t *alt,
                                   uint64_t value, int peer, const char *what, int at_least,
                                   int *took_alt) {
  moe_ep_status_t st = MOE_EP_OK;
  if (took_alt != NULL) *took_alt = 0;
  pthread_mutex_lock(&m->lock);
  for (;;) {
    if (answered(flag, alt, value, at_least, took_alt)) break;
    /* Signals from one rank land in order: once it has signalled this
     * operation or a later one elsewhere, this one is never coming. */
    uint64_t last = __atomic_load_n(&m->last_op[peer], __ATOMIC_ACQUIRE);
    if (last >= value && !at_least) {
      if (flag == NULL || answered(flag, alt, value, 0, took_alt)) break;
      st = mep_host_blame_ahead(m, peer, value, last, what);
      break;
    }
    if (lost(&m->peers[peer])) {
      st = mep_host_blame_lost(m, peer, what);
      break;
    }
    const int doomed = doomed_by(m, value);
    if (doomed >= 0) {
      st = mep_host_blame_lost(m, doomed, what);
      break;
    }
    if (m->recv_error) break;
    if (mep_host_now_ns() > m->deadline_ns) {
      st = at_least && last >= value ? mep_host_blame_unread(m, peer, value, what)
                                     : mep_host_blame_absent(m, peer, value, last, what);
      break;
    }
    wait_for_news(m, m->deadline_ns);
  }
  if (st == MOE_EP_OK && m->recv_error) st = mep_host_blame_recv_error(m, what);
  pthread_mutex_unlock(&m->lock);
  return st;
}

moe_ep_status_t mep_host_mesh_wait(mep_host_mesh_t *m, size_t local_off,
                                   uint64_t value, int peer, const char *what) {
  return wait_signal(m, (const uint64_t *)(m->region + local_off), NULL, value, peer, what, 0,
                     NULL);
}

moe_ep_status_t mep_host_mesh_wait_either(mep_host_mesh_t *m, size_t local_off, size_t alt_off,
                                          uint64_t value, int peer, const char *what,
                                          int *took_alt) {
  return wait_signal(m, (const uint64_t *)(m->region + local_off),
                     (const uint64_t *)(m->region + alt_off), value, peer, what, 0, took_alt);
}

moe_ep_status_t mep_host_mesh_wait_read(mep_host_mesh_t *m, size_t local_off, size_t alt_off,
                                        uint64_t value, int peer, const char *what) {
  return wait_signal(m, (const uint64_t *)(m->region + local_off),
                     (const uint64_t *)(m->region + alt_off), value, peer, what, 1, NULL);
}

moe_ep_status_t mep_host_mesh_wait_progress(mep_host_mesh_t *m, uint64_t value, int peer,
                                            const char *what) {
  return wait_signal(m, NULL, NULL, value, peer, what, 0, NULL);
}
