// config_import_test.cc: engine-filled structs: struct_size honoured (fields
// past it take defaults), too-small sizes refused, values validated.
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <string>

#include "config_test_util.h"

namespace {

moe_ep_config_t Filled() {
  moe_ep_config_t c;
  mep_config_defaults(&c);
  c.backend = MOE_EP_BACKEND_HOST;
  c.top_k = 4;
  c.hidden = 1024;
  c.log_level = MOE_EP_LOG_INFO;
  snprintf(c.bootstrap_address, sizeof(c.bootstrap_address), "engine:7000");
  snprintf(c.bootstrap_token_env, sizeof(c.bootstrap_token_env), "ENG_TOKEN");
  return c;
}

TEST(ConfigImport, FullStructCopied) {
  moe_ep_config_t user = Filled(), out;
  ASSERT_EQ(mep_config_import(&user, &out), MOE_EP_OK) << mep_last_error();
  EXPECT_EQ(memcmp(&user, &out, sizeof(out)), 0);
}

TEST(ConfigImport, ShortStructTakesDefaultsPastStructSize) {
  moe_ep_config_t user = Filled();
  // An older engine whose struct ended after log_level: the strings past it
  // hold junk the library must not read.
  memset(user.bootstrap_address, 'J', sizeof(user.bootstrap_address));
  memset(user.bootstrap_token_env, 'J', sizeof(user.bootstrap_token_env));
  user.struct_size = offsetof(moe_ep_config_t, log_level) + sizeof(int32_t);
  moe_ep_config_t out;
  ASSERT_EQ(mep_config_import(&user, &out), MOE_EP_OK) << mep_last_error();
  EXPECT_EQ(out.struct_size, sizeof(moe_ep_config_t));
  EXPECT_EQ(out.backend, MOE_EP_BACKEND_HOST);
  EXPECT_EQ(out.top_k, 4);
  EXPECT_EQ(out.hidden, 1024);
  EXPECT_EQ(out.log_level, MOE_EP_LOG_INFO);
  EXPECT_STREQ(out.bootstrap_address, "127.0.0.1:29500");
  EXPECT_STREQ(out.bootstrap_token_env, "MOE_EP_JOB_TOKEN");

  // A size that cuts token_env in half: address is taken, token_env is not.
  user = Filled();
  user.struct_size = offsetof(moe_ep_config_t, bootstrap_token_env) + 3;
  ASSERT_EQ(mep_config_import(&user, &out), MOE_EP_OK) << mep_last_error();
  EXPECT_STREQ(out.bootstrap_address, "engine:7000");
  EXPECT_STREQ(out.bootstrap_token_env, "MOE_EP_JOB_TOKEN");

  // A 0.3 engine built before ranks_per_node: its struct_size (384) covers
  // reserved0, the old tail padding, but not ranks_per_node, so junk in
  // either is never read.
  user = Filled();
  user.struct_size = offsetof(moe_ep_config_t, ranks_per_node);
  EXPECT_EQ(user.struct_size, 384u);
  memset(&user.reserved0, 0xA5, sizeof(user.reserved0));
  memset(&user.ranks_per_node, 0xA5, sizeof(user.ranks_per_node));
  ASSERT_EQ(mep_config_import(&user, &out), MOE_EP_OK) << mep_last_error();
  EXPECT_STREQ(out.bootstrap_token_env, "ENG_TOKEN");
  EXPECT_EQ(out.ranks_per_node, 0);
  EXPECT_EQ(out.reserved0, 0);
  // One that has it.
  user = Filled();
  user.ranks_per_node = 8;
  user.reserved0 = user.reserved1 = -1;  // never read
  ASSERT_EQ(mep_config_import(&user, &out), MOE_EP_OK) << mep_last_error();
  EXPECT_EQ(out.ranks_per_node, 8);
  EXPECT_EQ(out.reserved0, 0);
  EXPECT_EQ(out.reserved1, 0);

  // A newer engine's larger struct: known fields read, the rest ignored.
  user = Filled();
  user.struct_size = sizeof(moe_ep_config_t) + 64;
  ASSERT_EQ(mep_config_import(&user, &out), MOE_EP_OK) << mep_last_error();
  EXPECT_STREQ(out.bootstrap_token_env, "ENG_TOKEN");
  EXPECT_EQ(out.struct_size, sizeof(moe_ep_config_t));
}

TEST(ConfigImport, TooSmallStructSizeIsInvalidArgument) {
  const size_t min = offsetof(moe_ep_config_t, log_level) + sizeof(int32_t);
  for (size_t size : {size_t{0}, size_t{8}, min - 1}) {
    moe_ep_config_t user = Filled(), out;
    memset(&out, 0x77, sizeof(out));
    user.struct_size = size;
    EXPECT_EQ(mep_config_import(&user, &out), MOE_EP_ERR_INVALID_ARGUMENT)
        << "struct_size " << size;
    std::string err = mep_last_error();
    EXPECT_NE(err.find("struct_size"), std::string::npos) << err;
    EXPECT_NE(err.find(std::to_string(size)), std::string::npos) << err;
    EXPECT_EQ(out.top_k, 0x77777777) << "out must be untouched on failure";
  }
  moe_ep_config_t c = Filled();
  EXPECT_EQ(mep_config_import(nullptr, &c), MOE_EP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(mep_config_import(&c, nullptr), MOE_EP_ERR_INVALID_ARGUMENT);
}

TEST(ConfigImport, ValuesValidated) {
  struct Case {
    void (*mutate)(moe_ep_config_t *);
    const char *piece1;
    const char *piece2;
  } cases[] = {
      {[](moe_ep_config_t *c) { c->top_k = 33; }, "'top_k' = 33", "1..32"},
      {[](moe_ep_config_t *c) { c->backend = 7; }, "'backend' = 7",
       "one of auto, host, nccl"},
      {[](moe_ep_config_t *c) { c->double_buffer = 2; }, "'double_buffer' = 2",
       "true/false"},
      {[](moe_ep_config_t *c) { c->max_tokens_per_rank = 4096; },
       "'max_tokens_per_rank' = 4096", "low_latency"},
      {[](moe_ep_config_t *c) {
         c->dispatch_dtype = MOE_EP_DISPATCH_FP8_E4M3;
         c->hidden = 1032;
       },
       "'hidden' = 1032", "multiple of 128"},
      {[](moe_ep_config_t *c) {
         memset(c->bootstrap_address, 'a', sizeof(c->bootstrap_address));
       },
       "'bootstrap.address'", "NUL-terminated"},
      {[](moe_ep_config_t *c) { c->bootstrap_token_env[0] = '\0'; },
       "'bootstrap.token_env'", "environment variable name"},
      {[](moe_ep_config_t *c) { c->kernel_timeout_ms = 0; },
       "'timeouts.kernel_ms' = 0", "1..3600000"},
      {[](moe_ep_config_t *c) { c->log_level = 6; }, "'log_level' = 6",
       "one of none, error, warn, info, debug, trace"},
      {[](moe_ep_config_t *c) { c->ranks_per_node = -1; },
       "'ranks_per_node' = -1", "integer 0..1024"},
      {[](moe_ep_config_t *c) { c->ranks_per_node = 1025; },
       "'ranks_per_node' = 1025", "integer 0..1024"},
  };
  for (const Case &k : cases) {
    moe_ep_config_t user = Filled(), out;
    k.mutate(&user);
    EXPECT_EQ(mep_config_import(&user, &out), MOE_EP_ERR_CONFIG) << k.piece1;
    std::string err = mep_last_error();
    EXPECT_NE(err.find(k.piece1), std::string::npos) << err;
    EXPECT_NE(err.find(k.piece2), std::string::npos) << err;
    EXPECT_EQ(mep_config_validate(&user), MOE_EP_ERR_CONFIG) << k.piece1;
  }
  EXPECT_EQ(mep_config_validate(nullptr), MOE_EP_ERR_INVALID_ARGUMENT);
}

}  // namespace
