/* bootstrap_coll.c: allgather, broadcast and barrier over the star through
 * rank 0. Every rank sends rank 0 one CONTRIB per op and gets one RESULT
 * back, both stamped with the op's sequence number, kind, root and size, so
 * ranks calling different collectives are caught; every wait is bounded,
 * and a dead rank aborts the group with its name. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/bootstrap_types.h"
#include "runtime/error.h"
#include "runtime/log.h"

int mep_bs_slack_ms(const mep_bootstrap_t *bs) {
  int s = bs->timeout_ms / 8;
  if (s < 50) s = 50;
  if (s > 1000) s = 1000;
  return s;
}

void mep_bs_waited(const mep_bootstrap_t *bs, int asker, char *buf, size_t len) {
  if (asker > 0) {
    snprintf(buf, len, "the %d ms rank %d waits", bs->timeout_ms, asker);
  } else {
    snprintf(buf, len, "%d ms", bs->timeout_ms);
  }
}

static const char *op_name(int op) {
  switch (op) {
    case MEP_BS_OP_ALLGATHER: return "allgather";
    case MEP_BS_OP_BROADCAST: return "broadcast";
    case MEP_BS_OP_BARRIER: return "barrier";
    case MEP_BS_OP_AGREE: return "agreement";
    default: return "unknown op";
  }
}

/* One collective as this rank sees it. */
typedef struct coll {
  int op;
  int root;
  size_t bytes;
  const void *send; /* this rank's CONTRIB payload */
  size_t send_len;
  void *out;        /* where the RESULT lands */
  size_t out_len;
  uint64_t seq;
  int64_t start_ms; /* when this rank entered the op */
} coll_t;

/* Records the sticky failure and the thread's error text. */
static moe_ep_status_t coll_fail(mep_bootstrap_t *bs, moe_ep_status_t st,
                                 const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static moe_ep_status_t coll_fail(mep_bootstrap_t *bs, moe_ep_status_t st,
                                 const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(bs->fail_msg, sizeof(bs->fail_msg), fmt, ap);
  va_end(ap);
  bs->fail_status = st;
  return mep_error(st, "%s", bs->fail_msg);
}

/* Payload rank r owes rank 0 for this op. */
static size_t contrib_len(const coll_t *c, int r) {
  if (c->op == MEP_BS_OP_ALLGATHER || c->op == MEP_BS_OP_AGREE) return c->bytes;
  if (c->op == MEP_BS_OP_BROADCAST && r == c->root) return c->bytes;
  return 0;
}

static size_t result_len(const coll_t *c, int r, int world) {
  if (c->op == MEP_BS_OP_ALLGATHER || c->op == MEP_BS_OP_AGREE) return c->bytes * (size_t)world;
  if (c->op == MEP_BS_OP_BROADCAST && r != c->root) return c->bytes;
  return 0;
}

static moe_ep_status_t root_abort(mep_bootstrap_t *bs, moe_ep_status_t st,
                                  int failed_rank, const char *reason) {
  mep_bs_root_abort(bs, st, failed_rank, reason);
  return coll_fail(bs, st, "rank 0: %s", reason);
}

/* The status an agreement's CONTRIB carries (mep_bootstrap_agree). */
static const char *agreed_status(const void *payload, size_t len) {
  int32_t v = MOE_EP_ERR_INTERNAL;
  if (payload != NULL && len == sizeof v) memcpy(&v, payload, sizeof v);
  return mep_status_string((moe_ep_status_t)v);
}

/* Checks one CONTRIB against what rank 0 is doing: MOE_EP_OK when it
 * matches, else the status the group fails with, `why` and the rank to
 * blame (*culprit). One side in an agreement while the other is still in
 * a collective of the same phase is a rank that gave up its part (a setup
 * it could not finish, or mep_bootstrap_fail_step in any step):
 * PEER_FAILED naming it. */
static moe_ep_status_t root_check_contrib(const mep_bootstrap_t *bs, const coll_t *c,
                                          const mep_bs_msg_t *m, char *why, size_t n,
                                          int *culprit) {
  const mep_bs_hdr_t *h = &m->hdr;
  *culprit = h->src;
  if ((h->op == MEP_BS_OP_AGREE) != (c->op == MEP_BS_OP_AGREE)) {
    const int quit_is_root = c->op == MEP_BS_OP_AGREE;
    *culprit = quit_is_root ? 0 : h->src;
    const int other = quit_is_root ? h->src : 0;
    const char *status = quit_is_root ? agreed_status(c->send, c->send_len)
                                      : agreed_status(m->payload, m->len);
    const int other_op = quit_is_root ? h->op : c->op;
    const uint64_t other_seq = quit_is_root ? h->seq : c->seq;
    snprintf(why, n,
             "rank %d gave up its part (%s) while rank %d was in %s #%llu of the same "
             "step (a setup, or a collective step such as a prepare's count exchange); rank "
             "%d's own error says why",
             *culprit, status, other, op_name(other_op), (unsigned long long)other_seq,
             *culprit);
    return MOE_EP_ERR_PEER_FAILED;
  }
  if (h->seq != c->seq || h->op != c->op) {
    snprintf(why, n,
             "collective mismatch: rank %d called %s #%llu while rank 0 "
             "called %s #%llu",
             h->src, op_name(h->op), (unsigned long long)h->seq,
             op_name(c->op), (unsigned long long)c->seq);
  } else if (h->bytes != c->bytes) {
    snprintf(why, n,
             "%s #%llu size mismatch: rank %d passed %llu bytes, rank 0 %zu",
             op_name(c->op), (unsigned long long)c->seq, h->src,
             (unsigned long long)h->bytes, c->bytes);
  } else if (h->root != c->root) {
    snprintf(why, n,
             "broadcast #%llu root mismatch: rank %d passed root %d, rank 0 "
             "root %d",
             (unsigned long long)c->seq, h->src, h->root, c->root);
  } else if (m->len != contrib_len(c, h->src)) {
    snprintf(why, n, "%s #%llu: rank %d sent %zu bytes, expected %zu",
             op_name(c->op), (unsigned long long)c->seq, h->src, m->len,
             contrib_len(c, h->src));
  } else {
    (void)bs;
    return MOE_EP_OK;
  }
  return MOE_EP_ERR_MISMATCH;
}

/* Rank 0: the first joined rank whose endpoint failed, or -1. */
static int root_first_failed(const mep_bootstrap_t *bs) {
  for (int r = 1; r < bs->world_size; r++) {
    if (bs->by_rank[r] == NULL || bs->by_rank[r]->failed) return r;
  }
  return -1;
}

static moe_ep_status_t root_gather(mep_bootstrap_t *bs, const coll_t *c,
                                   mep_bs_msg_t **got, int64_t deadline) {
  char why[MEP_BS_REASON_MAX];
  int idle = 0;
  for (;;) {
    int missing = 0;
    for (int r = 1; r < bs->world_size; r++) {
      if (got[r] != NULL) continue;
      /* By connection: the header's rank was checked against the rank the
       * connection joined as when the message arrived. */
      got[r] = mep_bs_msg_take(bs, MEP_BS_MSG_CONTRIB, bs->by_rank[r]);
      if (got[r] == NULL) {
        missing++;
      } else {
        int culprit = r;
        const moe_ep_status_t bad =
            root_check_contrib(bs, c, got[r], why, sizeof(why), &culprit);
        if (bad != MOE_EP_OK) return root_abort(bs, bad, culprit, why);
      }
    }
    int dead = root_first_failed(bs);
    if (dead > 0) {
      mep_bs_peer_t *p = bs->by_rank[dead];
      char what[MEP_BS_REASON_MAX - 64];
      if (p != NULL) {
        mep_bs_peer_describe_failure(p, c->start_ms, what, sizeof(what));
      } else {
        snprintf(what, sizeof(what), "it is no longer connected");
      }
      snprintf(why, sizeof(why), "rank %d failed during %s #%llu: %s", dead,
               op_name(c->op), (unsigned long long)c->seq, what);
      return root_abort(bs, MOE_EP_ERR_PEER_FAILED, dead, why);
    }
    if (missing == 0) return MOE_EP_OK;
    const int asker = mep_bs_root_overdue(bs, c->seq);
    if (asker > 0 || mep_bs_now_ms() >= deadline) {
      int late[MEP_BS_MAX_RANKS] = {0};
      int n = 0;
      for (int r = 1; r < bs->world_size; r++) {
        if (got[r] == NULL) late[n++] = r;
      }
      char list[256];
      mep_bs_format_ranks(list, sizeof(list), late, n);
      char waited[64];
      mep_bs_waited(bs, asker, waited, sizeof(waited));
      snprintf(why, sizeof(why), "%s #%llu: %s %s did not arrive within %s", op_name(c->op),
               (unsigned long long)c->seq, n == 1 ? "rank" : "ranks", list, waited);
      return root_abort(bs, MOE_EP_ERR_TIMEOUT, n == 1 ? late[0] : -1, why);
    }
    mep_bs_progress(bs, &idle);
  }
}

/* Rank 0 could not start sending a rank the op's result for want of its
 * own memory: its own failure, not that rank's (which is not marked
 * failed). The group fails (UCX, a fatal status, as coll_member's own
 * out-of-memory), and the peers are told so by an ABORT that needs no
 * allocation, naming rank 0 rather than timing out. */
static moe_ep_status_t root_out_of_memory(mep_bootstrap_t *bs, const coll_t *c, int r) {
  char why[MEP_BS_REASON_MAX];
  snprintf(why, sizeof(why),
           "rank 0 had no memory to send the result of %s #%llu to rank %d "
           "(UCS_ERR_NO_MEMORY), a failure of rank 0's own; the bootstrap's "
           "collectives cannot go on",
           op_name(c->op), (unsigned long long)c->seq, r);
  mep_bs_root_abort(bs, MOE_EP_ERR_UCX, 0, why);
  return coll_fail(bs, MOE_EP_ERR_UCX, "%s", why);
}

/* Rank 0: sends every rank the op's result and waits for the sends. Every
 * message and send record is made before the first send starts, so that
 * when rank 0 runs out of memory no rank has the result and every rank
 * fails this op alike. */
static moe_ep_status_t root_deliver(mep_bootstrap_t *bs, const coll_t *c,
                                    int64_t deadline) {
  mep_bs_send_t *sends[MEP_BS_MAX_RANKS];
  mep_bs_hdr_t h;
  mep_bs_hdr_init(bs, &h, MEP_BS_MSG_RESULT);
  h.seq = c->seq;
  h.op = c->op;
  h.root = c->root;
  h.bytes = c->bytes;
  /* Every rank but a broadcast's root gets the same bytes: one copy sent
   * to all of them (world_size copies of an allgather's world-sized
   * result would grow with world_size squared); the root gets an empty
   * one. */
  const int common = c->op == MEP_BS_OP_BROADCAST && c->root == 1 ? 2 : 1;
  h.payload_len = result_len(c, common, bs->world_size);
  mep_bs_blob_t *shared = mep_bs_blob_new(&h, c->out);
  mep_bs_blob_t *odd = NULL;
  mep_bs_blob_t *blobs[MEP_BS_MAX_RANKS];
  for (int r = 1; r < bs->world_size; r++) {
    blobs[r] = shared;
    if (result_len(c, r, bs->world_size) != h.payload_len) {
      if (odd == NULL) {
        mep_bs_hdr_t own = h;
        own.payload_len = result_len(c, r, bs->world_size);
        odd = mep_bs_blob_new(&own, c->out);
      }
      blobs[r] = odd;
    }
  }
  int short_of = mep_bs_send_each(bs, blobs, sends);
  mep_bs_blob_drop(shared);
  mep_bs_blob_drop(odd);
  if (short_of > 0) return root_out_of_memory(bs, c, short_of);
  /* A failed delivery means that rank died after contributing: the others
   * already have their result, so the failure surfaces in the next op.
   * Only UCX's own want of memory at the start of a send to a live rank
   * is rank 0's failure (the ranks before it may have their result then:
   * the ABORT follows it, and their next op fails on it). */
  for (int r = 1; r < bs->world_size; r++) {
    ucs_status_t st = mep_bs_send_wait(bs, sends[r], deadline);
    mep_bs_peer_t *p = bs->by_rank[r];
    if (st == UCS_ERR_NO_MEMORY && !p->failed) {
      if (short_of < 0) short_of = r;
    } else if (st != UCS_OK && !p->failed) {
      p->failed = 1;
      p->fail_status = st;
      p->fail_ms = mep_bs_now_ms();
    }
  }
  return short_of > 0 ? root_out_of_memory(bs, c, short_of) : MOE_EP_OK;
}

static moe_ep_status_t coll_root(mep_bootstrap_t *bs, coll_t *c) {
  int64_t deadline = c->start_ms + bs->timeout_ms;
  mep_bs_msg_t *got[MEP_BS_MAX_RANKS];
  memset(got, 0, sizeof(got[0]) * (size_t)bs->world_size);
  moe_ep_status_t st = root_gather(bs, c, got, deadline);
  if (st == MOE_EP_OK) {
    if (c->op == MEP_BS_OP_ALLGATHER || c->op == MEP_BS_OP_AGREE) {
      char *out = (char *)c->out;
      if (c->bytes != 0) memmove(out, c->send, c->bytes); /* may be in place */
      for (int r = 1; r < bs->world_size; r++) {
        if (c->bytes != 0) {
          memcpy(out + (size_t)r * c->bytes, got[r]->payload, c->bytes);
        }
      }
    } else if (c->op == MEP_BS_OP_BROADCAST && c->root != 0 && c->bytes != 0) {
      memcpy(c->out, got[c->root]->payload, c->bytes);
    }
    st = root_deliver(bs, c, deadline + mep_bs_slack_ms(bs));
  }
  for (int r = 1; r < bs->world_size; r++) mep_bs_msg_free(got[r]);
  return st;
}

static moe_ep_status_t coll_member(mep_bootstrap_t *bs, coll_t *c) {
  mep_bs_peer_t *peer = bs->by_rank[0];
  mep_bs_hdr_t h;
  mep_bs_hdr_init(bs, &h, MEP_BS_MSG_CONTRIB);
  h.seq = c->seq;
  h.op = c->op;
  h.root = c->root;
  h.bytes = c->bytes;
  h.payload_len = c->send_len;
  const ucs_status_t sent = mep_bs_send(peer, &h, c->send, NULL);
  /* A send this rank had no memory for is its own failure, named now. It
   * fails the group: this rank's part never reaches rank 0, whose
   * collective then ends without it, so every later one would be out of
   * step (UCX, a fatal status, not NO_MEMORY, which leaves a group
   * usable). Any other failed send may be rank 0's connection breaking:
   * the loop below reads what rank 0 said last and who failed, and bounds
   * the wait. */
  if (sent == UCS_ERR_NO_MEMORY) {
    return coll_fail(bs, MOE_EP_ERR_UCX,
                     "rank %d: %s #%llu: no memory to send its part to rank 0 "
                     "(UCS_ERR_NO_MEMORY); the bootstrap's collectives cannot go on",
                     bs->rank, op_name(c->op), (unsigned long long)c->seq);
  }
  int64_t deadline = c->start_ms + bs->timeout_ms + mep_bs_slack_ms(bs);
  int idle = 0;
  int drained = 0;
  int overdue_sent = 0;
  for (;;) {
    /* An abort may follow a result of this very op on the wire, so the
     * result is looked for first. */
    mep_bs_msg_t *m = mep_bs_msg_take(bs, MEP_BS_MSG_RESULT, peer);
    if (m != NULL) {
      int ok = m->hdr.seq == c->seq && m->hdr.op == c->op &&
               m->len == c->out_len;
      if (ok && c->out_len != 0) memcpy(c->out, m->payload, c->out_len);
      uint64_t seq = m->hdr.seq;
      int op = m->hdr.op;
      size_t len = m->len;
      mep_bs_msg_free(m);
      if (ok) return MOE_EP_OK;
      return coll_fail(bs, MOE_EP_ERR_MISMATCH,
                       "rank %d: %s #%llu got rank 0's result of %s #%llu "
                       "(%zu bytes, expected %zu)",
                       bs->rank, op_name(c->op), (unsigned long long)c->seq,
                       op_name(op), (unsigned long long)seq, len, c->out_len);
    }
    if (bs->abort_seen) {
      return coll_fail(bs, bs->abort_status,
                       "rank %d: %s #%llu failed; rank 0 reports: %s",
                       bs->rank, op_name(c->op), (unsigned long long)c->seq,
                       bs->abort_msg);
    }
    if (peer->failed && drained < 8) {
      /* Rank 0 closes right after its ABORT: whatever it said before the
       * connection broke is read before rank 0 is blamed. */
      drained++;
      mep_bs_progress(bs, &idle);
      continue;
    }
    if (peer->failed) {
      char what[MEP_BS_REASON_MAX];
      mep_bs_peer_describe_failure(peer, c->start_ms, what, sizeof(what));
      return coll_fail(bs, MOE_EP_ERR_PEER_FAILED,
                       "rank %d: %s #%llu failed: rank 0 failed: %s",
                       bs->rank, op_name(c->op), (unsigned long long)c->seq,
                       what);
    }
    if (mep_bs_now_ms() >= deadline && !overdue_sent) {
      /* Rank 0 may have entered the op late and still wait for another
       * rank: asked now, it names that rank at once (root_overdue). */
      overdue_sent = 1;
      if (mep_bs_send_overdue(bs, c->seq) == UCS_OK) {
        deadline = mep_bs_now_ms() + mep_bs_slack_ms(bs);
        continue;
      }
    }
    if (mep_bs_now_ms() >= deadline) {
      return coll_fail(bs, MOE_EP_ERR_TIMEOUT,
                       "rank %d: %s #%llu: rank 0 did not complete it within "
                       "%d ms, nor answered when asked",
                       bs->rank, op_name(c->op), (unsigned long long)c->seq,
                       bs->timeout_ms);
    }
    mep_bs_progress(bs, &idle);
  }
}

static moe_ep_status_t coll_run(mep_bootstrap_t *bs, coll_t *c) {
  if (bs->fail_status != MOE_EP_OK) {
    return mep_error(bs->fail_status, "%s (the bootstrap group failed earlier)",
                     bs->fail_msg);
  }
  c->seq = ++bs->seq;
  c->start_ms = mep_bs_now_ms();
  c->send_len = contrib_len(c, bs->rank);
  c->out_len = bs->rank == 0 ? 0 : result_len(c, bs->rank, bs->world_size);
  if (bs->rank == 0) return coll_root(bs, c);
  return coll_member(bs, c);
}

moe_ep_status_t mep_bootstrap_allgather(mep_bootstrap_t *bs, const void *send,
                                        void *recv, size_t bytes) {
  if (bs == NULL) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT, "allgather: bs is NULL");
  }
  if (bytes != 0 && (send == NULL || recv == NULL)) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "allgather: send (%p) and recv (%p) must be non-NULL "
                     "when bytes (%zu) > 0",
                     send, recv, bytes);
  }
  if (bytes > MEP_BS_PAYLOAD_MAX) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "allgather: bytes %zu exceeds the bootstrap's per-rank "
                     "bound of %u bytes",
                     bytes, MEP_BS_PAYLOAD_MAX);
  }
  coll_t c = {.op = MEP_BS_OP_ALLGATHER, .root = 0, .bytes = bytes,
              .send = send, .out = recv};
  return coll_run(bs, &c);
}

moe_ep_status_t mep_bootstrap_broadcast(mep_bootstrap_t *bs, void *buf,
                                        size_t bytes, int root) {
  if (bs == NULL) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT, "broadcast: bs is NULL");
  }
  if (root < 0 || root >= bs->world_size) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "broadcast: root %d is outside 0..%d", root,
                     bs->world_size - 1);
  }
  if (bytes != 0 && buf == NULL) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "broadcast: buf is NULL with bytes %zu", bytes);
  }
  if (bytes > MEP_BS_PAYLOAD_MAX) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "broadcast: bytes %zu exceeds the bootstrap's bound of "
                     "%u bytes",
                     bytes, MEP_BS_PAYLOAD_MAX);
  }
  coll_t c = {.op = MEP_BS_OP_BROADCAST, .root = root, .bytes = bytes,
              .send = buf, .out = buf};
  return coll_run(bs, &c);
}

moe_ep_status_t mep_bootstrap_barrier(mep_bootstrap_t *bs) {
  if (bs == NULL) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT, "barrier: bs is NULL");
  }
  coll_t c = {.op = MEP_BS_OP_BARRIER, .root = 0, .bytes = 0};
  return coll_run(bs, &c);
}

moe_ep_status_t mep_bootstrap_agree(mep_bootstrap_t *bs, int32_t mine,
                                    int32_t *statuses) {
  if (bs == NULL || statuses == NULL) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT, "agree: %s is NULL",
                     bs == NULL ? "bs" : "statuses");
  }
  coll_t c = {.op = MEP_BS_OP_AGREE, .root = 0, .bytes = sizeof mine,
              .send = &mine, .out = statuses};
  return coll_run(bs, &c);
}

moe_ep_status_t mep_bootstrap_fail_step(mep_bootstrap_t *bs, moe_ep_status_t status) {
  int32_t statuses[MEP_BS_MAX_RANKS]; /* world_size <= MEP_BS_MAX_RANKS (bootstrap_create) */
  return mep_bootstrap_agree(bs, (int32_t)status, statuses);
}
