/* group.h: the group object behind moe_ep_group_t and the runtime entry
 * points the plugin table forwards to. */
#ifndef MEP_GROUP_H_
#define MEP_GROUP_H_

#include <pthread.h>
#include <stdint.h>

#include "kernels/common/limits.h"
#include "moe_ep.h"
#include "runtime/backend.h"
#include "runtime/bootstrap.h"
#include "runtime/op.h"
#include "runtime/registry.h"

#ifdef __cplusplus
extern "C" {
#endif

struct moe_ep_hook {
  moe_ep_group_t *group;
  mep_op_t op;
  int32_t ran; /* hook_run already called */
  mep_deferred_free_t deferred; /* hook_free from inside an entry */
};

struct moe_ep_group {
  moe_ep_config_t cfg;
  int32_t rank;
  int32_t world_size;
  int32_t num_local_experts;
  int32_t num_sms;
  int32_t max_sms;
  int32_t default_sms; /* the backend's SMs while num_sms is 0 (0: every SM) */
  int32_t cuda_device;  /* params->cuda_device (nccl backend), -1 = current;
                           the device in use once the backend is created */
  void *nccl_comm;      /* engine's ncclComm_t to adopt, or NULL */
  uint64_t config_hash;
  uint64_t bytes_allocated;
  mep_bootstrap_t *boot;
  const mep_backend_ops_t *ops;
  void *impl; /* backend state */
  /* Serialises the group's entries: a hook may run on another thread, and
   * handles and hooks may be freed from any thread (see moe_ep.h,
   * "Threads"). Guards every field below and all handle and hook state. */
  pthread_mutex_t lock;
  uint64_t seq;                                   /* operations launched */
  moe_ep_hook_t *pending[MEP_NUM_BUFFER_SETS];    /* deferred receives */
  /* Frees queued from inside entries (mep_group_free): pushed without the
   * lock, taken by the lock's holder (atomic); those taken wait in
   * frees_taken, under the lock, for release once it is let go. */
  mep_deferred_free_t *frees_pending;
  mep_deferred_free_t *frees_taken;
  /* What the lock's holder had before it took the lock (an entry the
   * engine's logger called on another group's behalf), given back at
   * unlock: the group its thread was in and that thread's log level. */
  struct moe_ep_group *held_prev;
  int level_prev;
  /* A peer failure or timeout breaks the group for good: later calls
   * return the same status and sentence. */
  moe_ep_status_t broken;
  char broken_msg[512];
};

moe_ep_status_t mep_group_create(const moe_ep_group_params_t *params,
                                 moe_ep_group_t **out);
moe_ep_status_t mep_group_destroy(moe_ep_group_t *group);
moe_ep_status_t mep_group_info(const moe_ep_group_t *group,
                               moe_ep_group_info_t *info);
moe_ep_status_t mep_group_poll_error(moe_ep_group_t *group);
moe_ep_status_t mep_group_set_num_sms(moe_ep_group_t *group, int32_t num_sms);
moe_ep_status_t mep_group_max_sms_used(const moe_ep_group_t *group,
                                       int32_t *num_sms);
moe_ep_status_t mep_buffer_size_hint(const moe_ep_config_t *config,
                                     int32_t world_size, uint64_t *bytes);

/* A live group (from group_create, not destroyed). */
moe_ep_status_t mep_group_check(const moe_ep_group_t *group, const char *entry);
/* The recorded failure as this entry's error, or OK; call under the lock. */
moe_ep_status_t mep_group_broken_error(const moe_ep_group_t *group, const char *entry);
/* Entry guard: checks the group is live, takes its lock and makes its
 * log_level this thread's. Returns with the lock held only on OK. Every
 * read or write of the group's or its handles' and hooks' state happens
 * between this and mep_group_unlock. */
moe_ep_status_t mep_group_lock(moe_ep_group_t *group, const char *entry);
void mep_group_unlock(moe_ep_group_t *group);
/* Returns `call`, run under the group lock; its failure sentence names a
 * rank, and a communication failure breaks the group before the lock is
 * released. */
#define MEP_LOCKED_ENTRY(g, name, call)                    \
  do {                                                     \
    MEP_CHECK(mep_group_lock(g, name));                    \
    moe_ep_status_t st_ = (call);                          \
    if (st_ != MOE_EP_OK) mep_error_name_rank((g)->rank);  \
    if (mep_status_is_fatal(st_)) mep_group_break(g, st_); \
    mep_group_unlock(g);                                   \
    return st_;                                            \
  } while (0)
/* Frees a handle or hook: takes it out of the registry under its group's
 * lock, so an entry on another thread finishes with it first or finds it
 * gone; `then` (may be NULL) runs under that lock, and `release` after it,
 * when this call took it (of two threads freeing one object, exactly one
 * does). A destroyed group's object is only taken and released. Asked for
 * from inside an entry on this thread (the engine's logger, or a garbage
 * collector running in it), it never waits for a lock: unless the group's
 * lock is free, the object is taken and queued through `link` on its
 * group, whose lock holder finishes it before letting the lock go (or the
 * next one right after taking it, or group_destroy). */
void mep_group_free(void *obj, mep_obj_kind_t kind, mep_deferred_free_t *link, const char *entry,
                    void (*then)(moe_ep_group_t *group, void *obj), void (*release)(void *obj));
/* The live group owning a live handle or hook, for the entries that take
 * no group (hook_run, handle_layout); INVALID_ARGUMENT naming `entry` and
 * the object otherwise. Call before taking the lock. */
moe_ep_status_t mep_owner_group(const void *obj, mep_obj_kind_t kind, const char *entry,
                                moe_ep_group_t **group);
/* A live handle prepared on this group; call under the lock. */
moe_ep_status_t mep_handle_check(moe_ep_group_t *group, moe_ep_handle_t *h,
                                 const char *entry);
/* The device every tensor of this group must live on (MEP_DEVICE). */
int mep_group_device(const moe_ep_group_t *group);
/* Communication failures break the group; argument errors never do. */
int mep_status_is_fatal(moe_ep_status_t st);

/* Records a fatal communication failure (status + current last_error). */
moe_ep_status_t mep_group_break(moe_ep_group_t *group, moe_ep_status_t st);

/* prepare.c, ops.c */
moe_ep_status_t mep_prepare(moe_ep_group_t *group,
                            const moe_ep_prepare_params_t *params,
                            moe_ep_handle_t **out);
moe_ep_status_t mep_dispatch(moe_ep_group_t *group, moe_ep_handle_t *handle,
                             const moe_ep_dispatch_params_t *params,
                             moe_ep_hook_t **hook);
moe_ep_status_t mep_combine(moe_ep_group_t *group, moe_ep_handle_t *handle,
                            const moe_ep_combine_params_t *params,
                            moe_ep_hook_t **hook);
moe_ep_status_t mep_hook_run(moe_ep_hook_t *hook, void *stream);
moe_ep_status_t mep_group_busy_hook(moe_ep_group_t *group, moe_ep_hook_t **hook);
/* handle_layout.c */
moe_ep_status_t mep_handle_layout(moe_ep_handle_t *handle,
                                  const moe_ep_handle_layout_params_t *params);
void mep_hook_free(moe_ep_hook_t *hook);
void mep_handle_free(moe_ep_handle_t *handle);

#ifdef __cplusplus
}
#endif

#endif /* MEP_GROUP_H_ */
