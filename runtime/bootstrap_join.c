/* bootstrap_join.c: a non-zero rank's side of forming the group: knock on
 * rank 0's gate with retry until the deadline (rank, world size, token,
 * this worker's address; only a refusal rank 0 proves ends the retries
 * early), then connect to the worker address rank 0
 * answers with, say HELLO, and wait for ACCEPT and "group formed" (or rank
 * 0's reason why not). */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "runtime/bootstrap_types.h"
#include "runtime/error.h"
#include "runtime/log.h"

/* The pause before knocking again after an answer that proved nothing. */
#define MEP_BS_UNPROVEN_BACKOFF_MS 500

static void sleep_ms(int64_t ms) {
  if (ms <= 0) return;
  struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Waits on rank 0's connection for a message of `type`; `what` names the
 * wait in the error. With `ask` (a joined rank waiting for FORMED), a
 * deadline that passes first asks rank 0 for its verdict (OVERDUE): rank 0
 * may have started late and still wait for another rank, which it then
 * names at once. */
static moe_ep_status_t join_wait(mep_bootstrap_t *bs, mep_bs_peer_t *peer,
                                 int type, int64_t deadline_ms,
                                 const char *what, int ask) {
  int idle = 0;
  int drained = 0;
  for (;;) {
    mep_bs_progress(bs, &idle);
    mep_bs_msg_t *m = mep_bs_msg_take(bs, type, peer);
    if (m != NULL) {
      mep_bs_msg_free(m);
      return MOE_EP_OK;
    }
    if (bs->abort_seen) {
      return mep_error(MOE_EP_ERR_BOOTSTRAP,
                       "rank %d: rank 0 at %s reports: %s", bs->rank,
                       bs->address, bs->abort_msg);
    }
    /* Rank 0 closes right after its ABORT: whatever it said before the
     * connection broke is read before rank 0 is blamed. */
    if (peer->failed && drained++ < 8) continue;
    if (peer->failed) {
      char fail[MEP_BS_REASON_MAX];
      mep_bs_peer_describe_failure(peer, -1, fail, sizeof(fail));
      return mep_error(MOE_EP_ERR_BOOTSTRAP,
                       "rank %d: rank 0 at %s failed while this rank waited "
                       "to be told %s: %s",
                       bs->rank, bs->address, what, fail);
    }
    if (mep_bs_now_ms() >= deadline_ms && ask) {
      ask = 0;
      if (mep_bs_send_overdue(bs, 0) == UCS_OK) {
        deadline_ms = mep_bs_now_ms() + mep_bs_slack_ms(bs);
        continue;
      }
    }
    if (mep_bs_now_ms() >= deadline_ms) {
      return mep_error(MOE_EP_ERR_BOOTSTRAP,
                       "rank %d: rank 0 at %s admitted this rank but it was "
                       "not told %s within %d ms",
                       bs->rank, bs->address, what, bs->timeout_ms);
    }
  }
}

/* Admitted: connect to rank 0's worker, HELLO, ACCEPT, FORMED. No retry
 * from here: rank 0 holds this rank's slot for this process. */
static moe_ep_status_t join_connect(mep_bootstrap_t *bs, const void *addr,
                                    int64_t deadline_ms) {
  mep_bs_peer_t *peer = mep_bs_peer_new(bs);
  if (peer == NULL) {
    return mep_error(MOE_EP_ERR_NO_MEMORY, "rank %d: out of memory",
                     bs->rank);
  }
  /* Before the ep exists: rank 0's first message is checked under them. */
  mep_bs_peer_keys(bs, peer, bs->rank, bs->self_addr, bs->self_addr_len);
  ucs_status_t st = mep_bs_peer_connect(bs, peer, addr);
  if (st != UCS_OK) {
    return mep_error(MOE_EP_ERR_UCX,
                     "rank %d: cannot create a UCX endpoint to the worker "
                     "address rank 0 at %s answered with: %s",
                     bs->rank, bs->address, ucs_status_string(st));
  }
  peer->rank = 0;
  bs->by_rank[0] = peer;
  mep_bs_hdr_t h;
  mep_bs_hdr_init(bs, &h, MEP_BS_MSG_HELLO);
  /* A HELLO this rank has no memory for is its own failure, named now (rank
   * 0 would only see a rank that never joined). Any other failure is the
   * connection's, which join_wait reads. */
  if (mep_bs_send(peer, &h, NULL, NULL) == UCS_ERR_NO_MEMORY) {
    return mep_error(MOE_EP_ERR_NO_MEMORY,
                     "rank %d had no memory to send its HELLO to rank 0 at %s "
                     "(UCS_ERR_NO_MEMORY) after rank 0 admitted it, a failure "
                     "of rank %d's own; it did not join",
                     bs->rank, bs->address, bs->rank);
  }
  MEP_CHECK(join_wait(bs, peer, MEP_BS_MSG_ACCEPT, deadline_ms,
                      "that its HELLO was taken", 0));
  peer->state = MEP_BS_PEER_JOINED;
  return join_wait(bs, peer, MEP_BS_MSG_FORMED,
                   deadline_ms + mep_bs_slack_ms(bs), "that the group formed", 1);
}

moe_ep_status_t mep_bs_join(mep_bootstrap_t *bs, int64_t start_ms) {
  int64_t deadline = start_ms + bs->timeout_ms;
  int64_t backoff = 5;
  int attempts = 0;
  char why[MEP_BS_REASON_MAX];
  char unproven[MEP_BS_REASON_MAX] = "";
  unsigned char addr[MEP_BS_ADDR_MAX];
  size_t addr_len = 0;
  snprintf(why, sizeof(why), "nothing listening");
  for (;;) {
    if (mep_bs_now_ms() >= deadline) break;
    attempts++;
    int r = mep_bs_knock(bs, deadline, addr, &addr_len, why, sizeof(why));
    if (r == MEP_BS_KNOCK_ADMITTED) return join_connect(bs, addr, deadline);
    if (r == MEP_BS_KNOCK_REFUSED) {
      return mep_error(MOE_EP_ERR_BOOTSTRAP,
                       "rank %d: rank 0 at %s refused to admit rank %d of "
                       "%d: %s",
                       bs->rank, bs->address, bs->rank, bs->world_size, why);
    }
    if (r == MEP_BS_KNOCK_UNPROVEN) {
      snprintf(unproven, sizeof(unproven), "%s", why);
      /* Something answers there (rank 0 to a joiner whose token differs,
       * or another process): knocking faster changes nothing, and rank 0
       * logs each refusal it sends within a small budget. */
      if (backoff < MEP_BS_UNPROVEN_BACKOFF_MS) backoff = MEP_BS_UNPROVEN_BACKOFF_MS;
    }
    MEP_LOG_DEBUG("bootstrap", "rank %d: attempt %d to reach %s: %s",
                  bs->rank, attempts, bs->address, why);
    int64_t now = mep_bs_now_ms();
    int64_t nap = backoff < deadline - now ? backoff : deadline - now;
    sleep_ms(nap);
    if (backoff < 100) backoff *= 2;
  }
  /* An answer that did not prove the token (a forged admission, or a
   * refusal rank 0 could not prove to a joiner with another token) says
   * more than a later attempt's timeout. */
  int keep = unproven[0] != '\0' && strcmp(unproven, why) != 0;
  return mep_error(MOE_EP_ERR_BOOTSTRAP,
                   "rank %d could not reach rank 0 at %s within %d ms "
                   "(%d connection attempts; last: %s%s%s)",
                   bs->rank, bs->address, bs->timeout_ms, attempts, why,
                   keep ? "; earlier: " : "", keep ? unproven : "");
}
