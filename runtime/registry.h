/* registry.h: the set of live objects handed to the engine (groups,
 * handles, hooks), so a freed or foreign pointer is reported as an error
 * instead of being dereferenced. Each entry remembers its owner (the group
 * of a handle or hook), so an entry can find the lock that guards an object
 * without reading the object, which another thread may be freeing. */
#ifndef MEP_REGISTRY_H_
#define MEP_REGISTRY_H_

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mep_obj_kind {
  MEP_OBJ_GROUP = 1,
  MEP_OBJ_HANDLE = 2,
  MEP_OBJ_HOOK = 3
} mep_obj_kind_t;

/* 0 = no memory. `owner` is the group of a handle or hook, NULL for a
 * group; `rank` its rank (-1 for a group), kept for sentences about an
 * object whose group is gone. */
int mep_registry_add(const void *obj, mep_obj_kind_t kind, void *owner, int rank);
/* Removes obj if live; returns 1 when this call removed it, 0 when it was
 * not there (so of two threads freeing one object, exactly one wins). */
int mep_registry_take(const void *obj, mep_obj_kind_t kind);
int mep_registry_contains(const void *obj, mep_obj_kind_t kind);
/* 1 and *owner, *rank (either may be NULL) when obj is live as `kind`;
 * 0 otherwise. */
int mep_registry_owner(const void *obj, mep_obj_kind_t kind, void **owner, int *rank);
/* Every live object owned by `owner` is owned by nobody from now on (its
 * group was destroyed): a later group that the allocator places at the
 * same address does not inherit them. */
void mep_registry_orphan(const void *owner);
/* Frees the memory of an object taken from the registry only after the
 * next MEP_REGISTRY_RETIRED retirements: until then the allocator cannot
 * give its address to a new object, so a stale pointer that another thread
 * still passes (an entry racing the object's free) is found gone, not
 * taken for a new object at the same address. NULL is ignored. */
#define MEP_REGISTRY_RETIRED 256
void mep_registry_retire(void *mem);

#ifdef __cplusplus
}
#endif

#endif /* MEP_REGISTRY_H_ */
