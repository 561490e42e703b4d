/* log.h: the library's only way to emit text. Level from MOE_EP_LOG_LEVEL
 * (name or number), else the log_level of the group the calling thread works
 * for, else warn; an engine may install its own logger through set_logger.
 * Nothing else in the library prints. */
#ifndef MEP_LOG_H_
#define MEP_LOG_H_

#include "moe_ep.h"

#ifdef __cplusplus
extern "C" {
#endif

void mep_log(int level, const char *subsys, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int mep_log_level(void);
/* This thread now works for a group logging at `level` (-1: for none).
 * Group entries set it while they hold the group's lock; a thread the
 * library starts for a group sets it once. */
void mep_log_thread_level(int level);
/* The level this thread works at (-1: for no group): what a thread the
 * library starts while working for a group passes on to it. */
int mep_log_thread_level_now(void);
/* Whether this thread is inside the engine's logger, called by the library
 * (from an entry, group_create included, or the library's own threads). */
int mep_log_in_callback(void);
/* Installs fn (NULL: stderr) and returns once every callback already
 * running on another thread has returned. */
void mep_log_set_logger(moe_ep_logger_fn fn, void *user);

#define MEP_LOG_ERROR(sub, ...) mep_log(MOE_EP_LOG_ERROR, sub, __VA_ARGS__)
#define MEP_LOG_WARN(sub, ...) mep_log(MOE_EP_LOG_WARN, sub, __VA_ARGS__)
#define MEP_LOG_INFO(sub, ...) mep_log(MOE_EP_LOG_INFO, sub, __VA_ARGS__)
#define MEP_LOG_DEBUG(sub, ...) mep_log(MOE_EP_LOG_DEBUG, sub, __VA_ARGS__)

#ifdef __cplusplus
}
#endif

#endif /* MEP_LOG_H_ */
