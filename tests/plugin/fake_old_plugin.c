/* fake_old_plugin.c: a library whose v1 table is too small (an older,
 * truncated table), so the loader must refuse it. */
#include "moe_ep.h"

__attribute__((visibility("default"))) const moe_ep_plugin_v1_t moe_ep_plugin_v1 = {
    .struct_size = 24, /* up to `name` only */
    .abi_version = MOE_EP_ABI_VERSION,
    .name = "old",
};
