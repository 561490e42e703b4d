/* transport_lsa.cuh: LSA transport. Stores go straight into the peer's
 * symmetric window through its LSA address; a count signal is the sum of
 * every send block's arrival, each a system-scope release add issued once
 * that block's stores are done (mep_arrive): no per-row signals, no
 * grid-wide ticket. */
#ifndef MEP_TRANSPORT_LSA_CUH_
#define MEP_TRANSPORT_LSA_CUH_

struct MepLsa {
  static constexpr bool kStaged = false;
  static constexpr bool kRowSignals = false;

  static __device__ __forceinline__ void *peer_ptr(const MepXport &x, int peer, uint64_t off) {
    return mep_lsa_ptr(x, peer, off);
  }
  static __device__ __forceinline__ void put_warp(const MepXport &x, int peer, uint64_t dst_off,
                                                  const void *src, uint64_t, uint32_t bytes,
                                                  uint32_t) {
    mep_copy_warp(peer_ptr(x, peer, dst_off), src, bytes);
  }
  /* The window's bytes at src_off into the peer's (interface symmetry with
   * the staged transports; LSA kernels store straight from the source). */
  static __device__ __forceinline__ void put_warp_unsignalled(const MepXport &x, int peer,
                                                              uint64_t dst_off, uint64_t src_off,
                                                              uint32_t bytes) {
    mep_copy_warp(peer_ptr(x, peer, dst_off), x.local + src_off, bytes);
  }
  static __device__ __forceinline__ unsigned long long *signal_ptr(const MepXport &x, int peer,
                                                                   uint32_t sig) {
    return reinterpret_cast<unsigned long long *>(peer_ptr(x, peer, mep_sig_off(x, sig)));
  }
  static __device__ __forceinline__ void signal(const MepXport &x, int peer, uint32_t sig,
                                                uint64_t add) {
    /* A release add at system scope: the block's rows (ordered before
     * this thread by the caller's block barrier, LL: mep_arrive; release
     * is cumulative) land before the count moves. */
    asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(signal_ptr(x, peer, sig)),
                 "l"((unsigned long long)add)
                 : "memory");
  }
  /* A relaxed add: orders nothing, for a signal that only says this
   * launch has started (flagged combine partials carry their own flags). */
  static __device__ __forceinline__ void signal_relaxed(const MepXport &x, int peer, uint32_t sig,
                                                        uint64_t add) {
    asm volatile("red.relaxed.sys.global.add.u64 [%0], %1;" ::"l"(signal_ptr(x, peer, sig)),
                 "l"((unsigned long long)add)
                 : "memory");
  }
  static __device__ __forceinline__ uint64_t read_signal(const MepXport &x, uint32_t sig) {
    return mep_ld_acquire_sys(reinterpret_cast<const uint64_t *>(x.local + mep_sig_off(x, sig)));
  }
  static __device__ __forceinline__ void flush_warp(const MepXport &) {}
};

#endif /* MEP_TRANSPORT_LSA_CUH_ */
