// loopback_port.h: loopback ports for local multi-process jobs (the
// launcher's bootstrap address, the multi-process tests' groups).
#ifndef MEP_TOOLS_LAUNCHER_LOOPBACK_PORT_H_
#define MEP_TOOLS_LAUNCHER_LOOPBACK_PORT_H_

namespace moe_ep {

// A loopback port that binds right now, picked below the kernel's
// ephemeral range: the local end of a connection another process opens
// later (a rank's NCCL or UCX connections, another test) cannot take it,
// as it could a port bind(0) reported free before the group listens on
// it. Falls back to bind(0) where that range leaves no room below it.
int free_loopback_port();

// Whether [kFreePortLow, ephemeral_port_low()) leaves free_loopback_port
// room to pick from (else it falls back to bind(0)).
bool loopback_port_range_has_room();

// free_loopback_port (and the Python tests' free_ports) draw from here up
// to the ephemeral range. [10000, kFreePortLow) belongs to
// conformance_test's scenarios, which pick their ports ahead of use.
constexpr int kFreePortLow = 20000;

// The lowest port the kernel hands out to connections on its own
// (/proc/sys/net/ipv4/ip_local_port_range; 32768 if unreadable).
int ephemeral_port_low();

}  // namespace moe_ep

#endif  // MEP_TOOLS_LAUNCHER_LOOPBACK_PORT_H_
