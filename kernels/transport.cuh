/* transport.cuh: the one device-side transport interface of the LL kernels,
 * the kernel parameter block they share, and the bounded wait. The three
 * implementations (transport_lsa.cuh, transport_gin.cuh,
 * transport_gin_emu.cuh) are selected by template parameter, so one kernel
 * body serves all. Interface of a transport Tp:
 *
 *   kStaged      sources must sit in the local window (GIN puts read the
 *                window); the kernel stages caller rows there first.
 *   kRowSignals  every put adds 1 to a row signal at the receiver, so the
 *                receiver waits rows by count, and the send half's last
 *                block adds the count signal once; without it (LSA) every
 *                block of the send half releases its own stores with one
 *                arrival on the count signal (mep_ll_arrival_add).
 *   put_warp(p, peer, dst_off, src, src_off, bytes, row_sig)   whole warp
 *   signal(p, peer, sig, add)                                   one lane
 *   read_signal(p, sig) -> u64 (acquire)                        one lane
 *   flush_warp(p)        sources reusable when the kernel ends  whole warp
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

#include "kernels/ll.h"
#include "kernels/ll_layout.h"

/* Kernel parameter block (passed by value). Offsets are window offsets. */
struct MepLLParams {
  ncclDevComm comm;
  ncclWindow_t win;
  char *local;            /* this rank's window base */
  char *lsa_base;         /* the window at LSA rank 0 (mep_ll_resolve_lsa) */
  uint64_t lsa_stride;    /* bytes between LSA ranks' windows */
  uint64_t set_off;       /* offset of this call's buffer set */
  mep_ll_dims_t dims;     /* capacities */
  mep_ll_set_layout_t lay;
  int rank;
  int set;
  uint32_t gin_sig_base;  /* set * lay.num_signals */
  uint64_t timeout_cycles;
  uint64_t *shadows;      /* this set's shadows [MEP_LL_SHADOW_SLOTS][num_signals] */
  uint32_t *tags;         /* this set's list tags [MEP_LL_SHADOW_SLOTS][R + 1] */
  uint32_t *puts;         /* this set's staged-dispatch puts per destination [R] */
  uint32_t *comb_puts;    /* this set's staged combine partial puts per destination [R] */
  uint32_t *tickets;      /* this set's block tickets [MEP_LL_NUM_TICKETS] */
  uint32_t *abort_flag;
  mep_ll_error_record_t *err;
  mep_ll_error_record_t *notice; /* may be NULL */
  uint64_t *stamps;              /* diagnostics, usually NULL (mep_ll_ctx_t) */
};

/* Writes %globaltimer for phase `point` of this block when the caller
 * asked for stamps (otherwise one uniform branch): mep_stamp from thread
 * 0, mep_stamp_here from whichever thread calls it. */
__device__ __forceinline__ void mep_stamp_here(const MepLLParams &p, int point) {
  if (p.stamps == nullptr) return;
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  p.stamps[blockIdx.x * MEP_LL_STAMP_POINTS + point] = t;
}
__device__ __forceinline__ void mep_stamp(const MepLLParams &p, int point) {
  if (threadIdx.x == 0) mep_stamp_here(p, point);
}

__device__ __forceinline__ uint64_t mep_ld_acquire_sys(const uint64_t *p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

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

/* Notes the first out-of-range routing entry of a launch (the slot is
 * dropped, as -1 would be); the runtime reports it once through
 * group_poll_error. Never aborts anything. */
static __device__ __noinline__ void mep_record_bad_routing(const MepLLParams &p, int token, int k,
                                                           int value) {
  if (p.notice != nullptr)
    mep_publish_record(p.notice, p, MEP_LL_OP_BAD_ROUTING, -1, value, (uint64_t)token,
                       (uint64_t)k);
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

/* This block's copy of signal `sig`'s shadow, and of list tag i (source
 * i < R received, R sent); see MEP_LL_SHADOW_SLOTS. */
__device__ __forceinline__ uint64_t mep_shadow(const MepLLParams &p, uint32_t sig) {
  return p.shadows[(uint64_t)blockIdx.x * p.lay.num_signals + sig];
}
__device__ __forceinline__ uint32_t mep_tag(const MepLLParams &p, int i) {
  return p.tags[(uint64_t)blockIdx.x * (p.dims.world + 1) + i];
}

/* Ends a block's use of its per-block state copies: writes value_of(j) into
 * every copy this block owns of entry index_of(j), j < n (slots b, b +
 * grid, ... of an array of `stride` entries per slot). Block-wide; after a
 * barrier that follows the block's last read of its own copies (no other
 * block reads them). */
template <typename V, typename IndexOf, typename ValueOf>
__device__ __forceinline__ void mep_slots_store(V *base, uint32_t stride, int n, IndexOf index_of,
                                                ValueOf value_of) {
  const uint32_t owned = (MEP_LL_SHADOW_SLOTS - blockIdx.x + gridDim.x - 1) / gridDim.x;
  for (uint32_t i = threadIdx.x; i < owned * (uint32_t)n; i += blockDim.x) {
    const uint64_t slot = blockIdx.x + (uint64_t)(i / n) * gridDim.x;
    base[slot * stride + index_of((int)(i % n))] = value_of((int)(i % n));
  }
}

/* Ends a receive: this block's shadow copies of each source r's count
 * signal cnt_sig(r) become next[r] and, row-signalled, of its row signal
 * row_sig(r) next[R + r] (mep_slots_store's rules). */
template <class Tp, typename CntSig, typename RowSig>
__device__ __forceinline__ void mep_store_shadows(const MepLLParams &p, const uint64_t *next,
                                                  CntSig cnt_sig, RowSig row_sig) {
  const int R = p.dims.world;
  mep_slots_store(p.shadows, (uint32_t)p.lay.num_signals, Tp::kRowSignals ? 2 * R : R,
                  [&](int j) { return j < R ? cnt_sig(j) : row_sig(j - R); },
                  [&](int j) { return next[j]; });
}

__device__ __forceinline__ uint64_t mep_ld_relaxed_sys(const uint64_t *p) {
  uint64_t v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void mep_st_relaxed_sys(uint64_t *p, uint64_t v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

/* Waits for source `peer`'s count signal `sig` in this set: one add by the
 * sender's last block (row-signalled transports), or every sender block's
 * arrival (LSA, mep_ll_arrival_add). *base: the block's shadow; *increase:
 * how far the signal moved; *code: the sender's code. first (may be NULL):
 * an earlier acquire read of the signal, used before reading again. False
 * when the wait expired or aborted, or the value is one no sender makes
 * (recorded as MEP_LL_OP_BAD_SIGNAL). One lane. */
template <class Tp>
__device__ __forceinline__ bool mep_wait_count(const MepLLParams &p, uint32_t sig, int op,
                                               int peer, uint64_t *base, uint64_t *increase,
                                               uint64_t *code, const uint64_t *first = nullptr) {
  const uint64_t b = *base = mep_shadow(p, sig);
  bool fresh = first == nullptr;
  auto read = [&] {
    if (fresh) return Tp::read_signal(p, sig);
    fresh = true;
    return *first;
  };
  uint64_t seen = 0;
  if (Tp::kRowSignals) {
    if (!mep_wait_ge(p, read, b + 1, op, peer, -1, &seen)) return false;
    *increase = *code = seen - b;
    return true;
  }
  uint64_t c = 0;
  if (!mep_wait(p, read, [&](uint64_t v) { return mep_ll_arrival_state(v - b, &c) != 0; },
                b + MEP_LL_ARRIVAL_ONE, op, peer, -1, &seen))
    return false;
  if (mep_ll_arrival_state(seen - b, &c) < 0) {
    mep_record_timeout(p, MEP_LL_OP_BAD_SIGNAL, peer, -1, b, seen);
    return false;
  }
  *increase = seen - b;
  *code = c;
  return true;
}

/* Ends an LSA send half: once the block's stores are done (the barrier),
 * each destination gets this block's arrival (a release add: it carries
 * the block's stores); block 0's also carries the grid size and
 * code_of(destination). mep_arrival_send: the adds alone, from threads
 * first, first + stride, ... (after such a barrier). */
template <class Tp, typename CodeOf>
__device__ __forceinline__ void mep_arrival_send(const MepLLParams &p, uint32_t sig,
                                                 CodeOf code_of, int first, int stride) {
  for (int d = first; d < p.dims.world; d += stride)
    Tp::signal(p, d, sig,
               mep_ll_arrival_add(blockIdx.x == 0 ? code_of(d) : 0u, blockIdx.x, gridDim.x));
}
template <class Tp, typename CodeOf>
__device__ __forceinline__ void mep_arrive(const MepLLParams &p, uint32_t sig, CodeOf code_of) {
  __syncthreads();
  mep_arrival_send<Tp>(p, sig, code_of, threadIdx.x, blockDim.x);
}

/* Warp copy of `bytes` (multiple of 16, 16-byte aligned) from src to dst.
 * Each step issues all of a lane's (up to kU) 16-byte loads before its
 * stores, so one step costs one load latency; the tail is a guarded step,
 * not a serial loop. Trip count: ceil(bytes / (512 kU)), bounded. kU = 16
 * (64 registers of payload) moves a 7 KB fp8 row in one step. */
template <uint32_t kU = 8>
__device__ __forceinline__ void mep_copy_warp(void *dst, const void *src, uint32_t bytes) {
  const uint32_t lane = threadIdx.x & 31;
  uint4 *d = reinterpret_cast<uint4 *>(dst);
  const uint4 *s = reinterpret_cast<const uint4 *>(src);
  const uint32_t n = bytes / 16;
  for (uint32_t base = 0; base < n; base += 32 * kU) {
    uint4 v[kU];
#pragma unroll
    for (uint32_t u = 0; u < kU; ++u) {
      const uint32_t i = base + u * 32 + lane;
      v[u] = i < n ? __ldcg(s + i) : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (uint32_t u = 0; u < kU; ++u) {
      const uint32_t i = base + u * 32 + lane;
      if (i < n) d[i] = v[u];
    }
  }
}

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

__device__ __forceinline__ int mep_lsa_peer(const MepLLParams &p, int peer) {
  return ncclTeamRankToLsa(p.comm, ncclTeamWorld(p.comm), peer);
}

/* A peer's window address: arithmetic only (ncclGetLsaPointer would load
 * the window descriptor, a dependent global load at the head of every
 * kernel's critical path). */
__device__ __forceinline__ void *mep_lsa_ptr(const MepLLParams &p, int peer, uint64_t off) {
  return p.lsa_base + (uint64_t)mep_lsa_peer(p, peer) * p.lsa_stride + off;
}

__device__ __forceinline__ uint64_t mep_sig_off(const MepLLParams &p, uint32_t sig) {
  return p.set_off + (uint64_t)sig * 8u;
}

#include "kernels/transport_gin.cuh"
#include "kernels/transport_gin_emu.cuh"
#include "kernels/transport_lsa.cuh"

#endif /* MEP_TRANSPORT_CUH_ */
