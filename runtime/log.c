/* log.c: one sink for every library message; engine callback or stderr. */
#include "runtime/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static int log_level = MOE_EP_LOG_WARN;
static moe_ep_logger_fn log_fn;
static void *log_user;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *const level_names[] = {"none", "error", "warn",
                                          "info", "debug", "trace"};

/* MOE_EP_LOG_LEVEL accepts a name ("info") or a number (3). */
static void log_init_from_env(void) {
  const char *env = getenv("MOE_EP_LOG_LEVEL");
  if (env == NULL || *env == '\0') return;
  for (int i = 0; i <= MOE_EP_LOG_TRACE; i++) {
    if (strcasecmp(env, level_names[i]) == 0) {
      log_level = i;
      return;
    }
  }
  char *end = NULL;
  long v = strtol(env, &end, 10);
  if (end != env && *end == '\0' && v >= 0 && v <= MOE_EP_LOG_TRACE) {
    log_level = (int)v;
  }
}

int mep_log_level(void) {
  pthread_once(&log_once, log_init_from_env);
  return log_level;
}

void mep_log_set_level(int level) {
  pthread_once(&log_once, log_init_from_env);
  /* The environment wins over the config, so an operator can raise the
   * level without editing the engine's YAML. */
  const char *env = getenv("MOE_EP_LOG_LEVEL");
  if (env != NULL && *env != '\0') return;
  if (level >= MOE_EP_LOG_NONE && level <= MOE_EP_LOG_TRACE) log_level = level;
}

void mep_log_set_logger(moe_ep_logger_fn fn, void *user) {
  pthread_mutex_lock(&log_lock);
  log_fn = fn;
  log_user = user;
  pthread_mutex_unlock(&log_lock);
}

void mep_log(int level, const char *subsys, const char *fmt, ...) {
  if (level > mep_log_level() || level <= MOE_EP_LOG_NONE) return;
  char msg[1280];
  int n = snprintf(msg, sizeof(msg), "moe_ep %s [%s] ", level_names[level],
                   subsys);
  va_list ap;
  va_start(ap, fmt);
  if (n > 0 && (size_t)n < sizeof(msg)) {
    vsnprintf(msg + n, sizeof(msg) - (size_t)n, fmt, ap);
  }
  va_end(ap);
  /* The engine's logger runs outside the lock: it may log back into us, or
   * be slow, without blocking other threads. */
  pthread_mutex_lock(&log_lock);
  moe_ep_logger_fn fn = log_fn;
  void *user = log_user;
  pthread_mutex_unlock(&log_lock);
  if (fn != NULL) {
    fn(user, level, msg);
  } else {
    fprintf(stderr, "%s\n", msg);
  }
}
