// log_env_level_test.cc: run with MOE_EP_LOG_LEVEL set to a level
// (BUILD.bazel: "3" and "info", the digit and the name of one level): the
// logger takes it, as the config's reader does, with no complaint: INFO
// lines pass, DEBUG lines do not.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/log.h"

namespace {

std::vector<std::string> g_lines;

void Capture(void *, int, const char *msg) { g_lines.push_back(msg); }

TEST(LogEnvLevel, ADigitOrANameIsTaken) {
  const char *env = getenv("MOE_EP_LOG_LEVEL");
  ASSERT_NE(env, nullptr) << "BUILD.bazel sets MOE_EP_LOG_LEVEL for this test";
  mep_log_set_logger(Capture, nullptr);
  mep_log(MOE_EP_LOG_DEBUG, "test", "a debug line");
  mep_log(MOE_EP_LOG_INFO, "test", "an info line");
  mep_log_set_logger(nullptr, nullptr);
  EXPECT_EQ(mep_log_level(), MOE_EP_LOG_INFO) << "MOE_EP_LOG_LEVEL=" << env;
  ASSERT_EQ(g_lines.size(), 1u) << "MOE_EP_LOG_LEVEL=" << env << ": want only the info line";
  EXPECT_NE(g_lines[0].find("an info line"), std::string::npos) << g_lines[0];
}

}  // namespace
