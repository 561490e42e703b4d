/* bootstrap_root.c: rank 0's side of forming the group: judging each knock
 * whose proof the gate checked (rank, world size, the rank's slot),
 * connecting to an admitted rank's worker, taking its HELLO, and telling
 * everyone the group formed (or why it did not). */
#define _GNU_SOURCE
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/bootstrap_types.h"
#include "runtime/error.h"
#include "runtime/log.h"

/* Returns 1 and fills `why` when a proven knock must still be refused:
 * a member of the job with the wrong group shape. */
static int root_check_knock(const mep_bootstrap_t *bs,
                            const mep_bs_knock_hdr_t *h, char *why,
                            size_t why_len) {
  if (h->world_size != bs->world_size) {
    snprintf(why, why_len,
             "world size mismatch: rank %d says world_size %d, rank 0 has %d",
             h->rank, h->world_size, bs->world_size);
  } else if (h->rank < 1 || h->rank >= bs->world_size) {
    snprintf(why, why_len, "rank %d is outside 1..%d", h->rank,
             bs->world_size - 1);
  } else {
    return 0;
  }
  return 1;
}

/* The peer made for this worker address, if any. */
static mep_bs_peer_t *root_peer_by_addr(mep_bootstrap_t *bs, const void *addr,
                                        size_t len) {
  for (mep_bs_peer_t *p = bs->peers; p != NULL; p = p->next) {
    if (p->addr_len == len && memcmp(p->addr, addr, len) == 0) return p;
  }
  return NULL;
}

/* A slot already taken. The same process knocking again (its verdict was
 * lost) keeps it. A slot that is only reserved (admitted, no HELLO yet)
 * passes to another process once MEP_BS_RESERVE_MS have gone by; before
 * that the knock is answered BUSY and retried. A joined rank's slot is
 * never given up. */
static int root_slot_taken(mep_bootstrap_t *bs, mep_bs_peer_t *p,
                           const mep_bs_knock_hdr_t *h, const void *addr,
                           size_t addr_len, char *why, size_t why_len) {
  if (p->state == MEP_BS_PEER_JOINED) {
    snprintf(why, why_len, "rank %d already joined", h->rank);
    return MEP_BS_KNOCK_REFUSE;
  }
  if (p->ep != NULL && p->addr_len == addr_len &&
      memcmp(p->addr, addr, p->addr_len) == 0) {
    return MEP_BS_KNOCK_OK;
  }
  int64_t held = mep_bs_now_ms() - p->reserved_ms;
  if (held <= MEP_BS_RESERVE_MS) {
    snprintf(why, why_len,
             "rank %d is being admitted from another process (%s, %lld ms "
             "ago); try again",
             h->rank, p->name, (long long)held);
    return MEP_BS_KNOCK_BUSY;
  }
  MEP_LOG_WARN("bootstrap",
               "rank 0: rank %d was admitted from %s but never said HELLO "
               "within %d ms; another process takes its place",
               h->rank, p->name, MEP_BS_RESERVE_MS);
  mep_bs_peer_close(bs, p, 1);
  bs->by_rank[h->rank] = NULL;
  return -1; /* free now */
}

int mep_bs_root_admit(mep_bootstrap_t *bs, const mep_bs_knock_hdr_t *h,
                      const void *addr, size_t addr_len, const char *name,
                      char *why, size_t why_len) {
  if (root_check_knock(bs, h, why, why_len)) return MEP_BS_KNOCK_REFUSE;
  mep_bs_peer_t *held = bs->by_rank[h->rank];
  if (held != NULL) {
    int r = root_slot_taken(bs, held, h, addr, addr_len, why, why_len);
    if (r >= 0) return r;
  }
  /* UCX pairs one ep per side; a second one from rank 0 to a worker whose
   * first connection failed would never pair with the joiner's. */
  if (root_peer_by_addr(bs, addr, addr_len) != NULL) {
    snprintf(why, why_len,
             "rank %d's process already had a connection to rank 0 that "
             "failed; restart that rank",
             h->rank);
    return MEP_BS_KNOCK_REFUSE;
  }
  void *copy = malloc(addr_len);
  mep_bs_peer_t *peer = copy != NULL ? mep_bs_peer_new(bs) : NULL;
  if (peer == NULL) {
    free(copy);
    snprintf(why, why_len, "rank 0 is out of memory");
    return MEP_BS_KNOCK_REFUSE;
  }
  /* Before the ep exists: its first message is checked under them. */
  mep_bs_peer_keys(bs, peer, h->rank, addr, addr_len);
  ucs_status_t st = mep_bs_peer_connect(bs, peer, addr);
  if (st != UCS_OK) {
    /* Not kept: nothing refers to a peer without an ep. */
    bs->peers = peer->next;
    mep_bs_peer_free(peer);
    free(copy);
    snprintf(why, why_len,
             "rank 0 cannot create a UCX endpoint to the worker address "
             "rank %d sent: %s",
             h->rank, ucs_status_string(st));
    return MEP_BS_KNOCK_REFUSE;
  }
  memcpy(copy, addr, addr_len);
  peer->addr = copy;
  peer->addr_len = addr_len;
  snprintf(peer->name, sizeof(peer->name), "%s", name);
  peer->rank = h->rank;
  peer->reserved_ms = mep_bs_now_ms();
  bs->by_rank[h->rank] = peer;
  MEP_LOG_DEBUG("bootstrap", "rank 0: admitted rank %d from %s", h->rank,
                name);
  return MEP_BS_KNOCK_OK;
}

/* Rank 0 could not start `what` to rank r for want of its own memory
 * while forming the group: its own failure, not rank r's (which would
 * otherwise wait it out and blame rank 0's silence, or be blamed). Every
 * connected rank is told (an ABORT that needs no allocation). */
static moe_ep_status_t root_form_oom(mep_bootstrap_t *bs, const char *what, int r) {
  char msg[MEP_BS_REASON_MAX];
  snprintf(msg, sizeof(msg),
           "rank 0 had no memory to send %s to rank %d (UCS_ERR_NO_MEMORY), a "
           "failure of rank 0's own; the group on %s cannot form",
           what, r, bs->address);
  mep_bs_root_abort(bs, MOE_EP_ERR_NO_MEMORY, 0, msg);
  return mep_error(MOE_EP_ERR_NO_MEMORY, "%s", msg);
}

/* An admitted rank's first word on its UCX connection: the ep pair works
 * both ways once rank 0 has it and answers. A rank counts as joined only
 * once its ACCEPT is on its way. */
static moe_ep_status_t root_handle_hellos(mep_bootstrap_t *bs) {
  mep_bs_msg_t *m;
  while ((m = mep_bs_msg_take(bs, MEP_BS_MSG_HELLO, NULL)) != NULL) {
    mep_bs_peer_t *peer = m->peer;
    const mep_bs_hdr_t *h = &m->hdr;
    if (peer->ep == NULL || peer->state != MEP_BS_PEER_CONNECTING) {
      mep_bs_msg_free(m);
      continue;
    }
    if (h->version != MEP_BS_VERSION || h->world_size != bs->world_size ||
        h->src != peer->rank) {
      mep_bs_peer_evict(bs, peer,
                        "said HELLO as rank %d of %d (version %u) after it "
                        "was admitted as rank %d of %d",
                        h->src, h->world_size, h->version, peer->rank,
                        bs->world_size);
      mep_bs_msg_free(m);
      continue;
    }
    mep_bs_msg_free(m);
    mep_bs_hdr_t accept;
    mep_bs_hdr_init(bs, &accept, MEP_BS_MSG_ACCEPT);
    /* Any other failure is the connection's, which its error callback
     * reports (root_drop_failed). */
    if (mep_bs_send(peer, &accept, NULL, NULL) == UCS_ERR_NO_MEMORY) {
      return root_form_oom(bs, "ACCEPT (the answer to its HELLO)", peer->rank);
    }
    peer->state = MEP_BS_PEER_JOINED;
    MEP_LOG_DEBUG("bootstrap", "rank 0: rank %d joined", peer->rank);
  }
  return MOE_EP_OK;
}

/* A rank that died (or was cut) before the group formed may come back:
 * free its slot. */
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
  /* The group is dead once this is said: a second verdict would only
   * overwrite the first while UCX may still read it. */
  if (bs->abort_sent) return;
  bs->abort_sent = 1;
  mep_bs_hdr_t h;
  mep_bs_hdr_init(bs, &h, MEP_BS_MSG_ABORT);
  h.status = (int32_t)status;
  h.failed_rank = failed_rank;
  h.payload_len = strnlen(msg, MEP_BS_REASON_MAX - 1);
  memcpy(bs->abort_reason, msg, h.payload_len);
  uint8_t digest[MEP_SHA256_BYTES];
  mep_sha256(bs->abort_reason, h.payload_len, digest);
  void *reqs[MEP_BS_MAX_RANKS];
  int n = 0;
  for (int r = 1; r < bs->world_size; r++) {
    mep_bs_peer_t *p = bs->by_rank[r];
    if (p == NULL || p->failed || p->ep == NULL) continue;
    p->abort_hdr = h;
    mep_bs_seal(p, &p->abort_hdr, digest);
    void *req = mep_bs_send_fixed(p, &p->abort_hdr, bs->abort_reason);
    if (req != NULL) reqs[n++] = req;
  }
  /* Best effort and short: the survivors' own deadlines back this up. */
  int64_t wait = bs->timeout_ms < 500 ? bs->timeout_ms : 500;
  int64_t deadline = mep_bs_now_ms() + wait;
  int idle = 0;
  for (int i = 0; i < n; i++) {
    while (ucp_request_check_status(reqs[i]) == UCS_INPROGRESS && mep_bs_now_ms() < deadline) {
      mep_bs_progress(bs, &idle);
    }
    ucp_request_free(reqs[i]); /* UCX finishes one still in flight */
  }
}

static moe_ep_status_t root_announce(mep_bootstrap_t *bs, int64_t deadline_ms) {
  mep_bs_send_t *sends[MEP_BS_MAX_RANKS];
  mep_bs_blob_t *blobs[MEP_BS_MAX_RANKS];
  mep_bs_hdr_t h;
  mep_bs_hdr_init(bs, &h, MEP_BS_MSG_FORMED);
  mep_bs_blob_t *formed = mep_bs_blob_new(&h, NULL);
  for (int r = 1; r < bs->world_size; r++) blobs[r] = formed;
  const int short_of = mep_bs_send_each(bs, blobs, sends);
  mep_bs_blob_drop(formed);
  if (short_of > 0) return root_form_oom(bs, "FORMED", short_of);
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
  if (bad > 0 && bad_st == UCS_ERR_NO_MEMORY && !bs->by_rank[bad]->failed) {
    return root_form_oom(bs, "FORMED", bad); /* UCX's own, at the send's start */
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

/* No one else may join now: the gate stops listening, and admitted
 * connections that never joined are closed. */
static void root_close_others(mep_bootstrap_t *bs, int hold) {
  mep_bs_gate_close(bs, hold);
  bs->formed = 1;
  for (mep_bs_peer_t *p = bs->peers; p != NULL; p = p->next) {
    if (p->ep != NULL && p->state != MEP_BS_PEER_JOINED) {
      mep_bs_peer_close(bs, p, 1);
    }
  }
}

static int root_joined(const mep_bootstrap_t *bs) {
  int joined = 0;
  for (int r = 1; r < bs->world_size; r++) {
    const mep_bs_peer_t *p = bs->by_rank[r];
    joined += p != NULL && p->state == MEP_BS_PEER_JOINED;
  }
  return joined;
}

moe_ep_status_t mep_bs_root_form(mep_bootstrap_t *bs, int64_t deadline_ms) {
  if (mep_bs_nonce(bs->group_nonce) != 0) {
    return mep_error(MOE_EP_ERR_BOOTSTRAP,
                     "rank 0: getrandom gave no bytes for the group's nonce: %s",
                     strerror(errno));
  }
  MEP_CHECK(mep_bs_gate_open(bs));
  int idle = 0;
  int joined = 0;
  int asker = -1;
  while (mep_bs_now_ms() < deadline_ms && (asker = mep_bs_root_overdue(bs, 0)) < 0) {
    mep_bs_progress(bs, &idle);
    mep_bs_gate_poll(bs);
    moe_ep_status_t st = root_handle_hellos(bs);
    if (st != MOE_EP_OK) {
      root_close_others(bs, 0);
      return st;
    }
    root_drop_failed(bs);
    joined = root_joined(bs);
    if (joined == bs->world_size - 1) {
      root_close_others(bs, 1);
      return root_announce(bs, deadline_ms);
    }
  }
  int missing[MEP_BS_MAX_RANKS] = {0};
  int n = 0;
  for (int r = 1; r < bs->world_size; r++) {
    const mep_bs_peer_t *p = bs->by_rank[r];
    if (p == NULL || p->state != MEP_BS_PEER_JOINED) missing[n++] = r;
  }
  char list[256];
  mep_bs_format_ranks(list, sizeof(list), missing, n);
  char msg[MEP_BS_REASON_MAX];
  /* A joined rank whose own wait ran out first (rank 0 started late)
   * asked: the same verdict, now, rather than that rank blaming rank 0. */
  char waited[64];
  mep_bs_waited(bs, asker, waited, sizeof(waited));
  snprintf(msg, sizeof(msg),
           "group did not form within %s on %s: %s %s never joined "
           "(%d of %d ranks present)",
           waited, bs->address, n == 1 ? "rank" : "ranks", list, joined + 1, bs->world_size);
  mep_bs_root_abort(bs, MOE_EP_ERR_BOOTSTRAP, n == 1 ? missing[0] : -1, msg);
  root_close_others(bs, 0);
  return mep_error(MOE_EP_ERR_BOOTSTRAP, "%s", msg);
}
