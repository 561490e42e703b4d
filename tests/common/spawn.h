// spawn.h: start N real rank processes on loopback the way the launcher
// does (rank, world size, bootstrap address, job token in the environment),
// wait for them with a deadline, and return how each one ended.
#ifndef MOE_EP_TESTS_COMMON_SPAWN_H_
#define MOE_EP_TESTS_COMMON_SPAWN_H_

#include <string>
#include <vector>

namespace moe_ep_test {

struct RankExit {
  int code = -1;    // exit status, or -1
  int signal = 0;   // terminating signal, or 0
  std::string log;  // its stderr + stdout
};

// Runs `argv` as ranks 0..n-1; kills all after timeout_s. extra_env entries
// are "NAME=value".
std::vector<RankExit> run_ranks(int n, const std::vector<std::string>& argv, int timeout_s,
                                const std::vector<std::string>& extra_env = {});

// Path of a data dependency inside Bazel's runfiles.
std::string runfile(const std::string& workspace_relative);

}  // namespace moe_ep_test

#endif  // MOE_EP_TESTS_COMMON_SPAWN_H_
