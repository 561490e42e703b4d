/* nccl_context.c: saving, switching and restoring the calling thread's CUDA
 * context (see nccl_context.h). The driver's calls come from the runtime's
 * entry-point query: the library needs no libcuda at link time (a CPU-only
 * machine loads it for the host backend). */
#include "runtime/nccl/nccl_context.h"

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stddef.h>

#include "runtime/error.h"

/* CUresult cuCtxGetCurrent(CUcontext *), cuCtxSetCurrent(CUcontext),
 * cuDeviceGet(CUdevice *, int), cuDevicePrimaryCtxRetain(CUcontext *,
 * CUdevice), cuStreamGetCtx_v2(CUstream, CUcontext *, CUgreenCtx *). */
typedef int (*ctx_get_fn)(void **);
typedef int (*ctx_set_fn)(void *);
typedef int (*dev_get_fn)(int *, int);
typedef int (*retain_fn)(void **, int);
typedef int (*stream_ctx_fn)(void *, void **, void **);
static ctx_get_fn g_ctx_get;
static ctx_set_fn g_ctx_set;
static dev_get_fn g_dev_get;
static retain_fn g_retain;
static stream_ctx_fn g_stream_ctx;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
enum { CU_SUCCESS = 0, CU_NOT_INITIALIZED = 3 };

/* Primary contexts, retained once per device for the life of the process
 * (an engine does not reset a device under a live group). */
#define MAX_DEVICES 256
static void *g_primary[MAX_DEVICES];

/* The driver's `name` in the form of CUDA `version` (12000: 12.0). */
static void *entry_at(const char *name, unsigned int version) {
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(name, &fn, version, cudaEnableDefault, &q) !=
          cudaSuccess ||
      q != cudaDriverEntryPointSuccess) {
    return NULL;
  }
  return fn;
}

static void *entry(const char *name) { return entry_at(name, 12000); }

/* Saving and restoring needs the first pair; switching to a primary
 * context the second too (without it, switching falls back to
 * cudaSetDevice while the caller's context is still restored). */
static void resolve(void) {
  void *get = entry("cuCtxGetCurrent"), *set = entry("cuCtxSetCurrent");
  if (get == NULL || set == NULL) return;
  g_ctx_get = (ctx_get_fn)get;
  g_ctx_set = (ctx_set_fn)set;
  /* The form that reports a green context's stream under its device's
   * primary context (CUDA 12.5); the older one would name the green
   * context's own, so without it streams are not judged. */
  g_stream_ctx = (stream_ctx_fn)entry_at("cuStreamGetCtx", 12050);
  void *dev = entry("cuDeviceGet"), *retain = entry("cuDevicePrimaryCtxRetain");
  if (dev == NULL || retain == NULL) return;
  g_dev_get = (dev_get_fn)dev;
  g_retain = (retain_fn)retain;
}

static void *primary_ctx(int device) {
  if (g_retain == NULL || device < 0 || device >= MAX_DEVICES) return NULL;
  void *ctx = __atomic_load_n(&g_primary[device], __ATOMIC_ACQUIRE);
  if (ctx != NULL) return ctx;
  int cudev = 0;
  if (g_dev_get(&cudev, device) != CU_SUCCESS || g_retain(&ctx, cudev) != CU_SUCCESS) {
    return NULL;
  }
  void *none = NULL;
  /* Two threads may race here; the loser's extra reference is harmless. */
  if (!__atomic_compare_exchange_n(&g_primary[device], &none, ctx, 0, __ATOMIC_ACQ_REL,
                                   __ATOMIC_ACQUIRE)) {
    ctx = none;
  }
  return ctx;
}

static void caller_save(mep_nccl_caller_t *c) {
  pthread_once(&g_once, resolve);
  c->ctx = NULL;
  c->have_ctx = 0;
  c->device = -1;
  c->switched = 1; /* restore checks */
  if (g_ctx_get != NULL) {
    int rc = g_ctx_get(&c->ctx);
    /* Before the driver is initialised no thread has a context. */
    if (rc == CU_NOT_INITIALIZED) c->ctx = NULL;
    c->have_ctx = rc == CU_SUCCESS || rc == CU_NOT_INITIALIZED;
  }
  if (!c->have_ctx && cudaGetDevice(&c->device) != cudaSuccess) c->device = -1;
}

static void caller_restore(const mep_nccl_caller_t *c) {
  if (c->have_ctx) {
    void *now = NULL;
    if (g_ctx_get(&now) != CU_SUCCESS || now != c->ctx) (void)g_ctx_set(c->ctx);
    return;
  }
  int now = -1;
  if (c->device >= 0 && (cudaGetDevice(&now) != cudaSuccess || now != c->device)) {
    cudaSetDevice(c->device);
  }
}

moe_ep_status_t mep_nccl_make_current(int device) {
  pthread_once(&g_once, resolve);
  void *primary = primary_ctx(device);
  if (primary != NULL) {
    void *now = NULL;
    if (g_ctx_get(&now) == CU_SUCCESS && now == primary) return MOE_EP_OK;
    int rc = g_ctx_set(primary);
    if (rc != CU_SUCCESS) {
      return mep_error(MOE_EP_ERR_CUDA,
                       "backend nccl: making GPU %d's primary context current failed "
                       "(CUresult %d)",
                       device, rc);
    }
    return MOE_EP_OK;
  }
  int now = -1;
  if (cudaGetDevice(&now) == cudaSuccess && now == device) return MOE_EP_OK;
  cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) {
    return mep_error(MOE_EP_ERR_CUDA, "backend nccl: cudaSetDevice(%d) failed: %s", device,
                     cudaGetErrorString(e));
  }
  return MOE_EP_OK;
}

moe_ep_status_t mep_nccl_enter(int device, mep_nccl_caller_t *c) {
  caller_save(c);
  if (c->have_ctx) {
    void *primary = primary_ctx(device);
    if (primary != NULL && c->ctx == primary) {
      c->switched = 0;
      return MOE_EP_OK;
    }
  }
  moe_ep_status_t st = mep_nccl_make_current(device);
  if (st != MOE_EP_OK) caller_restore(c);
  return st;
}

moe_ep_status_t mep_nccl_leave(const mep_nccl_caller_t *c, moe_ep_status_t st) {
  if (c->switched) caller_restore(c);
  return st;
}

int mep_nccl_stream_here(void *stream) {
  pthread_once(&g_once, resolve);
  if (g_stream_ctx == NULL) return 1;
  void *now = NULL, *ctx = NULL, *green = NULL;
  if (g_ctx_get(&now) != CU_SUCCESS || now == NULL) return 1;
  if (g_stream_ctx(stream, &ctx, &green) != CU_SUCCESS) return 1;
  return ctx == now;
}

moe_ep_status_t mep_nccl_as_caller(moe_ep_status_t (*fn)(moe_ep_group_t *g), moe_ep_group_t *g) {
  mep_nccl_caller_t caller;
  caller_save(&caller);
  moe_ep_status_t st = fn(g);
  caller_restore(&caller);
  return st;
}
