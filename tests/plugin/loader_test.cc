// loader_test.cc: an engine's view: moe_ep_loader.h on the real built
// library (table, version, errors, a one-rank group), and the loader's
// readable failures for a missing file, a library without the symbol, and
// a table that is too old.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "moe_ep.h"
#include "moe_ep_loader.h"
#include "tests/common/ports.h"
#include "tests/common/spawn.h"

namespace {

std::string lib() { return moe_ep_test::runfile("plugin/libmoe_ep.so"); }

// Loads the real library through the engine's loader for each test.
class Loaded : public testing::Test {
 protected:
  void SetUp() override {
    char err[512] = "";
    h = moe_ep_load(lib().c_str(), &t, err, sizeof err);
    ASSERT_NE(h, nullptr) << err;
  }
  void TearDown() override { moe_ep_unload(h); }
  // A one-rank host config (4 experts) on a free loopback port; nullptr
  // when the library refuses it (its last_error says why).
  moe_ep_config_t* HostConfig() const {
    moe_ep_config_t* cfg = nullptr;
    std::string yaml =
        "moe_ep:\n  backend: host\n  num_experts: 4\n  hidden: 256\n  top_k: 2\n"
        "  max_tokens_per_rank: 8\n  bootstrap:\n    address: \"127.0.0.1:" +
        std::to_string(moe_ep_test::free_loopback_port()) + "\"\n";
    return t->config_from_yaml(yaml.c_str(), &cfg) == MOE_EP_OK ? cfg : nullptr;
  }
  const moe_ep_plugin_v1_t* t = nullptr;
  void* h = nullptr;
};

TEST_F(Loaded, LoadsRealLibrary) {
  EXPECT_EQ(t->abi_version, MOE_EP_ABI_VERSION);
  EXPECT_EQ(t->struct_size, sizeof(moe_ep_plugin_v1_t));
  EXPECT_STREQ(t->name, "moe_ep");
  EXPECT_TRUE(MOE_EP_HAS_ENTRY(t, handle_free));
  int a = -1, b = -1, c = -1;
  EXPECT_EQ(t->get_version(&a, &b, &c), MOE_EP_OK);
  EXPECT_EQ(a, MOE_EP_VERSION_MAJOR);
  EXPECT_EQ(t->get_version(nullptr, &b, &c), MOE_EP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(t->last_error(), "get_version"), nullptr) << t->last_error();
  EXPECT_STREQ(t->status_string(MOE_EP_ERR_PEER_FAILED), "MOE_EP_ERR_PEER_FAILED");
}

TEST_F(Loaded, EveryEntryIsSet) {
  const void* const* entries = reinterpret_cast<const void* const*>(&t->get_version);
  size_t n = (sizeof(moe_ep_plugin_v1_t) - offsetof(moe_ep_plugin_v1_t, get_version)) / sizeof(void*);
  for (size_t i = 0; i < n; i++) EXPECT_NE(entries[i], nullptr) << "entry " << i;
}

TEST_F(Loaded, OneRankGroupThroughTheTable) {
  moe_ep_config_t* cfg = HostConfig();
  ASSERT_NE(cfg, nullptr) << t->last_error();
  uint64_t bytes = 0;
  ASSERT_EQ(t->buffer_size_hint(cfg, 1, &bytes), MOE_EP_OK) << t->last_error();
  EXPECT_GT(bytes, 0u);
  EXPECT_EQ(t->buffer_size_hint(cfg, 3, &bytes), MOE_EP_ERR_INVALID_ARGUMENT);
  moe_ep_group_params_t gp = MOE_EP_INIT(moe_ep_group_params_t);
  gp.config = cfg;
  gp.rank = 0;
  gp.world_size = 1;
  moe_ep_group_t* g = nullptr;
  ASSERT_EQ(t->group_create(&gp, &g), MOE_EP_OK) << t->last_error();
  int32_t transports[1] = {-1};
  moe_ep_group_info_t info = MOE_EP_INIT(moe_ep_group_info_t);
  info.peer_transports = transports;
  info.peer_transports_len = 1;
  ASSERT_EQ(t->group_info(g, &info), MOE_EP_OK) << t->last_error();
  EXPECT_EQ(info.world_size, 1);
  EXPECT_EQ(info.num_local_experts, 4);
  EXPECT_EQ(info.bytes_allocated, bytes);
  EXPECT_EQ(transports[0], MOE_EP_TRANSPORT_UCX_HOST);
  // Too short a transport array is refused before anything is written.
  moe_ep_group_info_t short_info = MOE_EP_INIT(moe_ep_group_info_t);
  short_info.rank = -7;
  short_info.world_size = -7;
  short_info.peer_transports = transports;
  short_info.peer_transports_len = 0;
  EXPECT_EQ(t->group_info(g, &short_info), MOE_EP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(t->last_error(), "peer_transports_len=0 is smaller than world_size=1"),
            nullptr)
      << t->last_error();
  EXPECT_EQ(short_info.rank, -7);
  EXPECT_EQ(short_info.world_size, -7);
  EXPECT_EQ(t->group_destroy(g), MOE_EP_OK);
  EXPECT_EQ(t->group_destroy(g), MOE_EP_ERR_INVALID_ARGUMENT);  // already destroyed
  // num_experts not divisible by the world size fails before any bootstrap.
  gp.world_size = 3;
  EXPECT_EQ(t->group_create(&gp, &g), MOE_EP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(t->last_error(), "divisible"), nullptr) << t->last_error();
  // ... naming the rank that was refused, as every group_create failure does.
  gp.rank = 2;
  EXPECT_EQ(t->group_create(&gp, &g), MOE_EP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(t->last_error(), "rank 2"), nullptr) << t->last_error();
  // A missing config too names the rank that was given.
  gp.config = nullptr;
  gp.rank = 3;
  gp.world_size = 4;
  EXPECT_EQ(t->group_create(&gp, &g), MOE_EP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(t->last_error(), "params->config is NULL"), nullptr) << t->last_error();
  EXPECT_NE(std::strstr(t->last_error(), "rank 3"), nullptr) << t->last_error();
  t->config_free(cfg);
}

// buffer_size_hint refuses what group_create refuses, with the same
// status: no byte count for a group that could never be made.
TEST_F(Loaded, BufferSizeHintRefusesWhatGroupCreateRefuses) {
  moe_ep_config_t* cfg = nullptr;
  ASSERT_EQ(t->config_from_yaml("moe_ep:\n  backend: host\n  num_experts: 2048\n", &cfg),
            MOE_EP_OK)
      << t->last_error();
  uint64_t bytes = 7;
  EXPECT_EQ(t->buffer_size_hint(cfg, 1, &bytes), MOE_EP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(t->last_error(), "2048 local experts exceeds the limit 1024"), nullptr)
      << t->last_error();
  EXPECT_EQ(bytes, 7u);
  ASSERT_EQ(t->buffer_size_hint(cfg, 2, &bytes), MOE_EP_OK) << t->last_error();
  moe_ep_group_params_t gp = MOE_EP_INIT(moe_ep_group_params_t);
  gp.config = cfg;
  gp.rank = 0;
  gp.world_size = 1;
  moe_ep_group_t* g = nullptr;
  EXPECT_EQ(t->group_create(&gp, &g), MOE_EP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(t->last_error(), "rank 0"), nullptr) << t->last_error();
  EXPECT_NE(std::strstr(t->last_error(), "exceeds the limit 1024"), nullptr) << t->last_error();
  // nccl HT takes at most 16 ranks; the refusal needs no GPU.
  cfg->backend = MOE_EP_BACKEND_NCCL;
  cfg->mode = MOE_EP_MODE_HIGH_THROUGHPUT;
  cfg->num_experts = 256;
  ASSERT_EQ(t->buffer_size_hint(cfg, 16, &bytes), MOE_EP_OK) << t->last_error();
  EXPECT_EQ(t->buffer_size_hint(cfg, 32, &bytes), MOE_EP_ERR_UNSUPPORTED);
  EXPECT_NE(std::strstr(t->last_error(), "'high_throughput' on the nccl backend takes at most 16"),
            nullptr)
      << t->last_error();
  t->config_free(cfg);
}

// A communicator handed to a host group is refused before any bootstrap,
// naming the parameter; a group forms without it afterwards.
TEST_F(Loaded, HostGroupRefusesAnNcclComm) {
  moe_ep_config_t* cfg = HostConfig();
  ASSERT_NE(cfg, nullptr) << t->last_error();
  moe_ep_group_params_t gp = MOE_EP_INIT(moe_ep_group_params_t);
  gp.config = cfg;
  gp.rank = 0;
  gp.world_size = 1;
  int not_a_comm = 0;
  gp.nccl_comm = &not_a_comm;
  moe_ep_group_t* g = nullptr;
  EXPECT_EQ(t->group_create(&gp, &g), MOE_EP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(g, nullptr);
  EXPECT_NE(std::strstr(t->last_error(), "params->nccl_comm"), nullptr) << t->last_error();
  EXPECT_NE(std::strstr(t->last_error(), "config backend host"), nullptr) << t->last_error();
  gp.nccl_comm = nullptr;
  ASSERT_EQ(t->group_create(&gp, &g), MOE_EP_OK) << t->last_error();
  EXPECT_EQ(t->group_destroy(g), MOE_EP_OK);
  t->config_free(cfg);
}

// CI has no GPU: the nccl backend sizes its buffers, then refuses to form a
// group with a sentence saying why, and the library stays usable.
TEST_F(Loaded, NcclBackendWithoutGpuFailsCleanly) {
  moe_ep_config_t* cfg = nullptr;
  int port = moe_ep_test::free_loopback_port();
  std::string yaml = "moe_ep:\n  backend: nccl\n  num_experts: 8\n  hidden: 1024\n"
                     "  top_k: 2\n  max_tokens_per_rank: 16\n  bootstrap:\n    address: "
                     "\"127.0.0.1:" + std::to_string(port) + "\"\n";
  ASSERT_EQ(t->config_from_yaml(yaml.c_str(), &cfg), MOE_EP_OK) << t->last_error();
  uint64_t nccl_bytes = 0, host_bytes = 0;
  ASSERT_EQ(t->buffer_size_hint(cfg, 2, &nccl_bytes), MOE_EP_OK) << t->last_error();
  cfg->backend = MOE_EP_BACKEND_HOST;
  ASSERT_EQ(t->buffer_size_hint(cfg, 2, &host_bytes), MOE_EP_OK) << t->last_error();
  EXPECT_GT(nccl_bytes, 0u);
  EXPECT_NE(nccl_bytes, host_bytes);  // each backend sizes its own layout
  cfg->backend = MOE_EP_BACKEND_NCCL;
  moe_ep_group_params_t gp = MOE_EP_INIT(moe_ep_group_params_t);
  gp.config = cfg;
  gp.rank = 0;
  gp.world_size = 1;
  gp.cuda_device = -1;
  moe_ep_group_t* g = nullptr;
  moe_ep_status_t st = t->group_create(&gp, &g);
  EXPECT_EQ(st, MOE_EP_ERR_CUDA) << t->last_error();
  EXPECT_NE(std::strstr(t->last_error(), "needs a CUDA device"), nullptr) << t->last_error();
  EXPECT_EQ(g, nullptr);
  // A host group still forms afterwards in the same process.
  cfg->backend = MOE_EP_BACKEND_HOST;
  ASSERT_EQ(t->group_create(&gp, &g), MOE_EP_OK) << t->last_error();
  EXPECT_EQ(t->group_destroy(g), MOE_EP_OK);
  t->config_free(cfg);
}

TEST(Loader, MissingFile) {
  const moe_ep_plugin_v1_t* t = reinterpret_cast<const moe_ep_plugin_v1_t*>(0x1);
  char err[512];
  EXPECT_EQ(moe_ep_load("/nonexistent/libmoe_ep.so", &t, err, sizeof err), nullptr);
  EXPECT_EQ(t, nullptr);
  EXPECT_NE(std::strstr(err, "cannot open"), nullptr) << err;
}

TEST(Loader, LibraryWithoutTable) {
  const moe_ep_plugin_v1_t* t = nullptr;
  char err[512];
  EXPECT_EQ(moe_ep_load("libm.so.6", &t, err, sizeof err), nullptr);
  EXPECT_NE(std::strstr(err, "exports no moe_ep_plugin_v1"), nullptr) << err;
}

// A 0.2 library (table up to handle_free) loads; handle_layout (0.3) and
// group_busy_hook (0.4) are reported absent and the loader's wrappers
// answer UNSUPPORTED.
TEST(Loader, TableWithoutLaterEntries) {
  const moe_ep_plugin_v1_t* t = nullptr;
  char err[512] = "";
  std::string v02 = moe_ep_test::runfile("tests/plugin/libfake_v02_plugin.so");
  void* h = moe_ep_load(v02.c_str(), &t, err, sizeof err);
  ASSERT_NE(h, nullptr) << err;
  EXPECT_EQ(t->struct_size, offsetof(moe_ep_plugin_v1_t, handle_layout));
  EXPECT_FALSE(MOE_EP_HAS_ENTRY(t, handle_layout));
  moe_ep_handle_layout_params_t p = moe_ep_handle_layout_params_init();
  EXPECT_EQ(moe_ep_call_handle_layout(t, nullptr, &p), MOE_EP_ERR_UNSUPPORTED);
  EXPECT_FALSE(MOE_EP_HAS_ENTRY(t, group_busy_hook));
  moe_ep_hook_t* busy = reinterpret_cast<moe_ep_hook_t*>(&p);
  EXPECT_EQ(moe_ep_call_group_busy_hook(t, nullptr, &busy), MOE_EP_ERR_UNSUPPORTED);
  EXPECT_EQ(busy, nullptr);
  moe_ep_unload(h);
}

TEST_F(Loaded, HandleLayoutThroughTheLoader) {
  EXPECT_TRUE(MOE_EP_HAS_ENTRY(t, handle_layout));
  moe_ep_handle_layout_params_t p = moe_ep_handle_layout_params_init();
  // The real entry runs: a bogus handle is refused with a sentence.
  EXPECT_EQ(moe_ep_call_handle_layout(t, nullptr, &p), MOE_EP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(t->last_error(), "handle_layout: handle="), nullptr) << t->last_error();
  EXPECT_TRUE(MOE_EP_HAS_ENTRY(t, group_busy_hook));
  moe_ep_hook_t* busy = nullptr;
  EXPECT_EQ(moe_ep_call_group_busy_hook(t, nullptr, &busy), MOE_EP_ERR_INVALID_ARGUMENT);
}

// A table with a NULL entry is refused naming it (the engine would crash
// on its first call through it).
TEST(Loader, TableWithANullEntry) {
  const moe_ep_plugin_v1_t* t = nullptr;
  char err[512] = "";
  std::string lib = moe_ep_test::runfile("tests/plugin/libfake_null_plugin.so");
  EXPECT_EQ(moe_ep_load(lib.c_str(), &t, err, sizeof err), nullptr);
  EXPECT_EQ(t, nullptr);
  EXPECT_NE(std::strstr(err, "has no 'combine' entry (NULL)"), nullptr) << err;
}

TEST(Loader, TooOldTable) {
  const moe_ep_plugin_v1_t* t = nullptr;
  char err[512];
  std::string old = moe_ep_test::runfile("tests/plugin/libfake_old_plugin.so");
  EXPECT_EQ(moe_ep_load(old.c_str(), &t, err, sizeof err), nullptr);
  EXPECT_NE(std::strstr(err, "too old"), nullptr) << err;
}

TEST(Loader, OtherAbiVersion) {
  const moe_ep_plugin_v1_t* t = nullptr;
  char err[512] = "";
  std::string lib = moe_ep_test::runfile("tests/plugin/libfake_abi2_plugin.so");
  EXPECT_EQ(moe_ep_load(lib.c_str(), &t, err, sizeof err), nullptr);
  EXPECT_EQ(t, nullptr);
  const std::string want = "reports abi_version " + std::to_string(MOE_EP_ABI_VERSION + 1);
  EXPECT_NE(std::strstr(err, want.c_str()), nullptr) << err;
}

TEST(Loader, TableTooShortForAbiVersion) {
  const moe_ep_plugin_v1_t* t = nullptr;
  char err[512] = "";
  std::string lib = moe_ep_test::runfile("tests/plugin/libfake_short_plugin.so");
  EXPECT_EQ(moe_ep_load(lib.c_str(), &t, err, sizeof err), nullptr);
  EXPECT_EQ(t, nullptr);
  EXPECT_NE(std::strstr(err, "is 8 bytes"), nullptr) << err;
  EXPECT_EQ(std::strstr(err, "abi_version 7"), nullptr) << err;
}

}  // namespace
