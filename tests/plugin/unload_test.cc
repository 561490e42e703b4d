// unload_test.cc: an engine that unloads libmoe_ep.so (moe_ep_unload, a
// dlclose) after using a group keeps running its own UCX. The library left
// a log handler with UCX (its progress sends UCX's lines to its logger),
// which UCX calls for every line of the process from then on: the library
// must stay mapped, or the engine's next UCX warning runs unmapped code.
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include <gtest/gtest.h>
#include <ucp/api/ucp.h>
#include <ucs/debug/log_def.h>

#include "moe_ep.h"
#include "moe_ep_loader.h"
#include "tests/common/ports.h"
#include "tests/common/spawn.h"

namespace {

ucs_status_t Ignore(void *, const void *, size_t, void *, size_t, const ucp_am_recv_param_t *) {
  return UCS_OK;
}

// UCX's warnings about the unhandled id, seen by a handler of the test's
// own: pushed last, it runs first and passes each line on to the
// library's handler (and UCX's printer) behind it.
int g_warned = 0;
ucs_log_func_rc_t Count(const char *, unsigned, const char *, ucs_log_level_t,
                        const ucs_log_component_config_t *, const char *message, va_list) {
  g_warned += std::string(message).find("Active Message") != std::string::npos;
  return UCS_LOG_FUNC_RC_CONTINUE;
}

int Mappings(const char *name) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (f == nullptr) return -1;
  char line[1024];
  int n = 0;
  while (fgets(line, sizeof line, f) != nullptr) n += strstr(line, name) != nullptr;
  fclose(f);
  return n;
}

// One group of one rank on the host backend, created and destroyed.
void UseAGroup(const moe_ep_plugin_v1_t *api) {
  const std::string yaml =
      "moe_ep:\n  backend: host\n  mode: low_latency\n  num_experts: 8\n  hidden: 256\n"
      "  top_k: 4\n  max_tokens_per_rank: 16\n  bootstrap:\n    address: 127.0.0.1:" +
      std::to_string(moe_ep_test::free_loopback_port()) + "\n";
  moe_ep_config_t *cfg = nullptr;
  ASSERT_EQ(api->config_from_yaml(yaml.c_str(), &cfg), MOE_EP_OK) << api->last_error();
  moe_ep_group_params_t gp = moe_ep_group_params_init();
  gp.config = cfg;
  gp.rank = 0;
  gp.world_size = 1;
  moe_ep_group_t *g = nullptr;
  ASSERT_EQ(api->group_create(&gp, &g), MOE_EP_OK) << "rank 0: " << api->last_error();
  api->config_free(cfg);
  ASSERT_EQ(api->group_destroy(g), MOE_EP_OK) << "rank 0: " << api->last_error();
}

TEST(Unload, EnginesUcxAfterTheLibraryIsUnloaded) {
  const std::string path = moe_ep_test::runfile("plugin/libmoe_ep.so");
  const moe_ep_plugin_v1_t *api = nullptr;
  char err[512];
  void *lib = moe_ep_load(path.c_str(), &api, err, sizeof err);
  ASSERT_NE(lib, nullptr) << err;
  UseAGroup(api);
  moe_ep_unload(lib);
  EXPECT_GT(Mappings("libmoe_ep.so"), 0) << "the library was unmapped under UCX's log handler";

  // The engine's own UCX: an active message of an id no handler takes
  // makes UCX log a warning, through every handler it holds.
  ucp_params_t cp = {};
  cp.field_mask = UCP_PARAM_FIELD_FEATURES;
  cp.features = UCP_FEATURE_AM;
  ucp_context_h ctx;
  ASSERT_EQ(ucp_init(&cp, nullptr, &ctx), UCS_OK);
  ucp_worker_params_t wp = {};
  ucp_worker_h a, b;
  ASSERT_EQ(ucp_worker_create(ctx, &wp, &a), UCS_OK);
  ASSERT_EQ(ucp_worker_create(ctx, &wp, &b), UCS_OK);
  ucp_am_handler_param_t ap = {};
  ap.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB;
  ap.id = 1;
  ap.cb = Ignore;
  ASSERT_EQ(ucp_worker_set_am_recv_handler(b, &ap), UCS_OK);
  ucp_address_t *addr;
  size_t len;
  ASSERT_EQ(ucp_worker_get_address(b, &addr, &len), UCS_OK);
  ucp_ep_params_t ep = {};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
  ep.address = addr;
  ucp_ep_h e;
  ASSERT_EQ(ucp_ep_create(a, &ep, &e), UCS_OK);
  ucp_request_param_t rp = {};
  void *r = ucp_am_send_nbx(e, 7, "x", 1, nullptr, 0, &rp);
  ASSERT_FALSE(UCS_PTR_IS_ERR(r));
  ucs_log_push_handler(Count);
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (g_warned == 0 && std::chrono::steady_clock::now() < end) {
    ucp_worker_progress(a);
    ucp_worker_progress(b);
  }
  ucs_log_pop_handler();
  EXPECT_GT(g_warned, 0) << "UCX never warned, so its handlers were not called";
  if (UCS_PTR_IS_PTR(r)) ucp_request_free(r);
  ucp_worker_release_address(b, addr);
  ucp_request_param_t cl = {};
  cl.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  cl.flags = UCP_EP_CLOSE_FLAG_FORCE;
  void *c = ucp_ep_close_nbx(e, &cl);
  while (UCS_PTR_IS_PTR(c) && ucp_request_check_status(c) == UCS_INPROGRESS) ucp_worker_progress(a);
  if (UCS_PTR_IS_PTR(c)) ucp_request_free(c);
  ucp_worker_destroy(a);
  ucp_worker_destroy(b);
  ucp_cleanup(ctx);
}

}  // namespace
