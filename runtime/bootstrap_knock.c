/* bootstrap_knock.c: the gate's records on the wire, their proofs, and a
 * joiner's knock: connect to rank 0's bootstrap address, take its
 * challenge, present rank, world size and this worker's UCX address with a
 * proof of the job token, and read (and check) rank 0's verdict. Every step
 * is bounded by the caller's deadline and by the record sizes. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "runtime/bootstrap_types.h"
#include "runtime/hmac.h"

/* One attempt (connect, challenge, knock, verdict) takes this long at
 * most: rank 0 answers or closes within MEP_BS_KNOCK_WAIT_MS of reading,
 * so a longer silence is a busy gate or not rank 0, and the next attempt
 * starts over. */
#define KNOCK_ANSWER_MS 10000

void mep_bs_knock_hdr_init(mep_bs_knock_hdr_t *h, int type, int rank,
                           int world_size, size_t proof_len, size_t body_len) {
  memset(h, 0, sizeof(*h));
  h->magic = MEP_BS_KNOCK_MAGIC;
  h->version = MEP_BS_VERSION;
  h->type = (uint16_t)type;
  h->rank = rank;
  h->world_size = world_size;
  h->proof_len = (uint32_t)proof_len;
  h->body_len = (uint32_t)body_len;
}

int mep_bs_nonce(uint8_t out[MEP_BS_NONCE_BYTES]) {
  return mep_random_bytes(out, MEP_BS_NONCE_BYTES);
}

void mep_bs_proof(const mep_bootstrap_t *bs, const char *label,
                  const uint8_t *a, const uint8_t *b,
                  const mep_bs_knock_hdr_t *h, const void *body,
                  uint8_t out[MEP_BS_PROOF_BYTES]) {
  const void *parts[5] = {label, a, b, h, body};
  const size_t lens[5] = {strlen(label) + 1, MEP_BS_NONCE_BYTES,
                          MEP_BS_NONCE_BYTES, sizeof(*h), h->body_len};
  mep_hmac_sha256(bs->token, strlen(bs->token), 5, parts, lens, out);
}

static int fd_wait(int fd, short events, int64_t deadline_ms) {
  int64_t left = deadline_ms - mep_bs_now_ms();
  if (left <= 0) return 0;
  struct pollfd p = {.fd = fd, .events = events, .revents = 0};
  int n = poll(&p, 1, left > 100 ? 100 : (int)left);
  /* A signal is not an error: the caller looks again. */
  if (n < 0) return errno == EINTR ? 0 : -1;
  return n;
}

int mep_bs_fd_write(int fd, const void *buf, size_t len, int64_t deadline_ms) {
  const char *p = (const char *)buf;
  while (len > 0) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= (size_t)n;
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      return -1;
    }
    if (mep_bs_now_ms() >= deadline_ms) return -1;
    if (fd_wait(fd, POLLOUT, deadline_ms) < 0) return -1;
  }
  return 0;
}

/* Reads exactly len bytes by the deadline: 0, or -1 with `why`. */
static int fd_read(int fd, void *buf, size_t len, int64_t deadline_ms,
                   char *why, size_t why_len) {
  char *p = (char *)buf;
  while (len > 0) {
    ssize_t n = recv(fd, p, len, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= (size_t)n;
      continue;
    }
    if (n == 0) {
      snprintf(why, why_len, "rank 0 closed the connection without a verdict");
      return -1;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      snprintf(why, why_len, "reading rank 0's answer: %s", strerror(errno));
      return -1;
    }
    if (mep_bs_now_ms() >= deadline_ms) {
      snprintf(why, why_len, "no answer from rank 0");
      return -1;
    }
    (void)fd_wait(fd, POLLIN, deadline_ms);
  }
  return 0;
}

/* Connects by the deadline: the socket, or -1 with `why`. */
static int knock_connect(const mep_bootstrap_t *bs, int64_t deadline_ms,
                         char *why, size_t why_len) {
  int fd = socket(bs->saddr.ss_family,
                  SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    snprintf(why, why_len, "socket: %s", strerror(errno));
    return -1;
  }
  if (connect(fd, (const struct sockaddr *)&bs->saddr, bs->saddr_len) == 0) {
    return fd;
  }
  if (errno == EINPROGRESS) {
    while (fd_wait(fd, POLLOUT, deadline_ms) == 0 &&
           mep_bs_now_ms() < deadline_ms) {
    }
    int err = ETIMEDOUT;
    socklen_t len = sizeof(err);
    struct pollfd p = {.fd = fd, .events = POLLOUT, .revents = 0};
    if (poll(&p, 1, 0) == 1 &&
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) {
      return fd;
    }
    errno = err;
  }
  snprintf(why, why_len, "nothing listening (%s)", strerror(errno));
  close(fd);
  return -1;
}

/* Reads a record header and checks it is a moe-ep gate record of one of
 * the types allowed here; 0, or -1 with `why`. */
static int knock_read_hdr(const mep_bootstrap_t *bs, int fd,
                          int64_t deadline_ms, mep_bs_knock_hdr_t *h,
                          char *why, size_t why_len) {
  if (fd_read(fd, h, sizeof(*h), deadline_ms, why, why_len) != 0) return -1;
  if (h->magic == MEP_BS_KNOCK_MAGIC && h->version == MEP_BS_VERSION) return 0;
  /* Some other program on the port, or another protocol version. */
  snprintf(why, why_len,
           "the answer at %s is not a moe-ep gate of version %u (magic "
           "0x%x, version %u)",
           bs->address, MEP_BS_VERSION, h->magic, h->version);
  return -1;
}

/* Reads a REFUSE or BUSY verdict's proof (if any) and reason. A REFUSE
 * whose proof checks out is rank 0's final word (REFUSED); one without a
 * proof, or with a wrong one, may come from any process that answered on
 * the address (or from rank 0 to a joiner whose token differs), so it is
 * UNPROVEN and retried; a BUSY is retried either way. `why` gets the
 * reason, printable characters only. */
static int knock_reason(const mep_bootstrap_t *bs, int fd, int64_t deadline_ms,
                        const mep_bs_knock_hdr_t *h, const uint8_t *mine,
                        const uint8_t *theirs, char *why, size_t why_len) {
  uint8_t proof[MEP_BS_PROOF_BYTES], want[MEP_BS_PROOF_BYTES];
  char reason[MEP_BS_REASON_MAX];
  if (fd_read(fd, proof, h->proof_len, deadline_ms, why, why_len) != 0 ||
      fd_read(fd, reason, h->body_len, deadline_ms, why, why_len) != 0) {
    return MEP_BS_KNOCK_RETRY;
  }
  int proven = 0;
  if (h->proof_len == MEP_BS_PROOF_BYTES) {
    mep_bs_proof(bs, MEP_BS_PROOF_REFUSAL, mine, theirs, h, reason, want);
    proven = mep_bytes_equal(proof, want, sizeof(want));
  }
  reason[h->body_len] = '\0';
  for (uint32_t i = 0; i < h->body_len; i++) {
    if ((unsigned char)reason[i] < 0x20 || (unsigned char)reason[i] >= 0x7f) reason[i] = '?';
  }
  if (h->type == MEP_BS_KNOCK_BUSY) {
    snprintf(why, why_len, "%s", reason);
    return MEP_BS_KNOCK_RETRY;
  }
  if (proven) {
    snprintf(why, why_len, "%s", reason);
    return MEP_BS_KNOCK_REFUSED;
  }
  snprintf(why, why_len,
           "rank 0 answered: %s (not proven: this rank's job token differs "
           "from rank 0's, or a process other than this group's rank 0 "
           "answered)",
           reason);
  return MEP_BS_KNOCK_UNPROVEN;
}

/* Reads and checks the verdict on the knock sent with nonce `mine` after
 * challenge `theirs`. An admission's body is the group's nonce (kept in
 * bs->group_nonce once proven), then rank 0's worker address. */
static int knock_verdict(mep_bootstrap_t *bs, int fd,
                         int64_t deadline_ms, const uint8_t *mine,
                         const uint8_t *theirs, void *addr, size_t *addr_len,
                         char *why, size_t why_len) {
  mep_bs_knock_hdr_t h;
  if (knock_read_hdr(bs, fd, deadline_ms, &h, why, why_len) != 0) {
    return MEP_BS_KNOCK_RETRY;
  }
  /* REFUSE carries a reason (proven when the knock was), BUSY a reason, OK
   * a proof and rank 0's address. */
  int refuse = h.type == MEP_BS_KNOCK_REFUSE;
  int busy = h.type == MEP_BS_KNOCK_BUSY;
  int ok = h.type == MEP_BS_KNOCK_OK;
  if ((!refuse && !busy && !ok) ||
      ((refuse || busy) && h.body_len > MEP_BS_REASON_MAX - 1) ||
      (refuse && h.proof_len != 0 && h.proof_len != MEP_BS_PROOF_BYTES) ||
      (busy && h.proof_len != 0) ||
      (ok && (h.proof_len != MEP_BS_PROOF_BYTES || h.body_len <= MEP_BS_NONCE_BYTES ||
              h.body_len > MEP_BS_NONCE_BYTES + MEP_BS_ADDR_MAX))) {
    snprintf(why, why_len,
             "the answer at %s is not a verdict (type %u, %u + %u bytes)",
             bs->address, h.type, h.proof_len, h.body_len);
    return MEP_BS_KNOCK_RETRY;
  }
  if (!ok) {
    return knock_reason(bs, fd, deadline_ms, &h, mine, theirs, why, why_len);
  }
  uint8_t proof[MEP_BS_PROOF_BYTES], want[MEP_BS_PROOF_BYTES];
  unsigned char body[MEP_BS_NONCE_BYTES + MEP_BS_ADDR_MAX];
  if (fd_read(fd, proof, sizeof(proof), deadline_ms, why, why_len) != 0 ||
      fd_read(fd, body, h.body_len, deadline_ms, why, why_len) != 0) {
    return MEP_BS_KNOCK_RETRY;
  }
  mep_bs_proof(bs, MEP_BS_PROOF_VERDICT, mine, theirs, &h, body, want);
  if (!mep_bytes_equal(proof, want, sizeof(want))) {
    snprintf(why, why_len,
             "the answer at %s did not prove it holds the job token (a "
             "process other than this group's rank 0, or another token)",
             bs->address);
    return MEP_BS_KNOCK_UNPROVEN;
  }
  memcpy(bs->group_nonce, body, MEP_BS_NONCE_BYTES);
  *addr_len = h.body_len - MEP_BS_NONCE_BYTES;
  memcpy(addr, body + MEP_BS_NONCE_BYTES, *addr_len);
  return MEP_BS_KNOCK_ADMITTED;
}

/* Takes the gate's challenge; 0, or -1 with `why`. */
static int knock_challenge(const mep_bootstrap_t *bs, int fd,
                           int64_t deadline_ms, uint8_t *theirs, char *why,
                           size_t why_len) {
  mep_bs_knock_hdr_t h;
  if (knock_read_hdr(bs, fd, deadline_ms, &h, why, why_len) != 0) return -1;
  if (h.type != MEP_BS_CHALLENGE || h.proof_len != 0 ||
      h.body_len != MEP_BS_NONCE_BYTES) {
    snprintf(why, why_len,
             "the gate at %s did not open with a challenge (type %u, %u + "
             "%u bytes)",
             bs->address, h.type, h.proof_len, h.body_len);
    return -1;
  }
  return fd_read(fd, theirs, MEP_BS_NONCE_BYTES, deadline_ms, why, why_len);
}

int mep_bs_knock(mep_bootstrap_t *bs, int64_t deadline_ms, void *addr,
                 size_t *addr_len, char *why, size_t why_len) {
  int64_t answer_by = mep_bs_now_ms() + KNOCK_ANSWER_MS;
  if (answer_by > deadline_ms) answer_by = deadline_ms;
  int fd = knock_connect(bs, answer_by, why, why_len);
  if (fd < 0) return MEP_BS_KNOCK_RETRY;
  int r = MEP_BS_KNOCK_RETRY;
  uint8_t theirs[MEP_BS_NONCE_BYTES];
  unsigned char rec[MEP_BS_KNOCK_MAX];
  mep_bs_knock_hdr_t h;
  const size_t hdr = sizeof(h), body = MEP_BS_NONCE_BYTES + bs->self_addr_len;
  mep_bs_knock_hdr_init(&h, MEP_BS_KNOCK, bs->rank, bs->world_size,
                        MEP_BS_PROOF_BYTES, body);
  uint8_t *mine = rec + hdr + MEP_BS_PROOF_BYTES;
  if (knock_challenge(bs, fd, answer_by, theirs, why, why_len) != 0) {
    /* why says */
  } else if (mep_bs_nonce(mine) != 0) {
    snprintf(why, why_len, "getrandom: %s", strerror(errno));
  } else {
    memcpy(rec, &h, hdr);
    memcpy(mine + MEP_BS_NONCE_BYTES, bs->self_addr, bs->self_addr_len);
    mep_bs_proof(bs, MEP_BS_PROOF_KNOCK, theirs, mine, &h, mine, rec + hdr);
    if (mep_bs_fd_write(fd, rec, hdr + MEP_BS_PROOF_BYTES + body, answer_by) != 0) {
      snprintf(why, why_len, "rank 0 did not take the knock");
    } else {
      r = knock_verdict(bs, fd, answer_by, mine, theirs, addr, addr_len, why,
                        why_len);
    }
  }
  close(fd);
  return r;
}
