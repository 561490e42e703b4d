/* c99_headers.c: the public headers compile as C99 with -Wall -Werror
 * -pedantic, and the initializer macro works from C. */
#include "moe_ep.h"
#include "moe_ep_loader.h"

int moe_ep_c99_probe(void);

int moe_ep_c99_probe(void) {
  moe_ep_group_params_t params = MOE_EP_INIT(moe_ep_group_params_t);
  moe_ep_dispatch_params_t dispatch = MOE_EP_INIT(moe_ep_dispatch_params_t);
  const moe_ep_plugin_v1_t *table = NULL;
  char err[64];
  moe_ep_handle_layout_params_t layout = MOE_EP_INIT(moe_ep_handle_layout_params_t);
  void *lib = moe_ep_load("/nonexistent/libmoe_ep.so", &table, err, sizeof err);
  moe_ep_hook_t *busy = NULL;
  moe_ep_status_t st = moe_ep_call_handle_layout(table, NULL, &layout);
  st = (moe_ep_status_t)(st + moe_ep_call_group_busy_hook(table, NULL, &busy));
  moe_ep_unload(lib);
  return (int)(params.struct_size + dispatch.struct_size) + (table != NULL) + (int)st;
}
