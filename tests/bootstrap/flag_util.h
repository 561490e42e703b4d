// flag_util.h: what the bootstrap test binaries (worker, stranger, knocker)
// share: "--name=value" flags, the machine-wide monotonic clock, and the
// IPv4 "host:port" address flag.
#ifndef MEP_TESTS_BOOTSTRAP_FLAG_UTIL_H_
#define MEP_TESTS_BOOTSTRAP_FLAG_UTIL_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <string>

namespace mep_test {

// CLOCK_MONOTONIC in ms: one clock for every process on the machine, so
// the drivers can compare times the processes report.
inline int64_t MonoNowMs() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

// True when arg is "<name>=<value>"; then *val is the value.
inline bool Flag(const char *arg, const char *name, std::string *val) {
  size_t n = strlen(name);
  if (strncmp(arg, name, n) != 0 || arg[n] != '=') return false;
  *val = arg + n + 1;
  return true;
}

// Parses an IPv4 "host:port" into *a; false when it is not one.
inline bool Ipv4Address(const std::string &address, sockaddr_in *a) {
  memset(a, 0, sizeof(*a));
  a->sin_family = AF_INET;
  size_t colon = address.rfind(':');
  if (colon == std::string::npos ||
      inet_pton(AF_INET, address.substr(0, colon).c_str(), &a->sin_addr) != 1) {
    return false;
  }
  a->sin_port = htons((uint16_t)atoi(address.c_str() + colon + 1));
  return true;
}

}  // namespace mep_test

#endif  // MEP_TESTS_BOOTSTRAP_FLAG_UTIL_H_
