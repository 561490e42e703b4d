/* graph_watch.c: see graph_watch.h. The count lives in a block of its own,
 * referenced by the group and by every user object CUDA holds, because
 * CUDA may release the last graph after the group is gone. */
#define _POSIX_C_SOURCE 200809L /* nanosleep, clock_gettime */
#include "runtime/nccl/graph_watch.h"

#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "runtime/pin_library.h"

/* Captures noted most recently: a capture holds a layer's every call, and
 * noting each of them again would add a user object per call. */
#define MEP_WATCH_SEEN 8

struct mep_graph_watch {
  int refs;     /* atomic: the group's, and one per user object */
  int64_t live; /* atomic: user objects CUDA has not released */
  pthread_mutex_t lock; /* seen, next: calls on two threads may note at once */
  unsigned long long seen[MEP_WATCH_SEEN];
  int next;
};

mep_graph_watch_t *mep_graph_watch_create(void) {
  mep_graph_watch_t *w = calloc(1, sizeof(*w));
  if (w == NULL) return NULL;
  if (pthread_mutex_init(&w->lock, NULL) != 0) {
    free(w);
    return NULL;
  }
  w->refs = 1;
  return w;
}

static void unref(mep_graph_watch_t *w) {
  if (__atomic_sub_fetch(&w->refs, 1, __ATOMIC_ACQ_REL) != 0) return;
  pthread_mutex_destroy(&w->lock);
  free(w);
}

void mep_graph_watch_drop(mep_graph_watch_t *w) {
  if (w != NULL) unref(w);
}

/* CUDA's release of a user object, on CUDA's own thread: no CUDA calls,
 * nothing that blocks. */
static void released(void *arg) {
  mep_graph_watch_t *w = arg;
  __atomic_sub_fetch(&w->live, 1, __ATOMIC_RELEASE);
  unref(w);
}

static int seen(const mep_graph_watch_t *w, unsigned long long capture) {
  for (int i = 0; i < MEP_WATCH_SEEN; i++) {
    if (w->seen[i] == capture) return 1;
  }
  return 0;
}

cudaError_t mep_graph_watch_note(mep_graph_watch_t *w, cudaStream_t stream,
                                 unsigned long long capture) {
  if (w == NULL || capture == 0) return cudaSuccess;
  pthread_mutex_lock(&w->lock);
  cudaError_t e = cudaSuccess;
  if (seen(w, capture)) goto out;
  enum cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  cudaGraph_t graph = NULL;
  e = cudaStreamGetCaptureInfo(stream, &status, &id, &graph, NULL, NULL, NULL);
  if (e != cudaSuccess) goto out;
  if (status != cudaStreamCaptureStatusActive || id != capture || graph == NULL) {
    e = cudaErrorStreamCaptureInvalidated; /* the capture changed since the call looked */
    goto out;
  }
  /* CUDA calls `released` whenever the graph goes, maybe after an
   * engine's dlclose: the library stays mapped. */
  mep_pin_library();
  cudaUserObject_t obj;
  e = cudaUserObjectCreate(&obj, w, released, 1, cudaUserObjectNoDestructorSync);
  if (e != cudaSuccess) goto out;
  __atomic_add_fetch(&w->refs, 1, __ATOMIC_RELAXED);
  __atomic_add_fetch(&w->live, 1, __ATOMIC_RELAXED);
  e = cudaGraphRetainUserObject(graph, obj, 1, cudaGraphUserObjectMove);
  if (e != cudaSuccess) {
    (void)cudaUserObjectRelease(obj, 1); /* `released` undoes the counts */
    goto out;
  }
  w->seen[w->next] = capture;
  w->next = (w->next + 1) % MEP_WATCH_SEEN;
out:
  pthread_mutex_unlock(&w->lock);
  return e;
}

static int64_t now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

int64_t mep_graph_watch_live(mep_graph_watch_t *w, int grace_ms) {
  if (w == NULL) return 0;
  const struct timespec step = {0, 1000000}; /* 1 ms */
  const int64_t deadline = now_ms() + grace_ms;
  int64_t live = __atomic_load_n(&w->live, __ATOMIC_ACQUIRE);
  while (live > 0 && now_ms() < deadline) {
    nanosleep(&step, NULL);
    live = __atomic_load_n(&w->live, __ATOMIC_ACQUIRE);
  }
  return live;
}
