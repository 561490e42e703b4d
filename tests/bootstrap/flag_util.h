// flag_util.h: what the bootstrap test binaries (worker, stranger) share to
// read "--name=value" flags and the machine-wide monotonic clock.
#ifndef MEP_TESTS_BOOTSTRAP_FLAG_UTIL_H_
#define MEP_TESTS_BOOTSTRAP_FLAG_UTIL_H_

#include <stdint.h>
#include <string.h>
#include <time.h>

#include <string>

namespace mep_test {

// CLOCK_MONOTONIC in ms: one clock for every process on the machine, so
// the drivers can compare times the processes report.
inline int64_t MonoNowMs() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

// True when arg is "<name>=<value>"; then *val is the value.
inline bool Flag(const char *arg, const char *name, std::string *val) {
  size_t n = strlen(name);
  if (strncmp(arg, name, n) != 0 || arg[n] != '=') return false;
  *val = arg + n + 1;
  return true;
}

}  // namespace mep_test

#endif  // MEP_TESTS_BOOTSTRAP_FLAG_UTIL_H_
