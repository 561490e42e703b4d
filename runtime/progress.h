/* progress.h: how long one pass of a UCX progress loop may run. */
#ifndef MEP_PROGRESS_H_
#define MEP_PROGRESS_H_

/* ucp_worker_progress calls per pass before the loop looks at its
 * deadline, stop flag and queue again: whatever keeps a worker busy (a
 * peer's stream of messages, or outsiders' dropped ones) only slows those
 * checks down, never postpones them. */
#define MEP_PROGRESS_PASS_MAX 256u

#endif /* MEP_PROGRESS_H_ */
