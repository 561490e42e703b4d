/* fake_v02_plugin.c: a library built against 0.2: its v1 table ends at
 * handle_free (the exported symbol is exactly that many bytes), so a loader
 * must accept it and report the entries appended since as absent. */
#include <stddef.h>
#include <string.h>

#include "moe_ep.h"

#define V02_TABLE_BYTES offsetof(moe_ep_plugin_v1_t, handle_layout)

__attribute__((visibility("default"))) unsigned char moe_ep_plugin_v1[V02_TABLE_BYTES];

static moe_ep_status_t v02_get_version(int *major, int *minor, int *patch) {
  *major = 0;
  *minor = 2;
  *patch = 0;
  return MOE_EP_OK;
}

/* Stands in for every other entry: the tests only load the table (the
 * loader refuses NULL entries) and call get_version. */
static void v02_not_called(void) {}

__attribute__((constructor)) static void fill_table(void) {
  moe_ep_plugin_v1_t t;
  memset(&t, 0, sizeof t);
  t.struct_size = V02_TABLE_BYTES;
  t.abi_version = MOE_EP_ABI_VERSION;
  t.name = "moe_ep";
  /* get_version .. handle_free, one function pointer each. */
  void (*stub)(void) = v02_not_called;
  char *entries = (char *)&t + offsetof(moe_ep_plugin_v1_t, get_version);
  size_t n = offsetof(moe_ep_plugin_v1_t, handle_layout) - offsetof(moe_ep_plugin_v1_t, get_version);
  for (size_t off = 0; off < n; off += sizeof stub) memcpy(entries + off, &stub, sizeof stub);
  t.get_version = v02_get_version;
  memcpy(moe_ep_plugin_v1, &t, V02_TABLE_BYTES);
}
