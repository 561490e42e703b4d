/* error_record.h: what a kernel's expired wait (or a notice) leaves in
 * host-mapped memory for the host to read, whatever the mode. Plain C. */
#ifndef MEP_ERROR_RECORD_H_
#define MEP_ERROR_RECORD_H_

#include <stdint.h>

/* Written by a kernel whose bounded wait expired, into host-mapped memory
 * (cudaHostAlloc mapped). flag: 0 = none, 1 = being written, 2 = complete.
 * The first expiring wait wins; the kernel then exits (no trap). */
typedef struct mep_error_record {
  volatile int32_t flag;
  int32_t op;       /* the mode's op code (LL: MEP_LL_OP_*) */
  int32_t rank;     /* the rank that waited */
  int32_t peer;     /* the rank it waited for (-1: itself) */
  int32_t expert;   /* local expert (dispatch) or -1 */
  int32_t buffer_set;
  uint64_t expected;
  uint64_t seen;
} mep_error_record_t;

#endif /* MEP_ERROR_RECORD_H_ */
