/* transport_gin_emu.cuh: the GIN protocol carried over NVLink stores, so the
 * network path's logic runs on one node: same staging offsets, same signal
 * ids, one row-signal add per put ordered after that put's payload, count
 * signals that may overtake rows (the receiver waits both). */
#ifndef MEP_TRANSPORT_GIN_EMU_CUH_
#define MEP_TRANSPORT_GIN_EMU_CUH_

struct MepGinEmu {
  static constexpr bool kStaged = true;
  static constexpr bool kRowSignals = true;

  static __device__ __forceinline__ void *peer_ptr(const MepXport &x, int peer, uint64_t off) {
    return mep_lsa_ptr(x, peer, off);
  }
  static __device__ __forceinline__ void add_sig(const MepXport &x, int peer, uint32_t sig,
                                                 uint64_t add) {
    atomicAdd_system(reinterpret_cast<unsigned long long *>(peer_ptr(x, peer, mep_sig_off(x, sig))),
                     (unsigned long long)add);
  }
  /* Like ncclGin::put with SignalAdd{row_sig, 1}: reads the source from the
   * local window (as the NIC would), signal after payload. */
  static __device__ __forceinline__ void put_warp(const MepXport &x, int peer, uint64_t dst_off,
                                                  const void *, uint64_t src_off, uint32_t bytes,
                                                  uint32_t row_sig) {
    mep_copy_warp(peer_ptr(x, peer, dst_off), x.local + src_off, bytes);
    __syncwarp(); /* every lane's stores, then one fence and the add */
    if ((threadIdx.x & 31) == 0) {
      __threadfence_system();
      add_sig(x, peer, row_sig, 1);
    }
  }
  /* Payload only; the caller's later signal, after a barrier over every
   * warp that put and a system fence, is what publishes it (as GIN orders
   * a signal after the context's earlier puts to that peer). */
  static __device__ __forceinline__ void put_warp_unsignalled(const MepXport &x, int peer,
                                                              uint64_t dst_off, uint64_t src_off,
                                                              uint32_t bytes) {
    mep_copy_warp(peer_ptr(x, peer, dst_off), x.local + src_off, bytes);
  }
  static __device__ __forceinline__ void signal(const MepXport &x, int peer, uint32_t sig,
                                                uint64_t add) {
    add_sig(x, peer, sig, add); /* no ordering promise, as with GIN */
  }
  static __device__ __forceinline__ uint64_t read_signal(const MepXport &x, uint32_t sig) {
    return mep_ld_acquire_sys(reinterpret_cast<const uint64_t *>(x.local + mep_sig_off(x, sig)));
  }
  static __device__ __forceinline__ void flush_warp(const MepXport &) {}
};

#endif /* MEP_TRANSPORT_GIN_EMU_CUH_ */
