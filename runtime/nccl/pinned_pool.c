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

/* The smallest free block of at least `bytes`, marked taken; NULL if none. */
static block_t *take_free(size_t bytes) {
  block_t *best = NULL;
  for (block_t *b = g_blocks; b != NULL; b = b->next) {
    if (!b->taken && b->bytes >= bytes && (best == NULL || b->bytes < best->bytes)) best = b;
  }
  if (best != NULL) best->taken = 1;
  return best;
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
      return mep_error(MOE_EP_ERR_CUDA, "%s: cudaHostAlloc of %zu bytes failed: %s", what,
                       bytes, cudaGetErrorString(e));
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
