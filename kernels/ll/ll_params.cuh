/* ll_params.cuh: the LL kernels' parameter block, the per-block state copies
 * it points to (signal shadows, list tags: MEP_LL_SHADOW_SLOTS) and the
 * diagnostic phase stamps. */
#ifndef MEP_LL_PARAMS_CUH_
#define MEP_LL_PARAMS_CUH_

#include <stdint.h>

#include "kernels/ll/ll.h"
#include "kernels/ll/ll_layout.h"
#include "kernels/transport/transport.cuh"

/* Kernel parameter block (passed by value). Offsets are window offsets. The
 * transports and bounded waits get xp and wc, never the whole block.
 *
 * Every 64-byte line of parameter space a launch reads is a constant-cache
 * miss at its first use, and most come in a kernel's first instructions,
 * where every warp waits on each in turn (ncu: 10-20 % of a 1-token
 * launch's stall samples). So the LL kernels take their argument block
 * (MepDispatchArgs, MepCombineArgs) first and this block second, the
 * fields every launch reads lead here, and the device communicator, which
 * only GIN reads, comes last (in xp). EP1, H200: the fused fp8 dispatch
 * 0.1-0.4 us faster at 1-128 tokens than with xp first and the arguments
 * after. */
struct MepLLParams {
  mep_ll_dims_t dims;     /* capacities */
  uint64_t set_off;       /* offset of this call's buffer set */
  uint32_t *tags;         /* this set's tags [MEP_LL_SHADOW_SLOTS][mep_ll_tag_words(R)] */
  uint64_t *shadows;      /* this set's shadows [MEP_LL_SHADOW_SLOTS][num_signals] */
  mep_ll_set_layout_t lay;
  MepWaitCtx wc;
  uint32_t *puts;         /* this set's staged-dispatch puts per destination [R] */
  uint32_t *comb_puts;    /* this set's staged combine partial puts per destination [R] */
  uint32_t *tickets;      /* this set's block tickets [MEP_LL_NUM_TICKETS], then its help words */
  uint64_t *stamps;       /* diagnostics: NULL outside the stamped build (mep_ll_ctx_t) */
  MepXport xp;            /* xp.sig_off = set_off: signals open each set */
};

/* Phase stamps are a diagnostic build (MEP_LL_STAMPS=1: the
 * //kernels/ll:ll_stamped target, which ll_kernel_bench links); the
 * library's kernels carry none. Compiled in but unused (stamps NULL),
 * their branches and stores cost the fused fp8 dispatch 0.2-0.6 us at
 * 1-128 tokens (EP1, one H200). */
#ifndef MEP_LL_STAMPS
#define MEP_LL_STAMPS 0
#endif

/* Writes %globaltimer for phase `point` of this block when the caller
 * asked for stamps, in a stamped build: mep_stamp from thread 0,
 * mep_stamp_here from whichever thread calls it. */
__device__ __forceinline__ void mep_stamp_here(const MepLLParams &p, int point) {
#if MEP_LL_STAMPS
  if (p.stamps == nullptr) return;
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  p.stamps[blockIdx.x * MEP_LL_STAMP_POINTS + point] = t;
#else
  (void)p;
  (void)point;
#endif
}
__device__ __forceinline__ void mep_stamp(const MepLLParams &p, int point) {
  if (threadIdx.x == 0) mep_stamp_here(p, point);
}

/* This block's copy of signal `sig`'s shadow, and of tag word i (list tag
 * of source i < R received, R sent; R + 1 the combine epoch sent, R + 2
 * received); see
 * MEP_LL_SHADOW_SLOTS. */
__device__ __forceinline__ uint64_t mep_shadow(const MepLLParams &p, uint32_t sig) {
  return p.shadows[(uint64_t)blockIdx.x * p.lay.num_signals + sig];
}
__device__ __forceinline__ uint32_t mep_tag(const MepLLParams &p, int i) {
  return p.tags[(uint64_t)blockIdx.x * mep_ll_tag_words(p.dims.world) + i];
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

#endif /* MEP_LL_PARAMS_CUH_ */
