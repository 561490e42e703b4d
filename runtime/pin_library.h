/* pin_library.h: keeps libmoe_ep.so mapped for the life of the process
 * once something outside the library's own calls may still call into it:
 * a kernel-load thread left running, a UCX log handler, the release of a
 * CUDA user object. An engine's dlclose (moe_ep_unload) then leaves the
 * code in place instead of unmapping it under those callers. */
#ifndef MOE_EP_RUNTIME_PIN_LIBRARY_H_
#define MOE_EP_RUNTIME_PIN_LIBRARY_H_

#ifdef __cplusplus
extern "C" {
#endif

/* Idempotent and thread-safe; a library linked into the program (no
 * dlopen) is unaffected. */
void mep_pin_library(void);

#ifdef __cplusplus
}
#endif

#endif /* MOE_EP_RUNTIME_PIN_LIBRARY_H_ */
