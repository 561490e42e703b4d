// config_env_test.cc: MOE_EP_<KEY> overrides win over the YAML, bad values
// are errors naming the variable, value and rule, and unrelated MOE_EP_*
// variables are left to the launcher.
#include <stdlib.h>

#include <string>

#include "config_test_util.h"

namespace {

using ConfigEnv = ConfigTest;

TEST_F(ConfigEnv, OverridesYaml) {
  setenv("MOE_EP_TOP_K", "4", 1);
  setenv("MOE_EP_BACKEND", "HOST", 1);  // case-insensitive, as shells write it
  setenv("MOE_EP_MODE", "high_throughput", 1);
  setenv("MOE_EP_NUM_EXPERTS", "128", 1);
  setenv("MOE_EP_HIDDEN", "2048", 1);
  setenv("MOE_EP_MAX_TOKENS_PER_RANK", "8192", 1);
  setenv("MOE_EP_DISPATCH_DTYPE", "fp8_e4m3", 1);
  setenv("MOE_EP_FP8_SCALE", "ue8m0", 1);
  setenv("MOE_EP_DOUBLE_BUFFER", "off", 1);
  setenv("MOE_EP_TRANSPORT", "lsa", 1);
  setenv("MOE_EP_RANKS_PER_NODE", "4", 1);
  setenv("MOE_EP_BOOTSTRAP_ADDRESS", "node0:4000", 1);
  setenv("MOE_EP_BOOTSTRAP_TIMEOUT_MS", "1234", 1);
  setenv("MOE_EP_BOOTSTRAP_TOKEN_ENV", "JOB_SECRET", 1);
  setenv("MOE_EP_TIMEOUTS_KERNEL_MS", "777", 1);
  setenv("MOE_EP_LOG_LEVEL", "info", 1);
  setenv("MOE_EP_RANK", "3", 1);  // launcher's, not a key: ignored
  setenv("MOE_EP_WORLD_SIZE", "not-a-number", 1);
  ASSERT_EQ(Parse("moe_ep:\n  top_k: 6\n  backend: nccl\n  ranks_per_node: 8\n"
                  "  bootstrap:\n    address: 'a:1'\n"),
            MOE_EP_OK)
      << mep_last_error();
  unsetenv("MOE_EP_RANK");
  unsetenv("MOE_EP_WORLD_SIZE");
  EXPECT_EQ(cfg_->top_k, 4);
  EXPECT_EQ(cfg_->backend, MOE_EP_BACKEND_HOST);
  EXPECT_EQ(cfg_->mode, MOE_EP_MODE_HIGH_THROUGHPUT);
  EXPECT_EQ(cfg_->num_experts, 128);
  EXPECT_EQ(cfg_->hidden, 2048);
  EXPECT_EQ(cfg_->max_tokens_per_rank, 8192);
  EXPECT_EQ(cfg_->dispatch_dtype, MOE_EP_DISPATCH_FP8_E4M3);
  EXPECT_EQ(cfg_->fp8_scale, MOE_EP_FP8_SCALE_UE8M0);
  EXPECT_EQ(cfg_->double_buffer, 0);
  EXPECT_EQ(cfg_->transport, MOE_EP_TRANSPORT_LSA);
  EXPECT_EQ(cfg_->ranks_per_node, 4);
  EXPECT_STREQ(cfg_->bootstrap_address, "node0:4000");
  EXPECT_EQ(cfg_->bootstrap_timeout_ms, 1234);
  EXPECT_STREQ(cfg_->bootstrap_token_env, "JOB_SECRET");
  EXPECT_EQ(cfg_->kernel_timeout_ms, 777);
  EXPECT_EQ(cfg_->log_level, MOE_EP_LOG_INFO);
}

TEST_F(ConfigEnv, LogLevelNumberAndEmptyMeansUnset) {
  // log.c reads MOE_EP_LOG_LEVEL as a name or 0..5; config agrees.
  setenv("MOE_EP_LOG_LEVEL", "5", 1);
  setenv("MOE_EP_TOP_K", "", 1);
  ASSERT_EQ(Parse("moe_ep:\n  top_k: 6\n"), MOE_EP_OK) << mep_last_error();
  EXPECT_EQ(cfg_->log_level, MOE_EP_LOG_TRACE);
  EXPECT_EQ(cfg_->top_k, 6);
}

TEST_F(ConfigEnv, BadValueNamesVariableValueAndRule) {
  setenv("MOE_EP_TOP_K", "abc", 1);
  ExpectError("moe_ep: {}",
              {"MOE_EP_TOP_K", "'abc'", "not an integer", "integer 1..32"});
  ClearEnv();
  setenv("MOE_EP_TOP_K", "99", 1);
  ExpectError("moe_ep: {}", {"'top_k' = 99", "environment variable MOE_EP_TOP_K",
                             "integer 1..32"});
  ClearEnv();
  setenv("MOE_EP_BOOTSTRAP_TIMEOUT_MS", "0", 1);
  ExpectError("moe_ep: {}", {"environment variable MOE_EP_BOOTSTRAP_TIMEOUT_MS",
                             "bootstrap.timeout_ms", "1..3600000"});
  ClearEnv();
  setenv("MOE_EP_DOUBLE_BUFFER", "sometimes", 1);
  ExpectError("moe_ep: {}", {"MOE_EP_DOUBLE_BUFFER", "'sometimes'",
                             "true/false/yes/no/on/off/1/0"});
  ClearEnv();
  setenv("MOE_EP_TRANSPORT", "ib", 1);
  ExpectError("moe_ep: {}", {"MOE_EP_TRANSPORT", "'ib'",
                             "one of auto, lsa, gin, gin_emulated"});
  ClearEnv();
  setenv("MOE_EP_RANKS_PER_NODE", "-1", 1);
  ExpectError("moe_ep: {}",
              {"config key 'ranks_per_node' = -1 (environment variable "
               "MOE_EP_RANKS_PER_NODE) is out of range; allowed: integer "
               "0..1024"});
  ClearEnv();
  setenv("MOE_EP_RANKS_PER_NODE", "eight", 1);
  ExpectError("moe_ep: {}",
              {"config key 'ranks_per_node' (environment variable "
               "MOE_EP_RANKS_PER_NODE): 'eight' is not an integer"});
  ClearEnv();
  setenv("MOE_EP_BOOTSTRAP_ADDRESS", "nohost", 1);
  ExpectError("moe_ep: {}", {"MOE_EP_BOOTSTRAP_ADDRESS", "'nohost'",
                             "host:port"});
  ClearEnv();
  setenv("MOE_EP_LOG_LEVEL", "7", 1);
  ExpectError("moe_ep: {}", {"MOE_EP_LOG_LEVEL", "'7'", "one of none"});
}

TEST_F(ConfigEnv, CrossKeyRuleNamesBothSources) {
  // YAML hidden fine for bf16; env switches to fp8, which needs 128.
  setenv("MOE_EP_DISPATCH_DTYPE", "fp8_e4m3", 1);
  ExpectError("moe_ep:\n  hidden: 7176\n",
              {"'hidden' = 7176", "line 2", "multiple of 128",
               "environment variable MOE_EP_DISPATCH_DTYPE"});
  ClearEnv();
  // Env mode makes the YAML's max_tokens_per_rank legal.
  setenv("MOE_EP_MODE", "high_throughput", 1);
  ASSERT_EQ(Parse("moe_ep:\n  max_tokens_per_rank: 4096\n"), MOE_EP_OK)
      << mep_last_error();
  EXPECT_EQ(cfg_->max_tokens_per_rank, 4096);
}

}  // namespace
