/* error.c: thread-local last-error text and status names. */
#include "runtime/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "runtime/log.h"

static __thread char tls_error[MEP_ERROR_MAX];

moe_ep_status_t mep_error(moe_ep_status_t status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tls_error, sizeof(tls_error), fmt, ap);
  va_end(ap);
  mep_log(MOE_EP_LOG_DEBUG, "error", "%s: %s", mep_status_string(status),
          tls_error);
  return status;
}

/* The current message with a formatted piece in front ("piece: message")
 * or after it ("message; piece"). */
static void recompose(int after, const char *fmt, va_list ap) {
  char piece[512];
  char old[MEP_ERROR_MAX];
  vsnprintf(piece, sizeof(piece), fmt, ap);
  memcpy(old, tls_error, sizeof(old));
  if (after) {
    snprintf(tls_error, sizeof(tls_error), "%s; %s", old, piece);
  } else {
    snprintf(tls_error, sizeof(tls_error), "%s: %s", piece, old);
  }
}

void mep_error_prefix(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  recompose(0, fmt, ap);
  va_end(ap);
}

moe_ep_status_t mep_error_suffix(moe_ep_status_t status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  recompose(1, fmt, ap);
  va_end(ap);
  mep_log(MOE_EP_LOG_DEBUG, "error", "%s: %s", mep_status_string(status), tls_error);
  return status;
}

void mep_error_name_rank(int rank) {
  for (const char *p = strstr(tls_error, "rank "); p != NULL; p = strstr(p + 5, "rank ")) {
    if (p[5] >= '0' && p[5] <= '9') return;
  }
  mep_error_prefix("rank %d", rank);
}

const char *mep_last_error(void) { return tls_error; }

void mep_error_clear(void) { tls_error[0] = '\0'; }

void mep_error_save(mep_error_saved_t *saved) {
  snprintf(saved->text, sizeof(saved->text), "%s", tls_error);
}

void mep_error_restore(const mep_error_saved_t *saved) {
  snprintf(tls_error, sizeof(tls_error), "%s", saved->text);
}

const char *mep_status_string(moe_ep_status_t status) {
  switch (status) {
    case MOE_EP_OK: return "MOE_EP_OK";
    case MOE_EP_ERR_INVALID_ARGUMENT: return "MOE_EP_ERR_INVALID_ARGUMENT";
    case MOE_EP_ERR_CONFIG: return "MOE_EP_ERR_CONFIG";
    case MOE_EP_ERR_UNSUPPORTED: return "MOE_EP_ERR_UNSUPPORTED";
    case MOE_EP_ERR_NO_MEMORY: return "MOE_EP_ERR_NO_MEMORY";
    case MOE_EP_ERR_BOOTSTRAP: return "MOE_EP_ERR_BOOTSTRAP";
    case MOE_EP_ERR_PEER_FAILED: return "MOE_EP_ERR_PEER_FAILED";
    case MOE_EP_ERR_TIMEOUT: return "MOE_EP_ERR_TIMEOUT";
    case MOE_EP_ERR_MISMATCH: return "MOE_EP_ERR_MISMATCH";
    case MOE_EP_ERR_CUDA: return "MOE_EP_ERR_CUDA";
    case MOE_EP_ERR_NCCL: return "MOE_EP_ERR_NCCL";
    case MOE_EP_ERR_UCX: return "MOE_EP_ERR_UCX";
    case MOE_EP_ERR_BUSY: return "MOE_EP_ERR_BUSY";
    case MOE_EP_ERR_INTERNAL: return "MOE_EP_ERR_INTERNAL";
    case MOE_EP_STATUS_COUNT_: break;
  }
  return "MOE_EP_ERR_UNKNOWN";
}
