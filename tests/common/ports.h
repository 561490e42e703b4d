// ports.h: loopback ports for multi-process tests (the launcher's picker,
// tools/launcher/loopback_port.h, under the tests' namespace).
#ifndef MEP_TESTS_COMMON_PORTS_H_
#define MEP_TESTS_COMMON_PORTS_H_

#include "tools/launcher/loopback_port.h"

namespace moe_ep_test {

using moe_ep::ephemeral_port_low;
using moe_ep::free_loopback_port;
using moe_ep::kFreePortLow;

}  // namespace moe_ep_test

#endif  // MEP_TESTS_COMMON_PORTS_H_
