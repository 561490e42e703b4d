/* transport_gin.cuh: GIN transport (GPU-initiated networking). Puts read the
 * local window and carry SignalAdd{row_sig, 1}; counts travel as signal
 * adds; waits poll readSignal (our own bounded loop, not waitSignal, so a
 * dead peer becomes a timeout record). Signal ids = set base + index, from
 * ginSignalCount requested at ncclDevCommCreate (ids start at 0). */
#ifndef MEP_TRANSPORT_GIN_CUH_
#define MEP_TRANSPORT_GIN_CUH_

struct MepGin {
  static constexpr bool kStaged = true;
  static constexpr bool kRowSignals = true;

  static __device__ __forceinline__ void put_warp(const MepXport &x, int peer, uint64_t dst_off,
                                                  const void *, uint64_t src_off, uint32_t bytes,
                                                  uint32_t row_sig) {
    ncclGin gin(x.comm, 0);
    gin.put(ncclTeamWorld(x.comm), peer, x.win, dst_off, x.win, src_off, bytes,
            ncclGin_SignalAdd{x.gin_sig_base + row_sig, 1}, ncclGin_None{}, ncclCoopWarp());
  }
  /* A put with no remote action: a later signal to the same peer on this
   * context becomes visible only after it has landed (GIN's ordering of a
   * signal after every preceding put on the context to that peer). */
  static __device__ __forceinline__ void put_warp_unsignalled(const MepXport &x, int peer,
                                                              uint64_t dst_off, uint64_t src_off,
                                                              uint32_t bytes) {
    ncclGin gin(x.comm, 0);
    gin.put(ncclTeamWorld(x.comm), peer, x.win, dst_off, x.win, src_off, bytes, ncclGin_None{},
            ncclGin_None{}, ncclCoopWarp());
  }
  static __device__ __forceinline__ void signal(const MepXport &x, int peer, uint32_t sig,
                                                uint64_t add) {
    ncclGin gin(x.comm, 0);
    gin.signal(ncclTeamWorld(x.comm), peer, ncclGin_SignalAdd{x.gin_sig_base + sig, add});
  }
  static __device__ __forceinline__ uint64_t read_signal(const MepXport &x, uint32_t sig) {
    ncclGin gin(x.comm, 0);
    return gin.readSignal(x.gin_sig_base + sig);
  }
  static __device__ __forceinline__ void flush_warp(const MepXport &x) {
    ncclGin gin(x.comm, 0);
    gin.flush(ncclCoopWarp());
  }
};

#endif /* MEP_TRANSPORT_GIN_CUH_ */
