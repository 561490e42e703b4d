// spawn.cc: fork/exec of rank processes for multi-process tests.
#include "tests/common/spawn.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "tests/common/ports.h"

namespace moe_ep_test {

std::string runfile(const std::string& rel) {
  const char* src = std::getenv("TEST_SRCDIR");
  if (src == nullptr) return rel;
  return std::string(src) + "/moe_ep/" + rel;
}

std::vector<RankExit> run_ranks(int n, const std::vector<std::string>& argv, int timeout_s,
                                const std::vector<std::string>& extra_env) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string dir = tmp ? tmp : "/tmp";
  std::string addr = "127.0.0.1:" + std::to_string(free_loopback_port());
  // From the kernel's entropy, not the pid: two copies of one test run at
  // once in sandboxes that both see the same pid would otherwise share a
  // token, and one copy's rank could join the other's group.
  std::random_device entropy;
  char token_hex[33];
  snprintf(token_hex, sizeof token_hex, "%08x%08x%08x%08x", entropy(), entropy(), entropy(),
           entropy());
  std::string token = std::string("tok") + token_hex;
  std::vector<pid_t> pids(n);
  std::vector<std::string> logs(n);
  for (int r = 0; r < n; r++) {
    logs[r] = dir + "/rank" + std::to_string(r) + "." + std::to_string(getpid()) + ".log";
    pid_t pid = fork();
    if (pid == 0) {
      int fd = open(logs[r].c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
      }
      setenv("MOE_EP_RANK", std::to_string(r).c_str(), 1);
      setenv("MOE_EP_WORLD_SIZE", std::to_string(n).c_str(), 1);
      setenv("MOE_EP_LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("MOE_EP_BOOTSTRAP_ADDRESS", addr.c_str(), 1);
      setenv("MOE_EP_JOB_TOKEN", token.c_str(), 1);
      for (const std::string& kv : extra_env) putenv(strdup(kv.c_str()));
      std::vector<char*> args;
      for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
    pids[r] = pid;
  }
  std::vector<RankExit> out(n);
  std::vector<bool> done(n, false);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  int remaining = n;
  while (remaining > 0) {
    for (int r = 0; r < n; r++) {
      if (done[r]) continue;
      int status = 0;
      if (waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        done[r] = true;
        remaining--;
        if (WIFEXITED(status)) out[r].code = WEXITSTATUS(status);
        if (WIFSIGNALED(status)) out[r].signal = WTERMSIG(status);
      }
    }
    if (remaining > 0 && std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < n; r++) {
        if (!done[r]) kill(pids[r], SIGKILL);
      }
      deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int r = 0; r < n; r++) {
    std::ifstream f(logs[r]);
    std::stringstream ss;
    ss << f.rdbuf();
    out[r].log = ss.str();
  }
  return out;
}

}  // namespace moe_ep_test
