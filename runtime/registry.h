/* registry.h: the set of live objects handed to the engine (groups,
 * handles, hooks), so a freed or foreign pointer is reported as an error
 * instead of being dereferenced. */
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

int mep_registry_add(const void *obj, mep_obj_kind_t kind); /* 0 = no memory */
void mep_registry_remove(const void *obj);
int mep_registry_contains(const void *obj, mep_obj_kind_t kind);

#ifdef __cplusplus
}
#endif

#endif /* MEP_REGISTRY_H_ */
