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
#include "runtime/nccl/nccl_entries.h"

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
