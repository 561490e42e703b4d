/* nccl_stall_shim.c: a stand-in libnccl for the setup-stall test
 * (MOE_EP_NCCL_LIBRARY points moe-ep at it). Every NCCL function moe-ep
 * calls is forwarded to the real NCCL (libnccl.so.2 on the library path),
 * except that one rank stops at one setup step, as a rank that hung or fell
 * far behind there would:
 *   MEP_STALL=RANK:CALL:NTH:MS
 * rank RANK's NTH call of CALL in the process sleeps MS milliseconds
 * before it is forwarded. The rank is the one its (last) communicator was
 * created with. First calls may race: the lazily resolved pointers are
 * atomic, and resolving one twice is harmless. */
#define _GNU_SOURCE /* clock_gettime, nanosleep under -std=c11 */
#include <dlfcn.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <nccl_device/utility.h>
#undef NCCL_HOST_DEVICE_INLINE
#define NCCL_HOST_DEVICE_INLINE
#include <nccl_device/core.h>

#include "runtime/nccl/nccl_entries.h"

static int shim_rank = -1;
static int stall_calls;

static void *real_symbol(const char *name) {
  static void *lib;
  void *l = __atomic_load_n(&lib, __ATOMIC_ACQUIRE);
  if (l == NULL) {
    l = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    __atomic_store_n(&lib, l, __ATOMIC_RELEASE);
  }
  return l != NULL ? dlsym(l, name) : NULL;
}

static void maybe_stall(const char *name) {
  const char *spec = getenv("MEP_STALL");
  int rank = -1, nth = 0, ms = 0;
  char call[64] = {0};
  if (spec == NULL || sscanf(spec, "%d:%63[^:]:%d:%d", &rank, call, &nth, &ms) != 4) return;
  if (rank != __atomic_load_n(&shim_rank, __ATOMIC_ACQUIRE) || strcmp(call, name) != 0) return;
  if (__atomic_add_fetch(&stall_calls, 1, __ATOMIC_RELAXED) != nth) return;
  fprintf(stderr, "nccl_stall_shim: rank %d stops %d ms at %s call %d\n", rank, ms, name, nth);
  const struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* The generated forwarder of ncclCommInitRankConfig gets this name; the
 * exported one below notes the rank first. */
#define ncclCommInitRankConfig forward_ncclCommInitRankConfig

/* Local names with a prefix: the parameter lists name their own. */
#define FORWARD(ret, name, params, args, unloaded)                    \
  ret name params {                                                   \
    static void *shim_real;                                           \
    void *shim_fn = __atomic_load_n(&shim_real, __ATOMIC_ACQUIRE);    \
    if (shim_fn == NULL) {                                            \
      shim_fn = real_symbol(#name);                                   \
      __atomic_store_n(&shim_real, shim_fn, __ATOMIC_RELEASE);        \
    }                                                                 \
    if (shim_fn == NULL) return unloaded;                             \
    maybe_stall(#name);                                               \
    ret(*shim_call) params;                                           \
    *(void **)&shim_call = shim_fn;                                   \
    return shim_call args;                                            \
  }
MEP_NCCL_ENTRIES(FORWARD)

#undef ncclCommInitRankConfig

ncclResult_t ncclCommInitRankConfig(ncclComm_t *c, int n, ncclUniqueId id, int r,
                                    ncclConfig_t *f) {
  __atomic_store_n(&shim_rank, r, __ATOMIC_RELEASE);
  return forward_ncclCommInitRankConfig(c, n, id, r, f);
}
