/* registry.c: live-object set. Small open array: an engine holds a handful
 * of groups and a few handles/hooks per layer in flight. */
#include "runtime/registry.h"

#include <pthread.h>
#include <stdlib.h>

typedef struct entry {
  const void *obj;
  mep_obj_kind_t kind;
  void *owner;
  int rank; /* the owner's rank when added, kept once the owner is gone */
} entry_t;

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static entry_t *reg_entries;
static size_t reg_len, reg_cap;

/* Index of obj as `kind`, or reg_len; call under reg_lock. */
static size_t find(const void *obj, mep_obj_kind_t kind) {
  size_t i = 0;
  while (i < reg_len && (reg_entries[i].obj != obj || reg_entries[i].kind != kind)) i++;
  return i;
}

int mep_registry_add(const void *obj, mep_obj_kind_t kind, void *owner, int rank) {
  int ok = 1;
  pthread_mutex_lock(&reg_lock);
  if (reg_len == reg_cap) {
    size_t cap = reg_cap ? reg_cap * 2 : 64;
    entry_t *grown = realloc(reg_entries, cap * sizeof(*grown));
    if (grown == NULL) {
      ok = 0;
    } else {
      reg_entries = grown;
      reg_cap = cap;
    }
  }
  if (ok) reg_entries[reg_len++] = (entry_t){obj, kind, owner, rank};
  pthread_mutex_unlock(&reg_lock);
  return ok;
}

int mep_registry_take(const void *obj, mep_obj_kind_t kind) {
  pthread_mutex_lock(&reg_lock);
  size_t i = find(obj, kind);
  int taken = i < reg_len;
  if (taken) reg_entries[i] = reg_entries[--reg_len];
  /* Nothing live: give the storage back, so an engine that dlcloses the
   * library after its last group leaks nothing. */
  if (reg_len == 0) {
    free(reg_entries);
    reg_entries = NULL;
    reg_cap = 0;
  }
  pthread_mutex_unlock(&reg_lock);
  return taken;
}

int mep_registry_contains(const void *obj, mep_obj_kind_t kind) {
  return mep_registry_owner(obj, kind, NULL, NULL);
}

int mep_registry_owner(const void *obj, mep_obj_kind_t kind, void **owner, int *rank) {
  pthread_mutex_lock(&reg_lock);
  size_t i = find(obj, kind);
  int found = i < reg_len;
  if (found && owner != NULL) *owner = reg_entries[i].owner;
  if (found && rank != NULL) *rank = reg_entries[i].rank;
  pthread_mutex_unlock(&reg_lock);
  return found;
}

void mep_registry_orphan(const void *owner) {
  pthread_mutex_lock(&reg_lock);
  for (size_t i = 0; i < reg_len; i++) {
    if (reg_entries[i].owner == owner) reg_entries[i].owner = NULL;
  }
  pthread_mutex_unlock(&reg_lock);
}

static void *retired[MEP_REGISTRY_RETIRED];
static size_t retired_next;

void mep_registry_retire(void *mem) {
  if (mem == NULL) return;
  pthread_mutex_lock(&reg_lock);
  void *oldest = retired[retired_next];
  retired[retired_next] = mem;
  retired_next = (retired_next + 1) % MEP_REGISTRY_RETIRED;
  pthread_mutex_unlock(&reg_lock);
  free(oldest);
}

/* The library unloaded (an engine's dlclose): the retired memory goes with
 * it; no pointer into it can be checked any more. */
__attribute__((destructor)) static void registry_unload(void) {
  pthread_mutex_lock(&reg_lock); /* a thread still freeing at exit */
  for (size_t i = 0; i < MEP_REGISTRY_RETIRED; i++) {
    free(retired[i]);
    retired[i] = NULL;
  }
  pthread_mutex_unlock(&reg_lock);
}
