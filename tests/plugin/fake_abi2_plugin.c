/* fake_abi2_plugin.c: a whole v1-sized table that reports another ABI
 * version (a later, incompatible library): the loader must refuse it by
 * that number, whatever else the table holds. */
#include "moe_ep.h"

__attribute__((visibility("default"))) const moe_ep_plugin_v1_t moe_ep_plugin_v1 = {
    .struct_size = sizeof(moe_ep_plugin_v1_t),
    .abi_version = MOE_EP_ABI_VERSION + 1,
    .name = "abi2",
};
