// log_env_test.cc: run with a MOE_EP_LOG_LEVEL that names no level
// (BUILD.bazel: "verbose", and "03", which the config's reader refuses too,
// since a level is a name or one digit): it is ignored (warn stays the
// level) and said once, before the first line the library logs.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/log.h"

namespace {

std::vector<std::string> g_lines;

void Capture(void *, int, const char *msg) { g_lines.push_back(msg); }

TEST(LogEnv, ALevelThatIsNoLevelIsIgnoredAndSaidOnce) {
  mep_log_set_logger(Capture, nullptr);
  mep_log(MOE_EP_LOG_INFO, "test", "an info line");
  mep_log(MOE_EP_LOG_WARN, "test", "a warn line");
  mep_log(MOE_EP_LOG_WARN, "test", "another warn line");
  mep_log_set_logger(nullptr, nullptr);
  ASSERT_EQ(g_lines.size(), 3u);
  const char *env = getenv("MOE_EP_LOG_LEVEL");
  ASSERT_NE(env, nullptr) << "BUILD.bazel sets MOE_EP_LOG_LEVEL for this test";
  const std::string want = std::string("MOE_EP_LOG_LEVEL='") + env + "' is not a level";
  EXPECT_NE(g_lines[0].find(want), std::string::npos) << g_lines[0];
  EXPECT_NE(g_lines[1].find("a warn line"), std::string::npos) << g_lines[1];
  EXPECT_NE(g_lines[2].find("another warn line"), std::string::npos) << g_lines[2];
  EXPECT_EQ(mep_log_level(), MOE_EP_LOG_WARN);
}

}  // namespace
