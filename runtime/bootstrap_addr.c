/* bootstrap_addr.c: the bootstrap address ("host:port", "[v6]:port"):
 * parsing and resolution, the bind check rank 0 does before listening, and
 * the plain TCP probe joiners use before handing the address to UCX. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "runtime/bootstrap_types.h"
#include "runtime/error.h"

moe_ep_status_t mep_bs_addr_parse(const char *address,
                                  struct sockaddr_storage *out,
                                  socklen_t *out_len) {
  if (address == NULL || address[0] == '\0') {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "bootstrap address is empty; expected \"host:port\"");
  }
  size_t n = strlen(address);
  if (n >= MOE_EP_ADDRESS_MAX) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "bootstrap address is %zu characters; at most %d allowed",
                     n, MOE_EP_ADDRESS_MAX - 1);
  }
  char host[MOE_EP_ADDRESS_MAX];
  const char *colon = strrchr(address, ':');
  if (colon == NULL || colon == address || colon[1] == '\0') {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "bootstrap address \"%s\" is not \"host:port\"", address);
  }
  const char *port = colon + 1;
  size_t hlen = (size_t)(colon - address);
  memcpy(host, address, hlen);
  host[hlen] = '\0';
  /* "[::1]:port": brackets keep the v6 colons apart from the port. */
  if (host[0] == '[') {
    if (hlen < 3 || host[hlen - 1] != ']') {
      return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                       "bootstrap address \"%s\": unbalanced '[' in host",
                       address);
    }
    memmove(host, host + 1, hlen - 2);
    host[hlen - 2] = '\0';
  } else if (strchr(host, ':') != NULL) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "bootstrap address \"%s\": write an IPv6 host as "
                     "\"[addr]:port\"",
                     address);
  }
  char *end = NULL;
  errno = 0;
  long p = strtol(port, &end, 10);
  if (errno != 0 || end == port || *end != '\0' || p < 1 || p > 65535) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "bootstrap address \"%s\": port \"%s\" is not a number "
                     "in 1..65535",
                     address, port);
  }
  struct addrinfo hints;
  memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  struct addrinfo *res = NULL;
  int rc = getaddrinfo(host, port, &hints, &res);
  if (rc != 0 || res == NULL) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "bootstrap address \"%s\": cannot resolve host \"%s\" "
                     "(%s)",
                     address, host, rc != 0 ? gai_strerror(rc) : "no result");
  }
  memset(out, 0, sizeof(*out));
  memcpy(out, res->ai_addr, res->ai_addrlen);
  *out_len = res->ai_addrlen;
  freeaddrinfo(res);
  return MOE_EP_OK;
}

moe_ep_status_t mep_bs_addr_check_bindable(const mep_bootstrap_t *bs) {
  int fd = socket(bs->saddr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return mep_error(MOE_EP_ERR_BOOTSTRAP,
                     "cannot listen on %s: socket: %s", bs->address,
                     strerror(errno));
  }
  /* Same option UCX sets, so a port in TIME_WAIT passes here and there. */
  int one = 1;
  (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, (const struct sockaddr *)&bs->saddr, bs->saddr_len) != 0) {
    int err = errno;
    close(fd);
    return mep_error(MOE_EP_ERR_BOOTSTRAP,
                     "rank 0 cannot listen on bootstrap address %s: bind: %s "
                     "(errno %d)%s",
                     bs->address, strerror(err), err,
                     err == EADDRINUSE
                         ? "; another group or program holds the port, or a group "
                           "destroyed in the last minute left its connections in TCP "
                           "TIME_WAIT (UCX's listener does not set SO_REUSEADDR): give "
                           "each group its own port"
                         : "");
  }
  /* bind alone succeeds when another socket holds the port with
   * SO_REUSEADDR and is listening; listen() is what collides. */
  if (listen(fd, 1) != 0) {
    int err = errno;
    close(fd);
    return mep_error(MOE_EP_ERR_BOOTSTRAP,
                     "rank 0 cannot listen on bootstrap address %s: listen: "
                     "%s (errno %d)",
                     bs->address, strerror(err), err);
  }
  close(fd);
  return MOE_EP_OK;
}

int mep_bs_addr_probe(const mep_bootstrap_t *bs, int wait_ms) {
  int fd = socket(bs->saddr.ss_family,
                  SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  int ok = 0;
  if (connect(fd, (const struct sockaddr *)&bs->saddr, bs->saddr_len) == 0) {
    ok = 1;
  } else if (errno == EINPROGRESS) {
    struct pollfd pfd = {.fd = fd, .events = POLLOUT, .revents = 0};
    if (poll(&pfd, 1, wait_ms) == 1) {
      int err = 0;
      socklen_t len = sizeof(err);
      if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) {
        ok = 1;
      }
    }
  }
  close(fd);
  return ok;
}
