// config_parse_test.cc: defaults, every key and spelling parsed from YAML,
// the engine's other top-level keys ignored, files on disk vs inline text.
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <fstream>
#include <string>

#include "config_test_util.h"

namespace {

void ExpectDefaults(const moe_ep_config_t &c) {
  EXPECT_EQ(c.struct_size, sizeof(moe_ep_config_t));
  EXPECT_EQ(c.backend, MOE_EP_BACKEND_AUTO);
  EXPECT_EQ(c.mode, MOE_EP_MODE_LOW_LATENCY);
  EXPECT_EQ(c.num_experts, 256);
  EXPECT_EQ(c.hidden, 7168);
  EXPECT_EQ(c.top_k, 8);
  EXPECT_EQ(c.max_tokens_per_rank, 128);
  EXPECT_EQ(c.dispatch_dtype, MOE_EP_DISPATCH_BF16);
  EXPECT_EQ(c.fp8_scale, MOE_EP_FP8_SCALE_F32);
  EXPECT_EQ(c.double_buffer, 1);
  EXPECT_EQ(c.transport, MOE_EP_TRANSPORT_AUTO);
  EXPECT_EQ(c.ranks_per_node, 0);
  EXPECT_EQ(c.reserved0, 0);
  EXPECT_EQ(c.reserved1, 0);
  EXPECT_STREQ(c.bootstrap_address, "127.0.0.1:29500");
  EXPECT_EQ(c.bootstrap_timeout_ms, 30000);
  EXPECT_STREQ(c.bootstrap_token_env, "MOE_EP_JOB_TOKEN");
  EXPECT_EQ(c.kernel_timeout_ms, 10000);
  EXPECT_EQ(c.log_level, MOE_EP_LOG_WARN);
}

using ConfigParse = ConfigTest;

TEST_F(ConfigParse, DefaultsFunction) {
  moe_ep_config_t c;
  memset(&c, 0x5a, sizeof(c));
  mep_config_defaults(&c);
  ExpectDefaults(c);
  EXPECT_EQ(mep_config_validate(&c), MOE_EP_OK) << mep_last_error();
}

TEST_F(ConfigParse, EmptySectionGivesDefaults) {
  for (const char *text : {"moe_ep: {}", "moe_ep:\n", "moe_ep: ~\n",
                           "moe_ep: null", "moe_ep:\n  bootstrap:\n  timeouts: {}\n"}) {
    ASSERT_EQ(Parse(text), MOE_EP_OK) << text << ": " << mep_last_error();
    SCOPED_TRACE(text);
    ExpectDefaults(*cfg_);
  }
}

const char kAllKeys[] =
    "moe_ep:\n"
    "  backend: host\n"
    "  mode: high_throughput\n"
    "  num_experts: 64\n"
    "  hidden: 4096\n"
    "  top_k: 6\n"
    "  max_tokens_per_rank: 4096\n"
    "  dispatch_dtype: fp8_e4m3\n"
    "  fp8_scale: ue8m0_packed\n"
    "  double_buffer: false\n"
    "  transport: gin_emulated\n"
    "  ranks_per_node: 2\n"
    "  bootstrap:\n"
    "    address: \"10.0.0.1:1234\"\n"
    "    timeout_ms: 5000\n"
    "    token_env: MY_TOKEN\n"
    "  timeouts:\n"
    "    kernel_ms: 2500\n"
    "  log_level: debug\n";

void ExpectAllKeys(const moe_ep_config_t &c) {
  EXPECT_EQ(c.backend, MOE_EP_BACKEND_HOST);
  EXPECT_EQ(c.mode, MOE_EP_MODE_HIGH_THROUGHPUT);
  EXPECT_EQ(c.num_experts, 64);
  EXPECT_EQ(c.hidden, 4096);
  EXPECT_EQ(c.top_k, 6);
  EXPECT_EQ(c.max_tokens_per_rank, 4096);
  EXPECT_EQ(c.dispatch_dtype, MOE_EP_DISPATCH_FP8_E4M3);
  EXPECT_EQ(c.fp8_scale, MOE_EP_FP8_SCALE_UE8M0_PACKED);
  EXPECT_EQ(c.double_buffer, 0);
  EXPECT_EQ(c.transport, MOE_EP_TRANSPORT_GIN_EMULATED);
  EXPECT_EQ(c.ranks_per_node, 2);
  EXPECT_STREQ(c.bootstrap_address, "10.0.0.1:1234");
  EXPECT_EQ(c.bootstrap_timeout_ms, 5000);
  EXPECT_STREQ(c.bootstrap_token_env, "MY_TOKEN");
  EXPECT_EQ(c.kernel_timeout_ms, 2500);
  EXPECT_EQ(c.log_level, MOE_EP_LOG_DEBUG);
}

TEST_F(ConfigParse, EveryKey) {
  ASSERT_EQ(Parse(kAllKeys), MOE_EP_OK) << mep_last_error();
  ExpectAllKeys(*cfg_);
}

TEST_F(ConfigParse, FlowStyleAndLimits) {
  ASSERT_EQ(Parse("moe_ep: {num_experts: 65536, hidden: 32768, top_k: 32, "
                  "max_tokens_per_rank: 1024, bootstrap: {timeout_ms: "
                  "3600000, address: '[::1]:65535'}, timeouts: {kernel_ms: 1}}"),
            MOE_EP_OK)
      << mep_last_error();
  EXPECT_EQ(cfg_->num_experts, 65536);
  EXPECT_EQ(cfg_->hidden, 32768);
  EXPECT_EQ(cfg_->top_k, 32);
  EXPECT_EQ(cfg_->max_tokens_per_rank, 1024);
  EXPECT_EQ(cfg_->bootstrap_timeout_ms, 3600000);
  EXPECT_EQ(cfg_->kernel_timeout_ms, 1);
  EXPECT_STREQ(cfg_->bootstrap_address, "[::1]:65535");
  // Lower bounds, bf16 hidden needs only a multiple of 8.
  ASSERT_EQ(Parse("moe_ep: {num_experts: 1, hidden: 8, top_k: 1, "
                  "max_tokens_per_rank: 1}"),
            MOE_EP_OK)
      << mep_last_error();
  EXPECT_EQ(cfg_->hidden, 8);
  ASSERT_EQ(Parse("moe_ep: {hidden: 7176}"), MOE_EP_OK) << mep_last_error();
  EXPECT_EQ(cfg_->hidden, 7176);
  ASSERT_EQ(Parse("moe_ep: {mode: high_throughput, max_tokens_per_rank: 65536}"),
            MOE_EP_OK)
      << mep_last_error();
  EXPECT_EQ(cfg_->max_tokens_per_rank, 65536);
  // ranks_per_node: 0 (unset) up to the rank limit; whether it divides the
  // world is group_create's rule, not the config's.
  for (int v : {0, 1, 3, 8, 1024}) {
    ASSERT_EQ(Parse("moe_ep: {ranks_per_node: " + std::to_string(v) + "}"),
              MOE_EP_OK)
        << mep_last_error();
    EXPECT_EQ(cfg_->ranks_per_node, v);
  }
}

TEST_F(ConfigParse, EveryEnumSpelling) {
  struct Case {
    const char *key;
    const char *value;
    int32_t moe_ep_config_t::*field;
    int32_t want;
  } cases[] = {
      {"backend", "auto", &moe_ep_config_t::backend, MOE_EP_BACKEND_AUTO},
      {"backend", "host", &moe_ep_config_t::backend, MOE_EP_BACKEND_HOST},
      {"backend", "nccl", &moe_ep_config_t::backend, MOE_EP_BACKEND_NCCL},
      {"mode", "low_latency", &moe_ep_config_t::mode, MOE_EP_MODE_LOW_LATENCY},
      {"mode", "high_throughput", &moe_ep_config_t::mode,
       MOE_EP_MODE_HIGH_THROUGHPUT},
      {"dispatch_dtype", "bf16", &moe_ep_config_t::dispatch_dtype,
       MOE_EP_DISPATCH_BF16},
      {"dispatch_dtype", "fp8_e4m3", &moe_ep_config_t::dispatch_dtype,
       MOE_EP_DISPATCH_FP8_E4M3},
      {"fp8_scale", "f32", &moe_ep_config_t::fp8_scale, MOE_EP_FP8_SCALE_F32},
      {"fp8_scale", "ue8m0", &moe_ep_config_t::fp8_scale,
       MOE_EP_FP8_SCALE_UE8M0},
      {"fp8_scale", "ue8m0_packed", &moe_ep_config_t::fp8_scale,
       MOE_EP_FP8_SCALE_UE8M0_PACKED},
      {"transport", "auto", &moe_ep_config_t::transport, MOE_EP_TRANSPORT_AUTO},
      {"transport", "lsa", &moe_ep_config_t::transport, MOE_EP_TRANSPORT_LSA},
      {"transport", "gin", &moe_ep_config_t::transport, MOE_EP_TRANSPORT_GIN},
      {"transport", "gin_emulated", &moe_ep_config_t::transport,
       MOE_EP_TRANSPORT_GIN_EMULATED},
      {"log_level", "none", &moe_ep_config_t::log_level, MOE_EP_LOG_NONE},
      {"log_level", "error", &moe_ep_config_t::log_level, MOE_EP_LOG_ERROR},
      {"log_level", "warn", &moe_ep_config_t::log_level, MOE_EP_LOG_WARN},
      {"log_level", "info", &moe_ep_config_t::log_level, MOE_EP_LOG_INFO},
      {"log_level", "debug", &moe_ep_config_t::log_level, MOE_EP_LOG_DEBUG},
      {"log_level", "trace", &moe_ep_config_t::log_level, MOE_EP_LOG_TRACE},
      {"double_buffer", "true", &moe_ep_config_t::double_buffer, 1},
      {"double_buffer", "yes", &moe_ep_config_t::double_buffer, 1},
      {"double_buffer", "on", &moe_ep_config_t::double_buffer, 1},
      {"double_buffer", "1", &moe_ep_config_t::double_buffer, 1},
      {"double_buffer", "True", &moe_ep_config_t::double_buffer, 1},
      {"double_buffer", "false", &moe_ep_config_t::double_buffer, 0},
      {"double_buffer", "no", &moe_ep_config_t::double_buffer, 0},
      {"double_buffer", "off", &moe_ep_config_t::double_buffer, 0},
      {"double_buffer", "0", &moe_ep_config_t::double_buffer, 0},
  };
  for (const Case &c : cases) {
    std::string text = std::string("moe_ep:\n  ") + c.key + ": " + c.value;
    ASSERT_EQ(Parse(text), MOE_EP_OK) << text << ": " << mep_last_error();
    EXPECT_EQ(cfg_->*c.field, c.want) << text;
  }
}

TEST_F(ConfigParse, NamesAreYamlSpellings) {
  EXPECT_STREQ(mep_backend_name(MOE_EP_BACKEND_AUTO), "auto");
  EXPECT_STREQ(mep_backend_name(MOE_EP_BACKEND_HOST), "host");
  EXPECT_STREQ(mep_backend_name(MOE_EP_BACKEND_NCCL), "nccl");
  EXPECT_STREQ(mep_mode_name(MOE_EP_MODE_LOW_LATENCY), "low_latency");
  EXPECT_STREQ(mep_mode_name(MOE_EP_MODE_HIGH_THROUGHPUT), "high_throughput");
  EXPECT_STREQ(mep_dispatch_dtype_name(MOE_EP_DISPATCH_BF16), "bf16");
  EXPECT_STREQ(mep_dispatch_dtype_name(MOE_EP_DISPATCH_FP8_E4M3), "fp8_e4m3");
  EXPECT_STREQ(mep_fp8_scale_name(MOE_EP_FP8_SCALE_F32), "f32");
  EXPECT_STREQ(mep_fp8_scale_name(MOE_EP_FP8_SCALE_UE8M0), "ue8m0");
  EXPECT_STREQ(mep_fp8_scale_name(MOE_EP_FP8_SCALE_UE8M0_PACKED),
               "ue8m0_packed");
  EXPECT_STREQ(mep_transport_name(MOE_EP_TRANSPORT_AUTO), "auto");
  EXPECT_STREQ(mep_transport_name(MOE_EP_TRANSPORT_LSA), "lsa");
  EXPECT_STREQ(mep_transport_name(MOE_EP_TRANSPORT_GIN), "gin");
  EXPECT_STREQ(mep_transport_name(MOE_EP_TRANSPORT_GIN_EMULATED),
               "gin_emulated");
  // Out of range never returns NULL: callers print it.
  EXPECT_STREQ(mep_backend_name(3), "unknown");
  EXPECT_STREQ(mep_transport_name(-1), "unknown");
}

const char kEngineFile[] =
    "# an engine's own config file\n"
    "model: deepseek-v3\n"
    "serving:\n"
    "  port: 8000\n"
    "  top_k: not-ours\n"
    "moe_ep:\n"
    "  mode: high_throughput\n"
    "  max_tokens_per_rank: 4096\n"
    "scheduler: [a, b, {c: 1}]\n"
    "backend: ignored-belongs-to-engine\n";

TEST_F(ConfigParse, EngineKeysIgnored) {
  ASSERT_EQ(Parse(kEngineFile), MOE_EP_OK) << mep_last_error();
  EXPECT_EQ(cfg_->mode, MOE_EP_MODE_HIGH_THROUGHPUT);
  EXPECT_EQ(cfg_->max_tokens_per_rank, 4096);
  EXPECT_EQ(cfg_->backend, MOE_EP_BACKEND_AUTO);
  EXPECT_EQ(cfg_->top_k, 8);
}

std::string TmpPath(const char *name) {
  const char *dir = getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

TEST_F(ConfigParse, FileOnDisk) {
  std::string path = TmpPath("engine.yaml");
  {
    std::ofstream f(path);
    f << kEngineFile << "---\nsecond: document ignored\n";
  }
  ASSERT_EQ(Parse(path), MOE_EP_OK) << mep_last_error();
  EXPECT_EQ(cfg_->mode, MOE_EP_MODE_HIGH_THROUGHPUT);
  EXPECT_EQ(cfg_->max_tokens_per_rank, 4096);

  std::string all = TmpPath("all.yaml");
  {
    std::ofstream f(all);
    f << kAllKeys;
  }
  ASSERT_EQ(Parse(all), MOE_EP_OK) << mep_last_error();
  ExpectAllKeys(*cfg_);

  // Errors from a file name the file and the line in it.
  std::string bad = TmpPath("bad.yaml");
  {
    std::ofstream f(bad);
    f << "model: x\nmoe_ep:\n  top_k: 64\n";
  }
  ExpectError(bad, {bad.c_str(), "top_k", "line 3", "1..32"});
}

TEST_F(ConfigParse, MissingFileAndBadArguments) {
  ExpectError("no_such_config.yaml",
              {"config file 'no_such_config.yaml' not found",
               "No such file or directory"});
  ExpectError(TmpPath("missing.yaml"), {"not found", "missing.yaml"});
  // One line with ':' and no such file is YAML; the message says so.
  ExpectError("configs/missing:v2.yaml",
              {"'configs/missing:v2.yaml' (no such file, so read as YAML)",
               "line 1", "not a mapping"});
  std::string dir = TmpPath("a_directory");
  mkdir(dir.c_str(), 0700);
  ExpectError(dir, {"not a regular file", "a_directory"});

  moe_ep_config_t *out = reinterpret_cast<moe_ep_config_t *>(0x1);
  EXPECT_EQ(mep_config_from_yaml(nullptr, &out), MOE_EP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(mep_last_error()).find("path_or_text"),
            std::string::npos)
      << mep_last_error();
  EXPECT_EQ(out, reinterpret_cast<moe_ep_config_t *>(0x1))
      << "out must be untouched on failure";
  EXPECT_EQ(mep_config_from_yaml("moe_ep: {}", nullptr),
            MOE_EP_ERR_INVALID_ARGUMENT);
  mep_config_free(nullptr);  // accepted, like free(NULL)
}

TEST_F(ConfigParse, AnchorsAndQuotedScalars) {
  ASSERT_EQ(Parse("base: &b {address: 'h:1'}\n"
                  "moe_ep:\n  bootstrap: *b\n  top_k: '4'\n  hidden: \"256\"\n"),
            MOE_EP_OK)
      << mep_last_error();
  EXPECT_STREQ(cfg_->bootstrap_address, "h:1");
  EXPECT_EQ(cfg_->top_k, 4);
  EXPECT_EQ(cfg_->hidden, 256);
}

}  // namespace
