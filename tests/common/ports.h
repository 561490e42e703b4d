// ports.h: loopback ports for multi-process tests.
#ifndef MEP_TESTS_COMMON_PORTS_H_
#define MEP_TESTS_COMMON_PORTS_H_

namespace moe_ep_test {

// A loopback port that binds right now, picked below the kernel's
// ephemeral range: the local end of a connection another test process
// opens later cannot take it, as it could a port bind(0) reported free
// (bazel runs test processes side by side). Falls back to bind(0) where
// that range leaves no room below it.
int free_loopback_port();

// free_loopback_port (and the Python tests' free_ports) draw from here up
// to the ephemeral range. [10000, kFreePortLow) belongs to
// conformance_test's scenarios, which pick their ports ahead of use.
constexpr int kFreePortLow = 20000;

// The lowest port the kernel hands out to connections on its own
// (/proc/sys/net/ipv4/ip_local_port_range; 32768 if unreadable).
int ephemeral_port_low();

}  // namespace moe_ep_test

#endif  // MEP_TESTS_COMMON_PORTS_H_
