/* bootstrap_knock.c: the gate's records on the wire and a joiner's knock:
 * connect to rank 0's bootstrap address, present rank, world size, job
 * token and this worker's UCX address, and read rank 0's verdict. Every
 * step is bounded by the caller's deadline and by the record sizes. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "runtime/bootstrap_types.h"

/* One attempt (connect, knock, verdict) takes this long at most: rank 0
 * answers or closes within MEP_BS_KNOCK_WAIT_MS of reading, so a longer
 * silence is a busy gate or not rank 0, and the next attempt starts over. */
#define KNOCK_ANSWER_MS 10000

void mep_bs_knock_hdr_init(mep_bs_knock_hdr_t *h, int type, int rank,
                           int world_size, size_t token_len, size_t body_len) {
  memset(h, 0, sizeof(*h));
  h->magic = MEP_BS_KNOCK_MAGIC;
  h->version = MEP_BS_VERSION;
  h->type = (uint16_t)type;
  h->rank = rank;
  h->world_size = world_size;
  h->token_len = (uint32_t)token_len;
  h->body_len = (uint32_t)body_len;
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
      snprintf(why, why_len, "reading rank 0's verdict: %s", strerror(errno));
      return -1;
    }
    if (mep_bs_now_ms() >= deadline_ms) {
      snprintf(why, why_len, "no verdict from rank 0");
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

/* Reads and checks the verdict record. */
static int knock_verdict(const mep_bootstrap_t *bs, int fd,
                         int64_t deadline_ms, void *addr, size_t *addr_len,
                         char *why, size_t why_len) {
  mep_bs_knock_hdr_t h;
  if (fd_read(fd, &h, sizeof(h), deadline_ms, why, why_len) != 0) {
    return MEP_BS_KNOCK_RETRY;
  }
  /* REFUSE and BUSY carry a reason, OK rank 0's worker address. */
  int refuse = h.type == MEP_BS_KNOCK_REFUSE || h.type == MEP_BS_KNOCK_BUSY;
  size_t max = refuse ? MEP_BS_REASON_MAX - 1 : MEP_BS_ADDR_MAX;
  if (h.magic != MEP_BS_KNOCK_MAGIC || h.version != MEP_BS_VERSION ||
      (h.type != MEP_BS_KNOCK_OK && !refuse) || h.token_len != 0 ||
      h.body_len > max || (!refuse && h.body_len == 0)) {
    /* Some other program on the port, or another protocol version. */
    snprintf(why, why_len,
             "the answer at %s is not a moe-ep verdict of version %u (magic "
             "0x%x, version %u, type %u, %u bytes)",
             bs->address, MEP_BS_VERSION, h.magic, h.version, h.type,
             h.body_len);
    return MEP_BS_KNOCK_RETRY;
  }
  char reason[MEP_BS_REASON_MAX];
  void *body = refuse ? (void *)reason : addr;
  if (fd_read(fd, body, h.body_len, deadline_ms, why, why_len) != 0) {
    return MEP_BS_KNOCK_RETRY;
  }
  if (refuse) {
    reason[h.body_len] = '\0';
    snprintf(why, why_len, "%s", reason);
    return h.type == MEP_BS_KNOCK_BUSY ? MEP_BS_KNOCK_RETRY : MEP_BS_KNOCK_REFUSED;
  }
  *addr_len = h.body_len;
  return MEP_BS_KNOCK_ADMITTED;
}

int mep_bs_knock(mep_bootstrap_t *bs, int64_t deadline_ms, void *addr,
                 size_t *addr_len, char *why, size_t why_len) {
  int64_t answer_by = mep_bs_now_ms() + KNOCK_ANSWER_MS;
  if (answer_by > deadline_ms) answer_by = deadline_ms;
  int fd = knock_connect(bs, answer_by, why, why_len);
  if (fd < 0) return MEP_BS_KNOCK_RETRY;
  size_t token_len = strlen(bs->token);
  unsigned char rec[MEP_BS_KNOCK_MAX];
  mep_bs_knock_hdr_t h;
  mep_bs_knock_hdr_init(&h, MEP_BS_KNOCK, bs->rank, bs->world_size, token_len,
                        bs->self_addr_len);
  memcpy(rec, &h, sizeof(h));
  memcpy(rec + sizeof(h), bs->token, token_len);
  memcpy(rec + sizeof(h) + token_len, bs->self_addr, bs->self_addr_len);
  size_t len = sizeof(h) + token_len + bs->self_addr_len;
  int r = MEP_BS_KNOCK_RETRY;
  if (mep_bs_fd_write(fd, rec, len, answer_by) != 0) {
    snprintf(why, why_len, "rank 0 did not take the knock");
  } else {
    r = knock_verdict(bs, fd, answer_by, addr, addr_len, why, why_len);
  }
  close(fd);
  return r;
}
