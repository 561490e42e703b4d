// bootstrap_unit_test.cc: single-process checks of the bootstrap: argument
// and address validation, a port already in use, and a world of one (no
// network, local collectives, the UCX context and worker exposed).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/bootstrap.h"
#include "runtime/error.h"
extern "C" {
#include "runtime/bootstrap_types.h"
}

namespace {

mep_bootstrap_params_t Params(int rank, int world, const char *addr) {
  mep_bootstrap_params_t p;
  p.rank = rank;
  p.world_size = world;
  p.address = addr;
  p.timeout_ms = 1000;
  p.token = "unit-test-job-token";
  return p;
}

TEST(BootstrapArgs, RejectsBadArgumentsNamingThem) {
  mep_bootstrap_t *bs = nullptr;
  EXPECT_EQ(mep_bootstrap_create(nullptr, &bs), MOE_EP_ERR_INVALID_ARGUMENT);
  struct Case {
    mep_bootstrap_params_t p;
    const char *needle;
  } cases[] = {
      {Params(0, 0, "127.0.0.1:1"), "world_size 0"},
      {Params(2, 2, "127.0.0.1:1"), "rank 2 is outside 0..1"},
      {Params(-1, 2, "127.0.0.1:1"), "rank -1"},
      {Params(0, 2, "localhost"), "\"localhost\" is not \"host:port\""},
      {Params(0, 2, "127.0.0.1:0"), "port \"0\""},
      {Params(0, 2, "127.0.0.1:http"), "port \"http\""},
      {Params(0, 2, "::1:5000"), "[addr]:port"},
      {Params(0, 2, ""), "empty"},
      {Params(0, 2, nullptr), "empty"},
  };
  for (const Case &c : cases) {
    bs = nullptr;
    EXPECT_EQ(mep_bootstrap_create(&c.p, &bs), MOE_EP_ERR_INVALID_ARGUMENT)
        << c.needle;
    EXPECT_EQ(bs, nullptr);
    EXPECT_NE(std::string(mep_last_error()).find(c.needle), std::string::npos)
        << "expected '" << c.needle << "' in: " << mep_last_error();
  }
  mep_bootstrap_params_t p = Params(0, 2, "127.0.0.1:1");
  p.timeout_ms = 0;
  EXPECT_EQ(mep_bootstrap_create(&p, &bs), MOE_EP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(mep_last_error()).find("timeout_ms 0"),
            std::string::npos)
      << mep_last_error();
}

// What only one rank gets wrong (its own address string, a token from its
// environment) is named with that rank.
TEST(BootstrapArgs, OneRanksOwnArgumentsNameTheRank) {
  mep_bootstrap_t *bs = nullptr;
  mep_bootstrap_params_t p = Params(1, 2, "no-such-host.invalid:5000");
  EXPECT_EQ(mep_bootstrap_create(&p, &bs), MOE_EP_ERR_INVALID_ARGUMENT);
  std::string msg = mep_last_error();
  EXPECT_EQ(msg.rfind("rank 1: ", 0), 0u) << msg;
  EXPECT_NE(msg.find("cannot resolve host \"no-such-host.invalid\""), std::string::npos) << msg;
  const std::string long_token(300, 'k');
  p = Params(1, 2, "127.0.0.1:1");
  p.token = long_token.c_str();
  EXPECT_EQ(mep_bootstrap_create(&p, &bs), MOE_EP_ERR_INVALID_ARGUMENT);
  msg = mep_last_error();
  EXPECT_EQ(msg.rfind("rank 1: bootstrap_create: token is 300 characters", 0), 0u) << msg;
  // More than one rank: no token, no group (the gate could not tell a rank
  // from an outsider).
  for (const char *none : {"", static_cast<const char *>(nullptr)}) {
    p = Params(1, 2, "127.0.0.1:1");
    p.token = none;
    EXPECT_EQ(mep_bootstrap_create(&p, &bs), MOE_EP_ERR_INVALID_ARGUMENT);
    msg = mep_last_error();
    EXPECT_EQ(msg.rfind("rank 1: bootstrap_create: token is empty; a group of 2 ranks", 0), 0u)
        << msg;
  }
  // Nor a token short enough to be guessed offline; a group of one takes any.
  p = Params(1, 2, "127.0.0.1:1");
  p.token = "fifteen-chars!!";
  EXPECT_EQ(mep_bootstrap_create(&p, &bs), MOE_EP_ERR_INVALID_ARGUMENT);
  msg = mep_last_error();
  EXPECT_EQ(msg.rfind("rank 1: bootstrap_create: token is 15 characters; a group of 2 ranks "
                      "needs at least 16",
                      0),
            0u)
      << msg;
}

TEST(BootstrapArgs, PortInUseIsBootstrapErrorNamingAddress) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  ASSERT_EQ(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
  ASSERT_EQ(listen(fd, 4), 0);
  ASSERT_EQ(getsockname(fd, (struct sockaddr *)&a, &len), 0);
  std::string addr = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  mep_bootstrap_params_t p = Params(0, 2, addr.c_str());
  mep_bootstrap_t *bs = nullptr;
  EXPECT_EQ(mep_bootstrap_create(&p, &bs), MOE_EP_ERR_BOOTSTRAP);
  std::string msg = mep_last_error();
  EXPECT_NE(msg.find(addr), std::string::npos) << msg;
  EXPECT_NE(msg.find("Address already in use"), std::string::npos) << msg;
  close(fd);
}

TEST(BootstrapSingleRank, CollectivesAreLocalCopies) {
  mep_bootstrap_params_t p = Params(0, 1, nullptr);
  mep_bootstrap_t *bs = nullptr;
  ASSERT_EQ(mep_bootstrap_create(&p, &bs), MOE_EP_OK) << mep_last_error();
  EXPECT_EQ(mep_bootstrap_rank(bs), 0);
  EXPECT_EQ(mep_bootstrap_world_size(bs), 1);
  std::vector<unsigned char> send(100), recv(100, 0);
  for (size_t i = 0; i < send.size(); i++) send[i] = (unsigned char)(i * 7);
  ASSERT_EQ(mep_bootstrap_allgather(bs, send.data(), recv.data(), 100),
            MOE_EP_OK);
  EXPECT_EQ(send, recv);
  EXPECT_EQ(mep_bootstrap_broadcast(bs, recv.data(), 100, 0), MOE_EP_OK);
  EXPECT_EQ(send, recv);
  EXPECT_EQ(mep_bootstrap_barrier(bs), MOE_EP_OK);
  EXPECT_EQ(mep_bootstrap_broadcast(bs, recv.data(), 100, 1),
            MOE_EP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(mep_last_error()).find("root 1"), std::string::npos)
      << mep_last_error();
  EXPECT_EQ(mep_bootstrap_allgather(bs, nullptr, recv.data(), 4),
            MOE_EP_ERR_INVALID_ARGUMENT);
  // Rank 0 bounds what a connection may queue, so the collectives are
  // bounded too: 64 KiB per rank passes, one byte more is refused, naming
  // the size and the bound, and the group stays usable.
  std::vector<unsigned char> big(64 * 1024 + 1, 3), big_out(64 * 1024 + 1, 0);
  EXPECT_EQ(mep_bootstrap_allgather(bs, big.data(), big_out.data(), 65536),
            MOE_EP_OK);
  EXPECT_EQ(mep_bootstrap_allgather(bs, big.data(), big_out.data(), 65537),
            MOE_EP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(mep_last_error()).find("bytes 65537 exceeds"),
            std::string::npos)
      << mep_last_error();
  EXPECT_NE(std::string(mep_last_error()).find("65536 bytes"),
            std::string::npos)
      << mep_last_error();
  EXPECT_EQ(mep_bootstrap_broadcast(bs, big.data(), 65537, 0),
            MOE_EP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(mep_last_error()).find("broadcast: bytes 65537"),
            std::string::npos)
      << mep_last_error();
  EXPECT_EQ(mep_bootstrap_barrier(bs), MOE_EP_OK);
  mep_bootstrap_destroy(bs);
  mep_bootstrap_destroy(nullptr);  // accepted
  EXPECT_EQ(mep_bootstrap_barrier(nullptr), MOE_EP_ERR_INVALID_ARGUMENT);
}

// Which gate slot a new connection takes when all are in use: the oldest
// of the host holding the most (the newcomer counted with its own host), so
// a flood from one host replaces only its own connections.
std::vector<mep_bs_knocker_t> Slots(const std::vector<std::pair<uint8_t, int64_t>> &hosts_ms) {
  std::vector<mep_bs_knocker_t> slots(hosts_ms.size());
  for (size_t i = 0; i < slots.size(); i++) {
    slots[i].fd = 100 + (int)i;
    slots[i].host_len = 4;
    const uint8_t host[4] = {127, 0, 0, hosts_ms[i].first};
    memcpy(slots[i].host, host, 4);
    slots[i].accepted_ms = hosts_ms[i].second;
  }
  return slots;
}

int Victim(const std::vector<mep_bs_knocker_t> &slots, uint8_t newcomer) {
  const uint8_t host[4] = {127, 0, 0, newcomer};
  return mep_bs_gate_victim(slots.data(), (int)slots.size(), host, 4);
}

// A host is its IPv4 address, or its IPv6 address's /64; an IPv4-mapped
// IPv6 address is the IPv4 host.
TEST(BootstrapGate, HostIsTheIpv4AddressOrTheIpv6Slash64) {
  auto v6 = [](const char *text) {
    sockaddr_storage a = {};
    auto *s = reinterpret_cast<sockaddr_in6 *>(&a);
    s->sin6_family = AF_INET6;
    EXPECT_EQ(inet_pton(AF_INET6, text, &s->sin6_addr), 1) << text;
    uint8_t host[16] = {};
    const size_t n = mep_bs_addr_host(&a, host);
    return std::vector<uint8_t>(host, host + n);
  };
  sockaddr_storage a = {};
  auto *s4 = reinterpret_cast<sockaddr_in *>(&a);
  s4->sin_family = AF_INET;
  inet_pton(AF_INET, "10.1.2.3", &s4->sin_addr);
  uint8_t host[16];
  ASSERT_EQ(mep_bs_addr_host(&a, host), 4u);
  EXPECT_EQ(std::vector<uint8_t>(host, host + 4), (std::vector<uint8_t>{10, 1, 2, 3}));
  EXPECT_EQ(v6("::ffff:10.1.2.3"), (std::vector<uint8_t>{10, 1, 2, 3}));
  EXPECT_EQ(v6("2001:db8:1:2::1"), v6("2001:db8:1:2:ffff:1:2:3")) << "one /64, one host";
  EXPECT_NE(v6("2001:db8:1:2::1"), v6("2001:db8:1:3::1"));
  EXPECT_EQ(v6("2001:db8:1:2::1").size(), 8u);
}

TEST(BootstrapGate, FullSlotsGiveUpTheBusiestHostsOldest) {
  // A joiner from .1 (the oldest connection) among a flood from .2.
  std::vector<std::pair<uint8_t, int64_t>> flood = {{1, 5}};
  for (int i = 0; i < 63; i++) flood.push_back({2, 10 + i});
  auto slots = Slots(flood);
  EXPECT_EQ(Victim(slots, 2), 1) << "the flood's next connection replaces its own oldest";
  EXPECT_EQ(Victim(slots, 3), 1) << "a third host's too";
  EXPECT_EQ(Victim(slots, 1), 1) << "the joiner's second connection still does not evict it";
  // Every host one slot: the oldest goes.
  auto spread = Slots({{1, 30}, {2, 20}, {3, 40}, {4, 25}});
  EXPECT_EQ(Victim(spread, 9), 1);
  // The newcomer counts with its host: two hosts of two, the newcomer's
  // host then holds three and gives up its own oldest, though the other
  // host's is older.
  auto two = Slots({{1, 10}, {2, 5}, {1, 30}, {2, 6}});
  EXPECT_EQ(Victim(two, 1), 0);
  EXPECT_EQ(Victim(two, 2), 1);
  // Equal counts: the older of the two hosts' oldest.
  EXPECT_EQ(Victim(two, 3), 1);
}

}  // namespace
