/* wait.cuh: the bounded wait every spin goes through, and the host-mapped
 * record an expired wait leaves for the host to read. Mode-neutral: a
 * mode's parameter block carries a MepWaitCtx and passes it here. */
#ifndef MEP_TRANSPORT_WAIT_CUH_
#define MEP_TRANSPORT_WAIT_CUH_

#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/common/error_record.h"

/* Bounded waits and the records they publish. */
struct MepWaitCtx {
  uint64_t timeout_cycles;
  uint32_t *abort_flag;       /* raised by the first expired wait; every wait checks it */
  mep_error_record_t *err;    /* host-mapped: the first expired wait */
  mep_error_record_t *notice; /* host-mapped, may be NULL: notes that abort nothing */
  int rank;                   /* recorded as the rank that waited */
  int set;                    /* recorded as the buffer set */
};

__device__ __forceinline__ uint32_t mep_ld_volatile_u32(const uint32_t *p) {
  return *reinterpret_cast<const volatile uint32_t *>(p);
}

/* Fills a host-mapped record once: the first writer wins (flag 0 -> 1),
 * the fields land before flag = 2, which the host polls. */
static __device__ __forceinline__ void mep_publish_record(mep_error_record_t *r,
                                                          const MepWaitCtx &w, int op, int peer,
                                                          int expert, uint64_t expected,
                                                          uint64_t seen) {
  if (atomicCAS(const_cast<int32_t *>(&r->flag), 0, 1) != 0) return;
  r->op = op;
  r->rank = w.rank;
  r->peer = peer;
  r->expert = expert;
  r->buffer_set = w.set;
  r->expected = expected;
  r->seen = seen;
  __threadfence_system();
  r->flag = 2;
  __threadfence_system();
}

/* Records the first expired wait into host-mapped memory and raises the
 * abort flag so every other wait in flight gives up quickly. */
static __device__ __noinline__ void mep_record_timeout(const MepWaitCtx &w, int op, int peer,
                                                int expert, uint64_t expected, uint64_t seen) {
  atomicExch(w.abort_flag, 1u);
  mep_publish_record(w.err, w, op, peer, expert, expected, seen);
}

/* Spins until done(read()) holds, bounded by w.timeout_cycles. Returns
 * false (after recording `expected` and the last value) on expiry, or when
 * another wait aborted. */
template <typename Read, typename Done>
__device__ __forceinline__ bool mep_wait(const MepWaitCtx &w, Read read, Done done,
                                         uint64_t expected, int op, int peer, int expert,
                                         uint64_t *seen) {
  const long long start = clock64();
  uint32_t iter = 0;
  for (;;) {
    const uint64_t v = read();
    if (done(v)) {
      *seen = v;
      return true;
    }
    if ((++iter & 1023u) == 0) {
      if (mep_ld_volatile_u32(w.abort_flag)) {
        *seen = v;
        return false;
      }
      if ((uint64_t)(clock64() - start) > w.timeout_cycles) {
        mep_record_timeout(w, op, peer, expert, expected, v);
        *seen = v;
        return false;
      }
    }
  }
}

/* Spins until read() >= target (wrap-safe); see mep_wait. */
template <typename Read>
__device__ __forceinline__ bool mep_wait_ge(const MepWaitCtx &w, Read read, uint64_t target,
                                            int op, int peer, int expert, uint64_t *seen) {
  return mep_wait(w, read, [&](uint64_t v) { return (int64_t)(v - target) >= 0; }, target, op,
                  peer, expert, seen);
}

/* From the host: raises the abort flag at `flag` (device memory), so every
 * wait in flight gives up at its next check (a failed group's teardown).
 * A copy, queued on `stream`: the copy engine carries it while kernels
 * spin on every SM, where a memset kernel could wait for an SM. The source
 * is static: a pageable copy is staged before the call returns anyway. */
static inline cudaError_t mep_raise_abort_flag(uint32_t *flag, cudaStream_t stream) {
  static const uint32_t kRaised = 1u;
  return cudaMemcpyAsync(flag, &kRaised, sizeof kRaised, cudaMemcpyHostToDevice, stream);
}

#endif /* MEP_TRANSPORT_WAIT_CUH_ */
