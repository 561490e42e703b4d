/* fake_short_plugin.c: the exported moe_ep_plugin_v1 is 8 bytes, its
 * struct_size only: the loader must refuse it by size without reading the
 * abi_version that lies past the object. */
#include <stddef.h>
#include <stdint.h>

__attribute__((visibility("default"))) const size_t moe_ep_plugin_v1 = 8;
__attribute__((visibility("default"))) const uint32_t moe_ep_fake_next = 7u;
