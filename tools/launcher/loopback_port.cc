// loopback_port.cc: loopback ports for local multi-process jobs.
#include "tools/launcher/loopback_port.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>

namespace moe_ep {
namespace {

// Binds `port` on loopback (0: any) and returns the bound port, or -1.
int bind_loopback(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a;
  std::memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof a;
  int got = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    got = ntohs(a.sin_port);
  }
  close(fd);
  return got;
}

}  // namespace

int ephemeral_port_low() {
  int lo = 32768, hi = 0;
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%d %d", &lo, &hi) != 2) lo = 32768;
    std::fclose(f);
  }
  return lo;
}

bool loopback_port_range_has_room() { return ephemeral_port_low() - 1 - kFreePortLow >= 100; }

int free_loopback_port() {
  const int top = ephemeral_port_low() - 1;
  if (loopback_port_range_has_room()) {
    // One sequence per process: two calls within a clock tick differ.
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    static uint32_t seed = static_cast<uint32_t>(getpid()) * 2654435761u ^
                           static_cast<uint32_t>(ts.tv_nsec);
    for (int i = 0; i < 1000; i++) {
      seed = seed * 1664525u + 1013904223u;
      const int p = kFreePortLow + static_cast<int>((seed >> 8) % static_cast<uint32_t>(top - kFreePortLow));
      if (bind_loopback(p) == p) return p;
    }
  }
  return bind_loopback(0);
}

}  // namespace moe_ep
