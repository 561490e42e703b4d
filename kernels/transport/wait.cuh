/* wait.cuh: the bounded wait every spin goes through, and the host-mapped
 * record an expired wait leaves for the host to read. */
#ifndef MEP_TRANSPORT_WAIT_CUH_
#define MEP_TRANSPORT_WAIT_CUH_

#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/ll/ll_params.cuh"

__device__ __forceinline__ uint32_t mep_ld_volatile_u32(const uint32_t *p) {
  return *reinterpret_cast<const volatile uint32_t *>(p);
}

/* Fills a host-mapped record once: the first writer wins (flag 0 -> 1),
 * the fields land before flag = 2, which the host polls. */
static __device__ __forceinline__ void mep_publish_record(mep_ll_error_record_t *r,
                                                          const MepLLParams &p, int op, int peer,
                                                          int expert, uint64_t expected,
                                                          uint64_t seen) {
  if (atomicCAS(const_cast<int32_t *>(&r->flag), 0, 1) != 0) return;
  r->op = op;
  r->rank = p.rank;
  r->peer = peer;
  r->expert = expert;
  r->buffer_set = p.set;
  r->expected = expected;
  r->seen = seen;
  __threadfence_system();
  r->flag = 2;
  __threadfence_system();
}

/* Records the first expired wait into host-mapped memory and raises the
 * abort flag so every other wait in flight gives up quickly. */
static __device__ __noinline__ void mep_record_timeout(const MepLLParams &p, int op, int peer,
                                                int expert, uint64_t expected, uint64_t seen) {
  atomicExch(p.abort_flag, 1u);
  mep_publish_record(p.err, p, op, peer, expert, expected, seen);
}

/* Spins until done(read()) holds, bounded by p.timeout_cycles. Returns
 * false (after recording `expected` and the last value) on expiry, or when
 * another wait aborted. */
template <typename Read, typename Done>
__device__ __forceinline__ bool mep_wait(const MepLLParams &p, Read read, Done done,
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
      if (mep_ld_volatile_u32(p.abort_flag)) {
        *seen = v;
        return false;
      }
      if ((uint64_t)(clock64() - start) > p.timeout_cycles) {
        mep_record_timeout(p, op, peer, expert, expected, v);
        *seen = v;
        return false;
      }
    }
  }
}

/* Spins until read() >= target (wrap-safe); see mep_wait. */
template <typename Read>
__device__ __forceinline__ bool mep_wait_ge(const MepLLParams &p, Read read, uint64_t target,
                                            int op, int peer, int expert, uint64_t *seen) {
  return mep_wait(p, read, [&](uint64_t v) { return (int64_t)(v - target) >= 0; }, target, op,
                  peer, expert, seen);
}

#endif /* MEP_TRANSPORT_WAIT_CUH_ */
