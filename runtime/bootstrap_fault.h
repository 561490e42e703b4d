/* bootstrap_fault.h: test-only seams that make the bootstrap's message
 * allocations fail, or put unsealed or replayed messages on its
 * connections, so that tests can drive a rank out of memory, or a
 * connection UCX gives an outsider's message to, in the middle of the
 * protocol, in real processes. Nothing in the product sets them, and libmoe_ep.so does not
 * export them (plugin/exports.lds exports only the plugin tables). */
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

/* 0 (the default): no effect. n > 0: before each of the next n messages
 * this rank sends, it sends a copy whose MAC is wrong and whose number
 * lies 1000 past the original's on the same connection, as an outsider's
 * message would arrive where UCX tied it to that connection (the receiver
 * must drop it without recording its number, keep the connection, and
 * still take the original). Set it like mep_bs_fail_alloc_after. */
extern int mep_bs_send_unsealed_first;

/* 0 (the default): no effect. n > 0: after each of the next n messages
 * this rank sends, it sends the same sealed bytes again on the same
 * connection, as someone who saw the message pass would replay it (the
 * receiver must drop the copy and keep the connection). Set it like
 * mep_bs_fail_alloc_after. */
extern int mep_bs_send_replayed_first;

#ifdef __cplusplus
}
#endif

#endif /* MEP_BOOTSTRAP_FAULT_H_ */
