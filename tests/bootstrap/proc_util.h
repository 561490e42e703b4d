// proc_util.h: helpers for the multi-process bootstrap tests: start a real
// process (fork/exec) with captured stdout/stderr, wait for groups of them
// with a deadline, parse the worker's "RESULT key=value ... msg=..." line.
#ifndef MEP_TESTS_BOOTSTRAP_PROC_UTIL_H_
#define MEP_TESTS_BOOTSTRAP_PROC_UTIL_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace mep_test {

struct Proc {
  std::string name;  // "rank 3", "stranger(wrong token)", ...
  pid_t pid = -1;
  int out_fd = -1;
  int err_fd = -1;
  std::string out;
  std::string err;
  bool running = false;
  int wait_status = 0;
  int64_t start_ms = 0;
  int64_t end_ms = 0;
  bool killed_by_us = false;

  bool Exited(int code) const;
  bool Signaled(int sig) const;
  std::string Describe() const;  // how it ended + its output, for failures
  // The worker's RESULT fields ("status", "msg", "op_ms", ...).
  std::map<std::string, std::string> Result() const;
  int64_t ResultInt(const std::string &key) const;
};

int64_t NowMs();
// Starts argv with extra environment entries ("KEY=VALUE").
Proc Spawn(const std::string &name, const std::vector<std::string> &argv,
           const std::vector<std::string> &env = {});
// Collects output and exit statuses until all ended or deadline_ms (absolute,
// NowMs clock) passed; the rest are SIGKILLed and flagged killed_by_us.
void WaitAll(std::vector<Proc *> procs, int64_t deadline_ms);
void WaitOne(Proc *p, int64_t deadline_ms);
// Index of the first of procs to end before deadline_ms, or -1; kills none.
int WaitAny(std::vector<Proc *> procs, int64_t deadline_ms);
// Kill with a signal and reap (bounded).
void KillNow(Proc *p, int sig);
// Path of a runfile: argv flag value or the test's runfiles tree.
std::string Runfile(const std::string &path);
// argv of one bootstrap_worker rank ("" token: --no_token).
std::vector<std::string> WorkerArgv(int rank, int world,
                                    const std::string &scenario,
                                    const std::string &address,
                                    const std::string &token, int timeout_ms);

}  // namespace mep_test

#endif  // MEP_TESTS_BOOTSTRAP_PROC_UTIL_H_
