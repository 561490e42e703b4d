/* ucx_quiet.c: see ucx_quiet.h. UCX calls its log handlers newest first
 * and stops at the first that says STOP, so the handler pushed here sees
 * every line before UCX's own printer, and passes on those that did not
 * come from the library's progress on this thread. */
#include "runtime/ucx_quiet.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>

#include <ucs/debug/log_def.h>

#include "runtime/log.h"
#include "runtime/pin_library.h"

static __thread int in_progress;
static unsigned long long lines_taken; /* atomic */
static unsigned errors_said;           /* atomic */
#define ERRORS_SAID_MAX 16
static pthread_once_t installed = PTHREAD_ONCE_INIT;

static ucs_log_func_rc_t take_line(const char *file, unsigned line, const char *function,
                                   ucs_log_level_t level,
                                   const ucs_log_component_config_t *comp_conf,
                                   const char *message, va_list ap) {
  (void)function, (void)comp_conf;
  if (!in_progress) return UCS_LOG_FUNC_RC_CONTINUE;
  __atomic_add_fetch(&lines_taken, 1, __ATOMIC_RELAXED);
  const int said = level <= UCS_LOG_LEVEL_ERROR &&
                   __atomic_fetch_add(&errors_said, 1, __ATOMIC_RELAXED) < ERRORS_SAID_MAX;
  const int as = said ? MOE_EP_LOG_WARN : MOE_EP_LOG_DEBUG;
  if (mep_log_level() >= as) {
    char text[256];
    va_list copy;
    va_copy(copy, ap);
    vsnprintf(text, sizeof(text), message, copy);
    va_end(copy);
    mep_log(as, "ucx", "UCX %s (%s:%u): %s", ucs_log_level_names[level], file, line, text);
  }
  return UCS_LOG_FUNC_RC_STOP;
}

/* UCX keeps the handler for the life of the process, so the library stays
 * mapped as long (an engine's dlclose would leave UCX calling unmapped
 * code). */
static void install(void) {
  mep_pin_library();
  ucs_log_push_handler(take_line);
}

void mep_ucx_quiet_enter(void) {
  pthread_once(&installed, install);
  in_progress++;
}

void mep_ucx_quiet_leave(void) { in_progress--; }

unsigned mep_ucx_progress(ucp_worker_h worker) {
  mep_ucx_quiet_enter();
  const unsigned n = ucp_worker_progress(worker);
  mep_ucx_quiet_leave();
  return n;
}

unsigned long long mep_ucx_lines_taken(void) {
  return __atomic_load_n(&lines_taken, __ATOMIC_RELAXED);
}
