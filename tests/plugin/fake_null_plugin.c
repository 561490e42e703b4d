/* fake_null_plugin.c: a table of the current size whose combine entry is
 * NULL: the loader must refuse it naming the entry, not hand the engine a
 * table that crashes on its first combine. */
#include <stddef.h>
#include <string.h>

#include "moe_ep.h"

__attribute__((visibility("default"))) moe_ep_plugin_v1_t moe_ep_plugin_v1;

static void null_not_called(void) {}

__attribute__((constructor)) static void fill_table(void) {
  moe_ep_plugin_v1_t t;
  memset(&t, 0, sizeof t);
  t.struct_size = sizeof t;
  t.abi_version = MOE_EP_ABI_VERSION;
  t.name = "moe_ep";
  void (*stub)(void) = null_not_called;
  char *entries = (char *)&t + offsetof(moe_ep_plugin_v1_t, get_version);
  for (size_t off = 0; off + sizeof stub <= sizeof t - offsetof(moe_ep_plugin_v1_t, get_version);
       off += sizeof stub) {
    memcpy(entries + off, &stub, sizeof stub);
  }
  t.combine = NULL;
  memcpy(&moe_ep_plugin_v1, &t, sizeof t);
}
