// log_env_test.cc: run with MOE_EP_LOG_LEVEL=verbose (BUILD.bazel), a value
// that names no level: it is ignored (warn stays the level) and said once,
// before the first line the library logs.
#include <gtest/gtest.h>

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
  EXPECT_NE(g_lines[0].find("MOE_EP_LOG_LEVEL='verbose' is not a level"), std::string::npos)
      << g_lines[0];
  EXPECT_NE(g_lines[1].find("a warn line"), std::string::npos) << g_lines[1];
  EXPECT_NE(g_lines[2].find("another warn line"), std::string::npos) << g_lines[2];
  EXPECT_EQ(mep_log_level(), MOE_EP_LOG_WARN);
}

}  // namespace
