/* log.c: one sink for every library message; engine callback or stderr.
 * The level is per group: a thread working for a group (an entry holding
 * the group's lock, group_create, a backend thread) logs at that group's
 * log_level; MOE_EP_LOG_LEVEL overrides every group. */
#include "runtime/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "runtime/error.h"

static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static int env_level = -1; /* MOE_EP_LOG_LEVEL, or -1 when unset */
/* The level of the group this thread works for, or -1. */
static __thread int thread_level = -1;

/* The engine's logger, and how many of its calls are running: set_logger
 * waits for them, so the engine knows when its `user` may be freed. */
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t log_idle = PTHREAD_COND_INITIALIZER;
static moe_ep_logger_fn log_fn;
static void *log_user;
/* Calls running through the installed logger (current, made in generation
 * log_gen) and through loggers already replaced (replaced): set_logger
 * moves the current count to the replaced one and waits for that alone,
 * so messages that keep coming through the new logger cannot keep it
 * waiting, also when several setters overlap. */
static uint64_t log_gen;
static int log_current, log_replaced;
static __thread int thread_in_callback;

static const char *const level_names[] = {"none", "error", "warn",
                                          "info", "debug", "trace"};

/* A MOE_EP_LOG_LEVEL that names no level: ignored, and said once, at the
 * first line the library logs (the environment cannot return an error). */
static char env_bad[64];
static int env_bad_told;

/* MOE_EP_LOG_LEVEL accepts a name ("info") or a number (3). */
static void log_init_from_env(void) {
  const char *env = getenv("MOE_EP_LOG_LEVEL");
  if (env == NULL || *env == '\0') return;
  for (int i = 0; i <= MOE_EP_LOG_TRACE; i++) {
    if (strcasecmp(env, level_names[i]) == 0) {
      env_level = i;
      return;
    }
  }
  /* One digit, exactly as the config's reader takes it (config_keys.c), so
   * the two never disagree on a value such as "03". */
  if (env[0] >= '0' && env[0] <= '0' + MOE_EP_LOG_TRACE && env[1] == '\0') {
    env_level = env[0] - '0';
    return;
  }
  snprintf(env_bad, sizeof(env_bad), "%s", env);
}

int mep_log_level(void) {
  pthread_once(&log_once, log_init_from_env);
  /* The environment wins over the config, so an operator can raise the
   * level without editing the engine's YAML. */
  if (env_level >= 0) return env_level;
  return thread_level >= 0 ? thread_level : MOE_EP_LOG_WARN;
}

void mep_log_thread_level(int level) {
  thread_level = level >= MOE_EP_LOG_NONE && level <= MOE_EP_LOG_TRACE ? level : -1;
}

int mep_log_thread_level_now(void) { return thread_level; }

int mep_log_in_callback(void) { return thread_in_callback > 0; }

void mep_log_set_logger(moe_ep_logger_fn fn, void *user) {
  pthread_mutex_lock(&log_lock);
  log_fn = fn;
  log_user = user;
  log_replaced += log_current;
  log_current = 0;
  log_gen++;
  /* A logger that replaces itself from inside its own callback would wait
   * for itself: from a callback, the swap is all that happens. */
  while (log_replaced > 0 && thread_in_callback == 0) {
    pthread_cond_wait(&log_idle, &log_lock);
  }
  pthread_mutex_unlock(&log_lock);
}

/* One write per line, so the lines of ranks sharing a stderr pipe (a
 * launcher's) do not cut into each other: a pipe keeps a write of up to
 * PIPE_BUF (4096) bytes whole, and a line is at most 1281. stdio's
 * unbuffered stderr may split one line into several writes. */
static void write_stderr_line(const char *msg) {
  char line[1282];
  size_t n = strlen(msg);
  if (n > sizeof line - 2) n = sizeof line - 2;
  memcpy(line, msg, n);
  line[n] = '\n';
  for (size_t off = 0; off <= n;) {
    const ssize_t w = write(STDERR_FILENO, line + off, n + 1 - off);
    if (w <= 0) return; /* nowhere to report it */
    off += (size_t)w;
  }
}

void mep_log(int level, const char *subsys, const char *fmt, ...) {
  const int shown = mep_log_level();
  if (env_bad[0] != '\0' && !__atomic_exchange_n(&env_bad_told, 1, __ATOMIC_ACQ_REL)) {
    mep_log(MOE_EP_LOG_WARN, "log",
            "MOE_EP_LOG_LEVEL='%s' is not a level (none, error, warn, info, debug, trace, "
            "or 0..5); it is ignored",
            env_bad);
  }
  if (level > shown || level <= MOE_EP_LOG_NONE) return;
  /* A line of an entry the logger itself called (which fails at once on
   * the group whose entry is logging): not handed to the logger again,
   * whose every line could otherwise call it once more. */
  if (thread_in_callback > 0) return;
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
   * be slow, without blocking other threads' messages. */
  pthread_mutex_lock(&log_lock);
  moe_ep_logger_fn fn = log_fn;
  void *user = log_user;
  const uint64_t gen = log_gen;
  if (fn != NULL) log_current++;
  pthread_mutex_unlock(&log_lock);
  if (fn == NULL) {
    write_stderr_line(msg);
    return;
  }
  /* The logger may call into the library (last_error, or an entry that
   * fails at once): the sentence of the entry that is logging stays this
   * thread's last error. */
  mep_error_saved_t saved;
  mep_error_save(&saved);
  thread_in_callback++;
  fn(user, level, msg);
  thread_in_callback--;
  mep_error_restore(&saved);
  pthread_mutex_lock(&log_lock);
  if (gen == log_gen) {
    log_current--;
  } else if (--log_replaced == 0) {
    pthread_cond_broadcast(&log_idle);
  }
  pthread_mutex_unlock(&log_lock);
}
