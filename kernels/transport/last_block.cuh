/* last_block.cuh: the staged send's grid-wide ticket: which block is the
 * last to finish, so that one block alone sends the count signals. */
#ifndef MEP_TRANSPORT_LAST_BLOCK_CUH_
#define MEP_TRANSPORT_LAST_BLOCK_CUH_

#include <cuda_runtime.h>
#include <stdint.h>

/* Ends a staged send half's work phase: returns true on every thread of
 * exactly one block, the last to get here, once every block's earlier
 * stores are visible at system scope, so the last block's signals release
 * them: the barrier makes the block's stores visible to its thread 0, whose
 * system fence then orders them all (cumulativity) before the ticket, and
 * the last block acquires after reading it. No block waits for another
 * here. The ticket is reset for the next launch (a kernel boundary away). */
__device__ __forceinline__ bool mep_last_block(uint32_t *ticket) {
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    /* a release pattern: fence.acq_rel, not a full fence.sc */
    asm volatile("fence.acq_rel.sys;" ::: "memory");
    if (gridDim.x == 1) {
      last = true;
    } else {
      last = atomicAdd(ticket, 1u) == gridDim.x - 1;
      if (last) {
        *ticket = 0;
        __threadfence();
      }
    }
  }
  __syncthreads();
  return last;
}

#endif /* MEP_TRANSPORT_LAST_BLOCK_CUH_ */
