/* error.h: the thread-local "last error" sentence behind moe_ep last_error().
 * The first function that detects a failure calls mep_error(); callers only
 * propagate the status (UCX style). */
#ifndef MEP_ERROR_H_
#define MEP_ERROR_H_

#include "moe_ep.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MEP_ERROR_MAX 1024

/* Formats the message into this thread's buffer, logs it at DEBUG and
 * returns `status` so callers can `return mep_error(...)`. */
moe_ep_status_t mep_error(moe_ep_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prefixes the current message with context ("group_create: ..."). */
void mep_error_prefix(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Appends what follows from the failure ("<message>; <suffix>") and
 * returns `status`, which may differ from the one that made the message. */
moe_ep_status_t mep_error_suffix(moe_ep_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Every failure sentence names a rank (the one that failed, or the one it
 * blames): a sentence naming none ("rank " and a digit) gets "rank <rank>: "
 * in front. */
void mep_error_name_rank(int rank);

const char *mep_last_error(void); /* never NULL */
void mep_error_clear(void);
/* This thread's sentence, kept across code whose errors are not the
 * entry's own: the logger's calls into the library, the deferred frees. */
typedef struct mep_error_saved {
  char text[MEP_ERROR_MAX];
} mep_error_saved_t;
void mep_error_save(mep_error_saved_t *saved);
void mep_error_restore(const mep_error_saved_t *saved);
const char *mep_status_string(moe_ep_status_t status);

/* Propagation helper: evaluate, return on failure. */
#define MEP_CHECK(expr)                       \
  do {                                        \
    moe_ep_status_t mep_st_ = (expr);         \
    if (mep_st_ != MOE_EP_OK) return mep_st_; \
  } while (0)

#define MEP_CHECK_GOTO(expr, st, label) \
  do {                                  \
    (st) = (expr);                      \
    if ((st) != MOE_EP_OK) goto label;  \
  } while (0)

#ifdef __cplusplus
}
#endif

#endif /* MEP_ERROR_H_ */
