/* pinned_pool.c: see pinned_pool.h. A short list under one lock: a group
 * takes two or three blocks at group_create and gives them back at
 * group_destroy, never on an operation's path. */
#include "runtime/nccl/pinned_pool.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "runtime/error.h"

typedef struct block {
  void *host;
  size_t bytes;
  int taken;
  struct block *next;
} block_t;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static block_t *g_blocks;

/* Whether `host` is still page-locked host memory (a device reset frees
 * pinned memory with its context). Does not wait for the device. */
static int still_pinned(void *host) {
  struct cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, host) != cudaSuccess) {
    (void)cudaGetLastError(); /* not the engine's error to find later */
    return 0;
  }
  return a.type == cudaMemoryTypeHost;
}

/* A free block of exactly `bytes`, marked taken; NULL if none. Blocks
 * found no longer pinned are unlinked (their memory went with a reset). */
static block_t *take_free(size_t bytes) {
  for (block_t **link = &g_blocks; *link != NULL;) {
    block_t *b = *link;
    if (b->taken || b->bytes != bytes) {
      link = &b->next;
      continue;
    }
    if (!still_pinned(b->host)) {
      *link = b->next;
      free(b);
      continue;
    }
    b->taken = 1;
    return b;
  }
  return NULL;
}

moe_ep_status_t mep_setup_cuda_status(int e) {
  if (e != cudaErrorMemoryAllocation) return MOE_EP_ERR_CUDA;
  (void)cudaGetLastError();
  return MOE_EP_ERR_NO_MEMORY;
}

moe_ep_status_t mep_pinned_take(size_t bytes, void **host, void **dev, const char *what) {
  *host = NULL;
  if (dev != NULL) *dev = NULL;
  pthread_mutex_lock(&g_lock);
  block_t *b = take_free(bytes);
  pthread_mutex_unlock(&g_lock);
  if (b == NULL) {
    b = calloc(1, sizeof(*b));
    if (b == NULL) return mep_error(MOE_EP_ERR_NO_MEMORY, "%s: out of host memory", what);
    cudaError_t e = cudaHostAlloc(&b->host, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
    if (e != cudaSuccess) {
      free(b);
      /* Taken during group_create only. */
      return mep_error(mep_setup_cuda_status(e), "%s: cudaHostAlloc of %zu bytes failed: %s",
                       what, bytes, cudaGetErrorString(e));
    }
    b->bytes = bytes;
    b->taken = 1;
    pthread_mutex_lock(&g_lock);
    b->next = g_blocks;
    g_blocks = b;
    pthread_mutex_unlock(&g_lock);
  }
  memset(b->host, 0, b->bytes);
  if (dev != NULL) {
    cudaError_t e = cudaHostGetDevicePointer(dev, b->host, 0);
    if (e != cudaSuccess) {
      mep_pinned_give(b->host);
      *dev = NULL;
      return mep_error(MOE_EP_ERR_CUDA, "%s: cudaHostGetDevicePointer failed: %s", what,
                       cudaGetErrorString(e));
    }
  }
  *host = b->host;
  return MOE_EP_OK;
}

void mep_pinned_give(void *host) {
  if (host == NULL) return;
  pthread_mutex_lock(&g_lock);
  for (block_t *b = g_blocks; b != NULL; b = b->next) {
    if (b->host == host) {
      b->taken = 0;
      break;
    }
  }
  pthread_mutex_unlock(&g_lock);
}
