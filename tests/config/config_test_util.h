// config_test_util.h: shared fixture for the config tests: clears every
// MOE_EP_<KEY> override around each test, parses text, and checks error
// sentences for required pieces (key, line, allowed values).
#ifndef TESTS_CONFIG_CONFIG_TEST_UTIL_H_
#define TESTS_CONFIG_CONFIG_TEST_UTIL_H_

#include <stdlib.h>

#include <initializer_list>
#include <string>

#include "gtest/gtest.h"
#include "runtime/config.h"
#include "runtime/error.h"

// Written from the spec, not from the key table, so a renamed variable in
// the library shows up as a failing test.
inline const char *const kConfigEnvVars[] = {
    "MOE_EP_BACKEND",           "MOE_EP_MODE",
    "MOE_EP_NUM_EXPERTS",       "MOE_EP_HIDDEN",
    "MOE_EP_TOP_K",             "MOE_EP_MAX_TOKENS_PER_RANK",
    "MOE_EP_DISPATCH_DTYPE",    "MOE_EP_FP8_SCALE",
    "MOE_EP_DOUBLE_BUFFER",     "MOE_EP_TRANSPORT",
    "MOE_EP_RANKS_PER_NODE",    "MOE_EP_BOOTSTRAP_ADDRESS",
    "MOE_EP_BOOTSTRAP_TIMEOUT_MS", "MOE_EP_BOOTSTRAP_TOKEN_ENV",
    "MOE_EP_TIMEOUTS_KERNEL_MS", "MOE_EP_LOG_LEVEL",
};

class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override { ClearEnv(); }
  void TearDown() override {
    ClearEnv();
    mep_config_free(cfg_);
  }
  static void ClearEnv() {
    for (const char *name : kConfigEnvVars) unsetenv(name);
  }

  // Parses path or text into cfg_ (freeing any previous one).
  moe_ep_status_t Parse(const std::string &text) {
    mep_config_free(cfg_);
    cfg_ = nullptr;
    return mep_config_from_yaml(text.c_str(), &cfg_);
  }

  // Asserts the parse fails with MOE_EP_ERR_CONFIG, allocates nothing, and
  // that last_error() holds every piece.
  void ExpectError(const std::string &text,
                   std::initializer_list<const char *> pieces,
                   moe_ep_status_t want = MOE_EP_ERR_CONFIG) {
    moe_ep_status_t st = Parse(text);
    std::string err = mep_last_error();
    EXPECT_EQ(st, want) << "input:\n" << text << "\nerror: " << err;
    EXPECT_EQ(cfg_, nullptr) << "a failed parse must not return a config";
    for (const char *piece : pieces) {
      EXPECT_NE(err.find(piece), std::string::npos)
          << "error text lacks '" << piece << "'\nerror: " << err
          << "\ninput:\n" << text;
    }
  }

  moe_ep_config_t *cfg_ = nullptr;
};

#endif  // TESTS_CONFIG_CONFIG_TEST_UTIL_H_
