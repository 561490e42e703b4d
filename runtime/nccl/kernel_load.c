/* kernel_load.c: a group's kernels loaded on a thread of its own, waited
 * for with a deadline (kernel_load.h). */
#define _GNU_SOURCE /* nanosleep under -std=c11 */
#include "runtime/nccl/kernel_load.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kernels/common/prepare_layout.h"
#include "runtime/error.h"
#include "runtime/log.h"
#include "runtime/pin_library.h"
#include "runtime/nccl/nccl_context.h"
#include "runtime/nccl/nccl_wait.h"

/* A load takes milliseconds: polling every 200 us keeps the wait's own
 * delay negligible without spinning a core. */
#define MEP_LOAD_POLL_NS 200000L

/* Shared by the caller and the thread; the last of the two to let go frees
 * it, so a caller that gave up leaves the thread memory of its own. */
typedef struct load_job {
  atomic_int refs;
  atomic_int done;
  int device;
  mep_kernel_load_fn mode_load; /* then prepare's (mep_prepare_layout_load) */
  int log_level;                /* the group's: the thread works for it */
  moe_ep_status_t status;
  char why[512]; /* the failed step's sentence (thread-local on the thread) */
} load_job_t;

static void job_release(load_job_t *j) {
  if (atomic_fetch_sub(&j->refs, 1) == 1) free(j);
}

static void *load_main(void *arg) {
  load_job_t *j = arg;
  mep_log_thread_level(j->log_level);
  moe_ep_status_t st = mep_nccl_make_current(j->device);
  if (st != MOE_EP_OK) {
    snprintf(j->why, sizeof(j->why), "%s", mep_last_error());
  } else if (j->mode_load() != MEP_KSTATUS_OK || mep_prepare_layout_load() != MEP_KSTATUS_OK) {
    snprintf(j->why, sizeof(j->why), "%s", mep_kernels_last_error());
    st = MOE_EP_ERR_CUDA;
  }
  j->status = st;
  atomic_store(&j->done, 1); /* publishes status and why */
  job_release(j);
  return NULL;
}

/* Runs mode_load and prepare's load on a thread of its own with `device`'s
 * primary context current, waiting at most timeout_ms
 * (mep_nccl_group_load_kernels). */
static moe_ep_status_t load_kernels(int device, mep_kernel_load_fn mode_load, int32_t timeout_ms,
                                    int rank, const char *what) {
  load_job_t *j = calloc(1, sizeof(*j));
  if (j == NULL) return mep_error(MOE_EP_ERR_NO_MEMORY, "rank %d: out of memory", rank);
  atomic_init(&j->refs, 2);
  atomic_init(&j->done, 0);
  j->device = device;
  j->mode_load = mode_load;
  j->log_level = mep_log_thread_level_now(); /* group_create's: the group's level */
  pthread_t thread;
  const int rc = pthread_create(&thread, NULL, load_main, j);
  if (rc != 0) {
    free(j);
    return mep_error(MOE_EP_ERR_INTERNAL, "rank %d: cannot start a thread to load the %s kernels "
                     "(error %d)", rank, what, rc);
  }
  const int64_t deadline = mep_nccl_now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
  while (!atomic_load(&j->done) && mep_nccl_now_ms() < deadline) {
    const struct timespec ts = {0, MEP_LOAD_POLL_NS};
    nanosleep(&ts, NULL);
  }
  moe_ep_status_t st;
  if (!atomic_load(&j->done)) {
    /* The thread goes on inside the library's code: the library must stay
     * mapped after an engine's dlclose. */
    pthread_detach(thread);
    mep_pin_library();
    st = mep_error(MOE_EP_ERR_TIMEOUT,
                   "rank %d: loading the %s kernels did not end within bootstrap.timeout_ms "
                   "(%d ms): a kernel's first load waits for every kernel running on the "
                   "device, and some work on this GPU did not end",
                   rank, what, (int)timeout_ms);
  } else {
    pthread_join(thread, NULL); /* it has published its result: it is returning */
    st = j->status == MOE_EP_OK
             ? MOE_EP_OK
             : mep_error(j->status, "rank %d: loading the %s kernels failed: %s", rank, what,
                         j->why);
  }
  job_release(j);
  return st;
}

moe_ep_status_t mep_nccl_group_load_kernels(const moe_ep_group_t *g, int device,
                                            mep_kernel_load_fn mode_load, const char *what) {
  if (g->nccl_comm != NULL) return MOE_EP_OK;
  const int64_t t0 = mep_nccl_now_ms();
  moe_ep_status_t st = load_kernels(device, mode_load, g->cfg.bootstrap_timeout_ms, g->rank, what);
  if (st != MOE_EP_OK) {
    mep_error_prefix("group_create");
    return st;
  }
  MEP_LOG_INFO("nccl", "rank %d: the %s kernels loaded in %lld ms", g->rank, what,
               (long long)(mep_nccl_now_ms() - t0));
  return MOE_EP_OK;
}
