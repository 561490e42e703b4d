/* ll_signals.cuh: how the LL kernels use a transport's signals: the count
 * wait against the block's shadow, the LSA send blocks' arrivals, and the
 * shadow store that ends a receive. */
#ifndef MEP_LL_SIGNALS_CUH_
#define MEP_LL_SIGNALS_CUH_

#include "kernels/ll/ll_params.cuh"
#include "kernels/transport/transport.cuh"

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

/* Waits for source `peer`'s count signal `sig` in this set: one add by the
 * sender's last block (row-signalled transports), or every sender block's
 * arrival (LSA, mep_ll_arrival_add). *base: the block's shadow; *increase:
 * how far the signal moved; *code: the sender's code. False when the wait
 * expired or aborted, or the value is one no sender makes (recorded as
 * MEP_LL_OP_BAD_SIGNAL). One lane. */
template <class Tp>
__device__ __forceinline__ bool mep_wait_count(const MepLLParams &p, uint32_t sig, int op,
                                               int peer, uint64_t *base, uint64_t *increase,
                                               uint64_t *code) {
  const uint64_t b = *base = mep_shadow(p, sig);
  auto read = [&] { return Tp::read_signal(p.xp, sig); };
  uint64_t seen = 0;
  if (Tp::kRowSignals) {
    if (!mep_wait_ge(p.wc, read, b + 1, op, peer, -1, &seen)) return false;
    *increase = *code = seen - b;
    return true;
  }
  uint64_t c = 0;
  if (!mep_wait(p.wc, read, [&](uint64_t v) { return mep_ll_arrival_state(v - b, &c) != 0; },
                b + MEP_LL_ARRIVAL_ONE, op, peer, -1, &seen))
    return false;
  if (mep_ll_arrival_state(seen - b, &c) < 0) {
    mep_record_timeout(p.wc, MEP_LL_OP_BAD_SIGNAL, peer, -1, b, seen);
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
    Tp::signal(p.xp, d, sig,
               mep_ll_arrival_add(blockIdx.x == 0 ? code_of(d) : 0u, blockIdx.x, gridDim.x));
}
template <class Tp, typename CodeOf>
__device__ __forceinline__ void mep_arrive(const MepLLParams &p, uint32_t sig, CodeOf code_of) {
  __syncthreads();
  mep_arrival_send<Tp>(p, sig, code_of, threadIdx.x, blockDim.x);
}

#endif /* MEP_LL_SIGNALS_CUH_ */
