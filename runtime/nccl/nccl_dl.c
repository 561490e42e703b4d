/* nccl_dl.c: NCCL host entry points resolved with dlopen (see nccl_dl.h).
 * Each definition below has NCCL's own prototype, so nccl_setup.c calls
 * NCCL as usual; the symbols stay hidden inside libmoe_ep.so. */
#include "runtime/nccl/nccl_dl.h"

#include <dlfcn.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include <nccl_device/utility.h>
#undef NCCL_HOST_DEVICE_INLINE
#define NCCL_HOST_DEVICE_INLINE
#include <nccl_device/core.h>

#include "runtime/error.h"

/* X(return type, name, parameter list, argument list, value if unloaded) */
#define MEP_NCCL_ENTRIES(X)                                                         \
  X(ncclResult_t, ncclGetVersion, (int *v), (v), ncclSystemError)                   \
  X(ncclResult_t, ncclGetUniqueId, (ncclUniqueId * id), (id), ncclSystemError)      \
  X(ncclResult_t, ncclCommInitRank, (ncclComm_t * c, int n, ncclUniqueId id, int r), \
    (c, n, id, r), ncclSystemError)                                                 \
  X(ncclResult_t, ncclCommCount, (const ncclComm_t c, int *n), (c, n), ncclSystemError) \
  X(ncclResult_t, ncclCommUserRank, (const ncclComm_t c, int *r), (c, r), ncclSystemError) \
  X(ncclResult_t, ncclCommFinalize, (ncclComm_t c), (c), ncclSystemError)          \
  X(ncclResult_t, ncclCommDestroy, (ncclComm_t c), (c), ncclSystemError)           \
  X(ncclResult_t, ncclCommAbort, (ncclComm_t c), (c), ncclSystemError)             \
  X(ncclResult_t, ncclMemAlloc, (void **p, size_t n), (p, n), ncclSystemError)      \
  X(ncclResult_t, ncclMemFree, (void *p), (p), ncclSystemError)                    \
  X(ncclResult_t, ncclCommWindowRegister,                                          \
    (ncclComm_t c, void *b, size_t n, ncclWindow_t *w, int f), (c, b, n, w, f),    \
    ncclSystemError)                                                               \
  X(ncclResult_t, ncclCommWindowDeregister, (ncclComm_t c, ncclWindow_t w), (c, w), \
    ncclSystemError)                                                               \
  X(ncclResult_t, ncclDevCommCreate,                                               \
    (ncclComm_t c, ncclDevCommRequirements_t const *q, ncclDevComm_t *d), (c, q, d), \
    ncclSystemError)                                                               \
  X(ncclResult_t, ncclDevCommDestroy, (ncclComm_t c, ncclDevComm_t const *d), (c, d), \
    ncclSystemError)                                                               \
  X(ncclResult_t, ncclAllReduce,                                                   \
    (const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t o, ncclComm_t c, \
     cudaStream_t st),                                                             \
    (s, r, n, t, o, c, st), ncclSystemError)                                       \
  X(ncclResult_t, ncclAllGather,                                                   \
    (const void *s, void *r, size_t n, ncclDataType_t t, ncclComm_t c, cudaStream_t st), \
    (s, r, n, t, c, st), ncclSystemError)                                          \
  X(ncclTeam_t, ncclTeamLsa, (ncclComm_t c), (c), (ncclTeam_t){0})                \
  X(const char *, ncclGetErrorString, (ncclResult_t r), (r), "NCCL is not loaded") \
  X(const char *, ncclGetLastError, (ncclComm_t c), (c), "NCCL is not loaded")

#define DECLARE_POINTER(ret, name, params, args, unloaded) static ret(*p_##name) params;
MEP_NCCL_ENTRIES(DECLARE_POINTER)

static pthread_once_t dl_once = PTHREAD_ONCE_INIT;
static void *dl_lib;
static char dl_error[600];

static void dl_open(void) {
  const char *path = getenv("MOE_EP_NCCL_LIBRARY");
  if (path == NULL || *path == '\0') path = "libnccl.so.2";
  dl_lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (dl_lib == NULL) {
    const char *why = dlerror();
    snprintf(dl_error, sizeof dl_error,
             "backend nccl: cannot load NCCL from '%s' (%s); put NCCL 2.28.9's lib "
             "folder first on LD_LIBRARY_PATH or set MOE_EP_NCCL_LIBRARY",
             path, why ? why : "unknown error");
    return;
  }
#define RESOLVE(ret, name, params, args, unloaded)                                  \
  if (dl_error[0] == '\0') {                                                        \
    *(void **)&p_##name = dlsym(dl_lib, #name);                                     \
    if (p_##name == NULL)                                                           \
      snprintf(dl_error, sizeof dl_error,                                           \
               "backend nccl: '%s' lacks %s; moe-ep needs NCCL 2.28 or newer with " \
               "the Device API",                                                    \
               path, #name);                                                        \
  }
  MEP_NCCL_ENTRIES(RESOLVE)
}

moe_ep_status_t mep_nccl_dl_load(void) {
  pthread_once(&dl_once, dl_open);
  if (dl_error[0] != '\0') return mep_error(MOE_EP_ERR_NCCL, "%s", dl_error);
  return MOE_EP_OK;
}

#define FORWARD(ret, name, params, args, unloaded) \
  ret name params {                                \
    if (mep_nccl_dl_load() != MOE_EP_OK) return unloaded; \
    return p_##name args;                          \
  }
MEP_NCCL_ENTRIES(FORWARD)
