/* bootstrap_join.c: a non-zero rank's side of forming the group: dial rank
 * 0 with retry until the deadline, present rank / world size / token, then
 * wait for "group formed" (or rank 0's reason why not). */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "runtime/bootstrap_types.h"
#include "runtime/error.h"
#include "runtime/log.h"

static void sleep_ms(int64_t ms) {
  if (ms <= 0) return;
  struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

enum { JOIN_RETRY = 0, JOIN_ACCEPTED = 1, JOIN_REFUSED = 2 };

/* One attempt: connect, HELLO, wait for the verdict. */
static int join_attempt(mep_bootstrap_t *bs, int64_t deadline_ms,
                        char *why, size_t why_len) {
  mep_bs_peer_t *peer = mep_bs_peer_new(bs);
  if (peer == NULL) {
    snprintf(why, why_len, "out of memory");
    return JOIN_RETRY;
  }
  ucp_ep_params_t p;
  mep_bs_peer_ep_params(peer, &p);
  p.field_mask |= UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
  p.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  p.sockaddr.addr = (const struct sockaddr *)&bs->saddr;
  p.sockaddr.addrlen = bs->saddr_len;
  ucs_status_t st = ucp_ep_create(bs->worker, &p, &peer->ep);
  if (st != UCS_OK) {
    peer->ep = NULL;
    snprintf(why, why_len, "ucp_ep_create: %s", ucs_status_string(st));
    return JOIN_RETRY;
  }
  peer->state = MEP_BS_PEER_CONNECTING;
  mep_bs_hdr_t h;
  mep_bs_hdr_init(bs, &h, MEP_BS_MSG_HELLO);
  h.payload_len = strlen(bs->token);
  (void)mep_bs_send(bs, peer, &h, bs->token, NULL);

  int idle = 0;
  for (;;) {
    mep_bs_progress(bs, &idle);
    mep_bs_msg_t *m = mep_bs_msg_take(bs, MEP_BS_MSG_REFUSE, peer);
    if (m != NULL) {
      size_t n = m->len < why_len - 1 ? m->len : why_len - 1;
      memcpy(why, m->payload, n);
      why[n] = '\0';
      mep_bs_msg_free(m);
      peer->state = MEP_BS_PEER_REFUSED;
      mep_bs_peer_close(bs, peer, 1);
      return JOIN_REFUSED;
    }
    m = mep_bs_msg_take(bs, MEP_BS_MSG_ACCEPT, peer);
    if (m != NULL) {
      mep_bs_msg_free(m);
      peer->state = MEP_BS_PEER_JOINED;
      peer->rank = 0;
      bs->by_rank[0] = peer;
      return JOIN_ACCEPTED;
    }
    if (peer->failed) {
      snprintf(why, why_len, "%s", ucs_status_string(peer->fail_status));
      mep_bs_peer_close(bs, peer, 1);
      return JOIN_RETRY;
    }
    if (mep_bs_now_ms() >= deadline_ms) {
      snprintf(why, why_len, "no answer to the handshake");
      mep_bs_peer_close(bs, peer, 1);
      return JOIN_RETRY;
    }
  }
}

static moe_ep_status_t join_wait_formed(mep_bootstrap_t *bs,
                                        int64_t deadline_ms) {
  mep_bs_peer_t *peer = bs->by_rank[0];
  int idle = 0;
  for (;;) {
    mep_bs_progress(bs, &idle);
    mep_bs_msg_t *m = mep_bs_msg_take(bs, MEP_BS_MSG_FORMED, peer);
    if (m != NULL) {
      mep_bs_msg_free(m);
      return MOE_EP_OK;
    }
    if (bs->abort_seen) {
      return mep_error(MOE_EP_ERR_BOOTSTRAP,
                       "rank %d: rank 0 at %s reports: %s", bs->rank,
                       bs->address, bs->abort_msg);
    }
    if (peer->failed) {
      char what[MEP_BS_REASON_MAX];
      mep_bs_peer_describe_failure(peer, -1, what, sizeof(what));
      return mep_error(MOE_EP_ERR_BOOTSTRAP,
                       "rank %d: rank 0 at %s failed while this rank waited "
                       "for the group to form: %s",
                       bs->rank, bs->address, what);
    }
    if (mep_bs_now_ms() >= deadline_ms) {
      return mep_error(MOE_EP_ERR_BOOTSTRAP,
                       "rank %d: joined rank 0 at %s but was not told the "
                       "group formed within %d ms",
                       bs->rank, bs->address, bs->timeout_ms);
    }
  }
}

moe_ep_status_t mep_bs_join(mep_bootstrap_t *bs, int64_t start_ms) {
  int64_t deadline = start_ms + bs->timeout_ms;
  int64_t backoff = 5;
  int attempts = 0;
  char why[MEP_BS_REASON_MAX];
  snprintf(why, sizeof(why), "nothing listening");
  for (;;) {
    int64_t now = mep_bs_now_ms();
    if (now >= deadline) break;
    /* A plain TCP probe first: UCX logs every refused sockaddr connect, and
     * early joiners are routinely refused until rank 0 listens. */
    int64_t left = deadline - now;
    if (!mep_bs_addr_probe(bs, left < 200 ? (int)left : 200)) {
      snprintf(why, sizeof(why), "nothing listening");
    } else {
      attempts++;
      int r = join_attempt(bs, deadline, why, sizeof(why));
      if (r == JOIN_ACCEPTED) {
        return join_wait_formed(bs, deadline + mep_bs_slack_ms(bs));
      }
      if (r == JOIN_REFUSED) {
        return mep_error(MOE_EP_ERR_BOOTSTRAP,
                         "rank %d: rank 0 at %s refused to admit rank %d of "
                         "%d: %s",
                         bs->rank, bs->address, bs->rank, bs->world_size, why);
      }
      MEP_LOG_DEBUG("bootstrap", "rank %d: attempt %d to reach %s: %s",
                    bs->rank, attempts, bs->address, why);
    }
    now = mep_bs_now_ms();
    int64_t nap = backoff < deadline - now ? backoff : deadline - now;
    sleep_ms(nap);
    if (backoff < 100) backoff *= 2;
  }
  return mep_error(MOE_EP_ERR_BOOTSTRAP,
                   "rank %d could not reach rank 0 at %s within %d ms "
                   "(%d connection attempts; last: %s)",
                   bs->rank, bs->address, bs->timeout_ms, attempts, why);
}
