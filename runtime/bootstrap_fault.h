/* bootstrap_fault.h: a test-only seam that makes the bootstrap's message
 * allocations fail, so that tests can drive a rank out of memory in the
 * middle of the protocol, in real processes. Nothing in the product sets
 * it, and libmoe_ep.so does not export it (plugin/exports.lds exports only
 * the plugin tables). */
#ifndef MEP_BOOTSTRAP_FAULT_H_
#define MEP_BOOTSTRAP_FAULT_H_

#ifdef __cplusplus
extern "C" {
#endif

/* -1 (the default): no effect. n >= 0: the next n messages the bootstrap
 * makes (mep_bs_blob_new) are made, and every later one fails as if out of
 * memory, until it is set to -1 again. Set it on the thread that calls the
 * bootstrap, between calls. */
extern int mep_bs_fail_alloc_after;

#ifdef __cplusplus
}
#endif

#endif /* MEP_BOOTSTRAP_FAULT_H_ */
