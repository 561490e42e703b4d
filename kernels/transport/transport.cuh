/* transport.cuh: the device-side transport interface, peer addressing and
 * the system-scope loads and stores that order the kernels' data. The three
 * implementations (transport_lsa.cuh, transport_gin.cuh,
 * transport_gin_emu.cuh) are selected by template parameter, so one kernel
 * body serves all; bounded waits are in wait.cuh, the warp copy in
 * copy_warp.cuh, the staged send's ticket in last_block.cuh.
 * Everything takes a MepXport (below), never a mode's parameter block.
 * Interface of a transport Tp:
 *
 *   kStaged      sources must sit in the local window (GIN puts read the
 *                window); the kernel stages caller rows there first.
 *   kRowSignals  every put adds 1 to a row signal at the receiver, so the
 *                receiver waits rows by count, and the sender adds the
 *                count signal once, after its last put; without it (LSA)
 *                every sending block releases its own stores with one add
 *                on the count signal (LL: mep_ll_arrival_add).
 *   put_warp(x, peer, dst_off, src, src_off, bytes, row_sig)   whole warp
 *   put_warp_unsignalled(x, peer, dst_off, src_off, bytes)     whole warp:
 *                        from the local window, no signal; a later signal
 *                        to the peer (after a barrier over the putting
 *                        warps) is ordered after it
 *   signal(x, peer, sig, add)                                   one lane
 *   read_signal(x, sig) -> u64 (acquire)                        one lane
 *   peer_ptr(x, peer, off) -> void *   LSA and GIN-emulated only (GIN has
 *                                      no load/store path to a peer)
 *   flush_warp(x)        sources reusable when the kernel ends  whole warp
 *
 * Offsets are window offsets; signal `sig` is the u64 at x.sig_off + 8 sig
 * (GIN: signal id x.gin_sig_base + sig).
 *
 * Signals only ever grow (SignalAdd semantics for all three): the receiver
 * keeps the value seen after its last receive in device memory (shadows),
 * so back-to-back calls and graph replays need no reset and no host. */
#ifndef MEP_TRANSPORT_CUH_
#define MEP_TRANSPORT_CUH_

#include <cuda_runtime.h>
#include <nccl.h>
#include <nccl_device.h>
#include <stdint.h>

/* What a transport needs to reach peers; nothing mode-specific. */
struct MepXport {
  char *local;           /* this rank's window base */
  char *lsa_base;        /* the window at LSA rank 0 */
  uint64_t lsa_stride;   /* bytes between LSA ranks' windows */
  uint64_t sig_off;      /* window offset of signal 0 for this call (LL: the set's offset) */
  uint32_t gin_sig_base; /* GIN signal id of signal 0 for this call */
  int rank;
  int world;
  ncclWindow_t win;
  ncclDevComm comm; /* last: only GIN reads it, and the LSA fields above
                       share the first lines of parameter space (ll_params.cuh) */
};

__device__ __forceinline__ uint64_t mep_ld_acquire_sys(const uint64_t *p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ uint64_t mep_ld_relaxed_sys(const uint64_t *p) {
  uint64_t v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void mep_st_relaxed_sys(uint64_t *p, uint64_t v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

/* Two 8-byte words in one access, each single-copy atomic (flagged words:
 * the reader checks each word's own flag). */
__device__ __forceinline__ void mep_st_volatile_u64x2(uint64_t *p, uint64_t a, uint64_t b) {
  asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(a), "l"(b) : "memory");
}
__device__ __forceinline__ void mep_ld_volatile_u64x2(const uint64_t *p, uint64_t *a, uint64_t *b) {
  uint64_t x, y;
  asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(x), "=l"(y) : "l"(p) : "memory");
  *a = x;
  *b = y;
}

__device__ __forceinline__ int mep_lsa_peer(const MepXport &x, int peer) {
  return ncclTeamRankToLsa(x.comm, ncclTeamWorld(x.comm), peer);
}

/* A peer's window address: arithmetic only (ncclGetLsaPointer would load
 * the window descriptor, a dependent global load at the head of every
 * kernel's critical path). */
__device__ __forceinline__ void *mep_lsa_ptr(const MepXport &x, int peer, uint64_t off) {
  return x.lsa_base + (uint64_t)mep_lsa_peer(x, peer) * x.lsa_stride + off;
}

__device__ __forceinline__ uint64_t mep_sig_off(const MepXport &x, uint32_t sig) {
  return x.sig_off + (uint64_t)sig * 8u;
}

#include "kernels/transport/copy_warp.cuh"
#include "kernels/transport/last_block.cuh"
#include "kernels/transport/wait.cuh"

#include "kernels/transport/transport_gin.cuh"
#include "kernels/transport/transport_gin_emu.cuh"
#include "kernels/transport/transport_lsa.cuh"

#endif /* MEP_TRANSPORT_CUH_ */
