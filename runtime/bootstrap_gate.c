/* bootstrap_gate.c: rank 0's gate, a plain TCP socket on the bootstrap
 * address that stands in front of UCX. It sends each connection a
 * challenge, reads its knock into a fixed slot, checks the knock's proof of
 * the job token, has bootstrap_root.c judge the rest, answers with the
 * verdict (proven in turn when the knock was: an admission or a refusal)
 * and closes. Nothing a connection sends is
 * allocated for: an outsider gets at most one of MEP_BS_PENDING_KNOCKS
 * slots for at most MEP_BS_KNOCK_WAIT_MS, and no endpoint of rank 0's is
 * made for it. (UCX's own listening ports are another way in, which the
 * gate does not cover: the message handlers drop what an unadmitted
 * connection sends; README, "Limits".) */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "runtime/bootstrap_types.h"
#include "runtime/error.h"
#include "runtime/hmac.h"
#include "runtime/log.h"

/* Counts a connection rank 0 turned away; logs the first few at WARN (a
 * flood must not turn into a flood of log lines). */
static void gate_log(mep_bootstrap_t *bs, const mep_bs_knocker_t *k,
                     const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void gate_log(mep_bootstrap_t *bs, const mep_bs_knocker_t *k,
                     const char *fmt, ...) {
  if (bs->gate_refused++ >= MEP_BS_GATE_LOG_MAX) return;
  char why[MEP_BS_REASON_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof(why), fmt, ap);
  va_end(ap);
  MEP_LOG_WARN("bootstrap", "rank 0 refused a connection from %s on %s: %s",
               k->name, bs->address, why);
}

static void knocker_close(mep_bs_knocker_t *k) {
  close(k->fd);
  k->fd = -1;
  k->got = 0;
}

/* Sends one record without waiting: a fresh connection's send buffer
 * takes a few KiB at once, and a peer that does not read gets nothing. */
static int gate_send(mep_bs_knocker_t *k, const mep_bs_knock_hdr_t *h,
                     const void *proof, const void *body) {
  unsigned char rec[MEP_BS_KNOCK_MAX]; /* the longest, a knock or an admission */
  memcpy(rec, h, sizeof(*h));
  if (h->proof_len != 0) memcpy(rec + sizeof(*h), proof, h->proof_len);
  if (h->body_len != 0) memcpy(rec + sizeof(*h) + h->proof_len, body, h->body_len);
  return mep_bs_fd_write(k->fd, rec, sizeof(*h) + h->proof_len + h->body_len,
                         mep_bs_now_ms());
}

/* A verdict that carries a reason (REFUSE or BUSY). `theirs`, the nonce of
 * a knock whose proof checked out, or NULL: a refusal of a proven knock is
 * proven in turn (HMAC over both nonces, its header and the reason), so the
 * joiner can tell rank 0's final word from an answer anyone could forge and
 * gives up only on the former. A knock that proved nothing gets no proof: a
 * joiner with another token could not check one. */
static void gate_send_reason(const mep_bootstrap_t *bs, mep_bs_knocker_t *k,
                             int type, const char *why, const uint8_t *theirs) {
  mep_bs_knock_hdr_t h;
  mep_bs_knock_hdr_init(&h, type, 0, 0, theirs != NULL ? MEP_BS_PROOF_BYTES : 0,
                        strnlen(why, MEP_BS_REASON_MAX - 1));
  uint8_t proof[MEP_BS_PROOF_BYTES];
  if (theirs != NULL) {
    mep_bs_proof(bs, MEP_BS_PROOF_REFUSAL, theirs, k->nonce, &h, why, proof);
  }
  (void)gate_send(k, &h, proof, why);
}

static void gate_refuse(mep_bootstrap_t *bs, mep_bs_knocker_t *k,
                        const char *why, const uint8_t *theirs) {
  gate_log(bs, k, "%s", why);
  gate_send_reason(bs, k, MEP_BS_KNOCK_REFUSE, why, theirs);
  knocker_close(k);
}

/* A whole knock is in k->buf: proof, then the joiner's nonce and worker
 * address. */
static void gate_answer(mep_bootstrap_t *bs, mep_bs_knocker_t *k) {
  mep_bs_knock_hdr_t h;
  memcpy(&h, k->buf, sizeof(h));
  const uint8_t *proof = k->buf + sizeof(h);
  const uint8_t *theirs = proof + MEP_BS_PROOF_BYTES;
  const uint8_t *addr = theirs + MEP_BS_NONCE_BYTES;
  const size_t addr_len = h.body_len - MEP_BS_NONCE_BYTES;
  char why[MEP_BS_REASON_MAX];
  uint8_t want[MEP_BS_PROOF_BYTES];
  mep_bs_proof(bs, MEP_BS_PROOF_KNOCK, k->nonce, theirs, &h, theirs, want);
  if (!mep_bytes_equal(proof, want, sizeof(want))) {
    snprintf(why, sizeof(why),
             "wrong job token (the knock claimed rank %d of %d)", h.rank,
             h.world_size);
    gate_refuse(bs, k, why, NULL);
    return;
  }
  int verdict = mep_bs_root_admit(bs, &h, addr, addr_len, k->name, why,
                                  sizeof(why));
  if (verdict == MEP_BS_KNOCK_REFUSE) {
    gate_refuse(bs, k, why, theirs);
    return;
  }
  if (verdict == MEP_BS_KNOCK_BUSY) {
    MEP_LOG_DEBUG("bootstrap", "rank 0: %s: %s", k->name, why);
    /* Retried by the joiner either way: nothing to prove. */
    gate_send_reason(bs, k, MEP_BS_KNOCK_BUSY, why, NULL);
  } else {
    /* The group's nonce, then rank 0's worker address, both proven. */
    unsigned char body[MEP_BS_NONCE_BYTES + MEP_BS_ADDR_MAX];
    memcpy(body, bs->group_nonce, MEP_BS_NONCE_BYTES);
    memcpy(body + MEP_BS_NONCE_BYTES, bs->self_addr, bs->self_addr_len);
    mep_bs_knock_hdr_t ok;
    mep_bs_knock_hdr_init(&ok, MEP_BS_KNOCK_OK, 0, bs->world_size, MEP_BS_PROOF_BYTES,
                          MEP_BS_NONCE_BYTES + bs->self_addr_len);
    uint8_t mine[MEP_BS_PROOF_BYTES];
    mep_bs_proof(bs, MEP_BS_PROOF_VERDICT, theirs, k->nonce, &ok, body, mine);
    if (gate_send(k, &ok, mine, body) != 0) {
      /* The joiner knocks again and keeps its slot. */
      MEP_LOG_DEBUG("bootstrap", "rank 0: the verdict to %s was not sent",
                    k->name);
    }
  }
  knocker_close(k);
}

/* Checks a knock's header once it is in: 0, or 1 when the connection was
 * refused. */
static int gate_check_hdr(mep_bootstrap_t *bs, mep_bs_knocker_t *k) {
  mep_bs_knock_hdr_t h;
  memcpy(&h, k->buf, sizeof(h));
  char why[MEP_BS_REASON_MAX];
  if (h.magic != MEP_BS_KNOCK_MAGIC) {
    /* Not this protocol (a port scan, a UCX client, an HTTP probe): no
     * answer it could read. */
    gate_log(bs, k, "sent %zu bytes that do not start a moe-ep knock",
             k->got);
    knocker_close(k);
    return 1;
  }
  if (h.version != MEP_BS_VERSION || h.type != MEP_BS_KNOCK) {
    snprintf(why, sizeof(why),
             "protocol version %u record type %u, rank 0 speaks version %u "
             "and expects a knock",
             h.version, h.type, MEP_BS_VERSION);
  } else if (h.proof_len == 0) {
    snprintf(why, sizeof(why),
             "no job token presented (the knock claimed rank %d of %d)",
             h.rank, h.world_size);
  } else if (h.proof_len != MEP_BS_PROOF_BYTES) {
    snprintf(why, sizeof(why), "a %u-byte proof of the job token; a proof "
             "is %d bytes", h.proof_len, MEP_BS_PROOF_BYTES);
  } else if (h.body_len <= MEP_BS_NONCE_BYTES ||
             h.body_len > MEP_BS_NONCE_BYTES + MEP_BS_ADDR_MAX) {
    snprintf(why, sizeof(why),
             "a %u-byte knock body (a %d-byte nonce and a UCX worker "
             "address of 1..%d bytes)",
             h.body_len, MEP_BS_NONCE_BYTES, MEP_BS_ADDR_MAX);
  } else {
    return 0;
  }
  gate_refuse(bs, k, why, NULL);
  return 1;
}

/* Reads what the connection has sent; answers once the knock is whole. */
static void gate_read(mep_bootstrap_t *bs, mep_bs_knocker_t *k) {
  const size_t hdr = sizeof(mep_bs_knock_hdr_t);
  for (;;) {
    size_t need = hdr;
    if (k->got >= hdr) {
      mep_bs_knock_hdr_t h;
      memcpy(&h, k->buf, sizeof(h));
      need = hdr + h.proof_len + h.body_len;
    }
    if (k->got == need) {
      gate_answer(bs, k);
      return;
    }
    ssize_t n = recv(k->fd, k->buf + k->got, need - k->got, MSG_DONTWAIT);
    if (n > 0) {
      k->got += (size_t)n;
      if (k->got == hdr && gate_check_hdr(bs, k)) return;
      continue;
    }
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      gate_log(bs, k, "the connection ended after %zu bytes of a knock",
               k->got);
      knocker_close(k);
      return;
    }
    if (errno == EINTR) continue;
    if (mep_bs_now_ms() - k->accepted_ms > MEP_BS_KNOCK_WAIT_MS) {
      gate_log(bs, k, "no whole knock within %d ms (%zu bytes)",
               MEP_BS_KNOCK_WAIT_MS, k->got);
      knocker_close(k);
    }
    return;
  }
}

static int same_host(const mep_bs_knocker_t *k, const uint8_t *host, size_t host_len) {
  return k->host_len == host_len && memcmp(k->host, host, host_len) == 0;
}

int mep_bs_gate_victim(const mep_bs_knocker_t *slots, int n, const uint8_t *host,
                       size_t host_len) {
  int victim = -1, most = 0;
  for (int i = 0; i < n; i++) {
    /* Slots of a host seen earlier were counted with it. */
    int first = 1;
    for (int j = 0; j < i && first; j++) {
      first = !same_host(&slots[j], slots[i].host, slots[i].host_len);
    }
    if (!first) continue;
    int held = same_host(&slots[i], host, host_len), oldest = i;
    for (int j = i; j < n; j++) {
      if (!same_host(&slots[j], slots[i].host, slots[i].host_len)) continue;
      held++;
      if (slots[j].accepted_ms < slots[oldest].accepted_ms) oldest = j;
    }
    if (held > most || (held == most && slots[oldest].accepted_ms < slots[victim].accepted_ms)) {
      most = held;
      victim = oldest;
    }
  }
  return victim;
}

/* Takes the connections the kernel has queued, a slot each; when every
 * slot is taken, the host holding the most gives its oldest up
 * (mep_bs_gate_victim). */
static void gate_accept(mep_bootstrap_t *bs) {
  for (int i = 0; i < MEP_BS_PENDING_KNOCKS; i++) {
    struct sockaddr_storage from;
    socklen_t len = sizeof(from);
    int fd = accept4(bs->gate_fd, (struct sockaddr *)&from, &len,
                     SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return; /* none queued, or out of descriptors for now */
    uint8_t host[16];
    const size_t host_len = mep_bs_addr_host(&from, host);
    mep_bs_knocker_t *slot = NULL;
    for (int j = 0; j < MEP_BS_PENDING_KNOCKS && slot == NULL; j++) {
      if (bs->knockers[j].fd < 0) slot = &bs->knockers[j];
    }
    if (slot == NULL) {
      slot = &bs->knockers[mep_bs_gate_victim(bs->knockers, MEP_BS_PENDING_KNOCKS, host,
                                               host_len)];
      gate_log(bs, slot,
               "no whole knock when %d connections were open and another "
               "came (%zu bytes); its host held the most of them",
               MEP_BS_PENDING_KNOCKS, slot->got);
      knocker_close(slot);
    }
    slot->fd = fd;
    memcpy(slot->host, host, sizeof(host));
    slot->host_len = (uint8_t)host_len;
    slot->got = 0;
    slot->accepted_ms = mep_bs_now_ms();
    mep_bs_addr_name(&from, slot->name, sizeof(slot->name));
    /* The challenge, at once: the knock must answer this nonce. */
    mep_bs_knock_hdr_t h;
    mep_bs_knock_hdr_init(&h, MEP_BS_CHALLENGE, 0, bs->world_size, 0,
                          MEP_BS_NONCE_BYTES);
    if (mep_bs_nonce(slot->nonce) != 0 ||
        gate_send(slot, &h, NULL, slot->nonce) != 0) {
      gate_log(bs, slot, "its challenge could not be made or sent");
      knocker_close(slot);
    }
  }
}

static void gate_read_all(mep_bootstrap_t *bs) {
  for (int i = 0; i < MEP_BS_PENDING_KNOCKS; i++) {
    if (bs->knockers[i].fd >= 0) gate_read(bs, &bs->knockers[i]);
  }
}

void mep_bs_gate_poll(mep_bootstrap_t *bs) {
  if (bs->gate_fd < 0) return;
  gate_read_all(bs);
  gate_accept(bs);
  gate_read_all(bs);
}

moe_ep_status_t mep_bs_gate_open(mep_bootstrap_t *bs) {
  bs->knockers = (mep_bs_knocker_t *)calloc(MEP_BS_PENDING_KNOCKS,
                                            sizeof(*bs->knockers));
  if (bs->knockers == NULL) {
    return mep_error(MOE_EP_ERR_NO_MEMORY, "rank 0: out of memory");
  }
  for (int i = 0; i < MEP_BS_PENDING_KNOCKS; i++) bs->knockers[i].fd = -1;
  int fd = socket(bs->saddr.ss_family,
                  SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return mep_error(MOE_EP_ERR_BOOTSTRAP,
                     "rank 0 cannot listen on bootstrap address %s: socket: "
                     "%s",
                     bs->address, strerror(errno));
  }
  /* Connections of an earlier group on this port that linger in TIME_WAIT
   * do not keep this one from listening. */
  int one = 1;
  (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  const char *step = "bind";
  int rc = bind(fd, (const struct sockaddr *)&bs->saddr, bs->saddr_len);
  if (rc == 0) {
    step = "listen";
    rc = listen(fd, 128);
  }
  if (rc != 0) {
    int err = errno;
    close(fd);
    return mep_error(MOE_EP_ERR_BOOTSTRAP,
                     "rank 0 cannot listen on bootstrap address %s: %s: %s "
                     "(errno %d)%s",
                     bs->address, step, strerror(err), err,
                     err == EADDRINUSE ? "; another group or program holds "
                                         "the port: give each group its own "
                                         "port"
                                       : "");
  }
  bs->gate_fd = fd;
  return MOE_EP_OK;
}

void mep_bs_gate_close(mep_bootstrap_t *bs, int hold) {
  if (bs->knockers != NULL) {
    for (int i = 0; i < MEP_BS_PENDING_KNOCKS; i++) {
      if (bs->knockers[i].fd >= 0) knocker_close(&bs->knockers[i]);
    }
    free(bs->knockers);
    bs->knockers = NULL;
  }
  if (bs->gate_fd >= 0) {
    close(bs->gate_fd);
    bs->gate_fd = -1;
    if (bs->gate_refused > MEP_BS_GATE_LOG_MAX) {
      MEP_LOG_WARN("bootstrap",
                   "rank 0 refused %lld connections on %s while the group "
                   "formed (the first %d are logged above)",
                   (long long)bs->gate_refused, bs->address,
                   MEP_BS_GATE_LOG_MAX);
    }
  }
  if (hold && bs->hold_fd < 0) {
    /* Bound but not listening: connections are refused by the kernel, and
     * the port is not handed out as another socket's ephemeral port, so
     * the next group on this address finds it free. Best effort; with
     * SO_REUSEADDR, since the gate's closed connections linger in
     * TIME_WAIT on it. */
    int fd = socket(bs->saddr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd >= 0) {
      (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      if (bind(fd, (const struct sockaddr *)&bs->saddr, bs->saddr_len) != 0) {
        close(fd);
        fd = -1;
      }
    }
    bs->hold_fd = fd;
  }
  if (!hold && bs->hold_fd >= 0) {
    close(bs->hold_fd);
    bs->hold_fd = -1;
  }
}
