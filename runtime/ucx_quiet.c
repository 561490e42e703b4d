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
static pthread_once_t installed = PTHREAD_ONCE_INIT;

static ucs_log_func_rc_t take_line(const char *file, unsigned line, const char *function,
                                   ucs_log_level_t level,
                                   const ucs_log_component_config_t *comp_conf,
                                   const char *message, va_list ap) {
  (void)function, (void)comp_conf;
  if (!in_progress) return UCS_LOG_FUNC_RC_CONTINUE;
  __atomic_add_fetch(&lines_taken, 1, __ATOMIC_RELAXED);
  if (mep_log_level() >= MOE_EP_LOG_DEBUG) {
    char text[256];
    va_list copy;
    va_copy(copy, ap);
    vsnprintf(text, sizeof(text), message, copy);
    va_end(copy);
    MEP_LOG_DEBUG("ucx", "UCX %s (%s:%u): %s", ucs_log_level_names[level], file, line, text);
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

unsigned mep_ucx_progress(ucp_worker_h worker) {
  pthread_once(&installed, install);
  in_progress++;
  const unsigned n = ucp_worker_progress(worker);
  in_progress--;
  return n;
}

unsigned long long mep_ucx_lines_taken(void) {
  return __atomic_load_n(&lines_taken, __ATOMIC_RELAXED);
}
