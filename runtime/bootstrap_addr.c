/* bootstrap_addr.c: the bootstrap address ("host:port", "[v6]:port"):
 * parsing and resolution, and the printed form of a socket address. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

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

size_t mep_bs_addr_host(const struct sockaddr_storage *a, uint8_t host[16]) {
  if (a->ss_family == AF_INET) {
    memcpy(host, &((const struct sockaddr_in *)a)->sin_addr, 4);
    return 4;
  }
  if (a->ss_family == AF_INET6) {
    const struct in6_addr *v6 = &((const struct sockaddr_in6 *)a)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(v6)) { /* ::ffff:a.b.c.d is the IPv4 host */
      memcpy(host, v6->s6_addr + 12, 4);
      return 4;
    }
    /* One machine may take any number of addresses in its /64. */
    memcpy(host, v6->s6_addr, 8);
    return 8;
  }
  return 0;
}

void mep_bs_addr_name(const struct sockaddr_storage *a, char *buf,
                      size_t len) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (a->ss_family == AF_INET) {
    const struct sockaddr_in *v4 = (const struct sockaddr_in *)a;
    inet_ntop(AF_INET, &v4->sin_addr, host, sizeof(host));
    snprintf(buf, len, "%s:%d", host, ntohs(v4->sin_port));
  } else if (a->ss_family == AF_INET6) {
    const struct sockaddr_in6 *v6 = (const struct sockaddr_in6 *)a;
    inet_ntop(AF_INET6, &v6->sin6_addr, host, sizeof(host));
    snprintf(buf, len, "[%s]:%d", host, ntohs(v6->sin6_port));
  } else {
    snprintf(buf, len, "an address of family %d", a->ss_family);
  }
}
