/* ll_dispatch_copy.cuh: the LL dispatch receive's end: copying each local
 * expert's rows into its slots, and sharing the copies of an expert with
 * many rows among the blocks.
 *
 * Every block builds the slots of its own local experts (block b: experts
 * b, b + grid, ...) and copies their rows. The copy is bound by what one
 * SM moves, so without sharing the expert with the most rows decides the
 * receive's end: with hot experts (moe_ep_bench --routing_skew=0.5, EP2
 * fp8, hidden 7168) one expert gets 115 rows at 256 tokens against a mean
 * of 16, and the receive half took 24-28 us against 14-16 uniform.
 *
 * Sharing, in the kShare kernels (mep_dispatch_recv_shares: calls with
 * enough rows per expert): a block copies the first
 * kMepHelpOwnRows rows of each of its experts itself and publishes the
 * rest in the expert's help word (ll_layout.h): the slots and a cursor, a
 * release store after the block's slot writes. The block's warps then
 * claim the rest from the cursor, one atomic add per row, and so does one
 * warp of each block once its own rows are copied (kMepHelpLookWarp), which
 * looks at the help words of the kMepHelpLook experts after its block's.
 * No block waits for another: a look that finds nothing ends, and the
 * owner's warps claim every row nobody else took. Once its warps have
 * claimed past the end, the owner sets the word back to 0, so a word is
 * published only within the call that published it. Which warp copies a
 * row changes nothing in the slot it lands in. */
#ifndef MEP_LL_DISPATCH_COPY_CUH_
#define MEP_LL_DISPATCH_COPY_CUH_

#include "kernels/ll/ll_dispatch_common.cuh"

/* Rows of an expert its own block copies before it shares the rest: two
 * per warp. A claimed row reaches its copy after a look, a claim and a
 * slot read (three round trips, about 2 us), one row's copy takes about
 * 1 us, so rows past the owner's second round are the ones worth
 * handing over. */
constexpr int kMepHelpOwnRows = 2 * kMepWarps;
/* The warp of each block that looks at other experts' help words once its
 * own rows are copied: the last, whose deal holds the fewest rows. With
 * hot experts one looking warp per block measured about as fast as every
 * warp with at most one row of its own looking (tools/bench/RESULTS.md,
 * section at 60d8225), with fewer loads on the words' lines. */
constexpr int kMepHelpLookWarp = kMepWarps - 1;
/* The launcher picks the kShare kernels when this rank's tokens, counted
 * for every source, reach this mean of rows per expert (EP2, top-8, 256
 * experts: 128 tokens per rank); smaller calls run kernels without the
 * shared copy (mep_dispatch_recv_shares). The kernels do not check the
 * sources' real token counts: that check, a loop over the heads' counts
 * before the copy, cost the receive's copy phase 0.3-0.6 us in the uniform
 * 128-token fp8 dispatch (tools/bench/RESULTS.md, section at 728b4eb),
 * while a look that finds nothing published costs the looking warp one
 * load round trip. */
constexpr int kMepHelpMinMean = 8;
/* Experts whose help words a look covers (one per lane), and how many
 * looks the looking warp takes while they find rows to claim. */
constexpr int kMepHelpLook = 32;
constexpr int kMepHelpLooks = 4;

__device__ __forceinline__ unsigned long long *mep_help_words(const MepLLParams &p) {
  return reinterpret_cast<unsigned long long *>(reinterpret_cast<char *>(p.tickets) +
                                                MEP_LL_TICKET_BYTES);
}

/* The list count of the block's nth local expert le (filled_cache for the
 * first kMepFilledCache). */
__device__ __forceinline__ int mep_recv_filled(const int32_t *recv_count, const int *filled_cache,
                                               int le, int nth) {
  return nth < kMepFilledCache ? filled_cache[nth]
                               : *reinterpret_cast<volatile const int32_t *>(recv_count + le);
}

/* The receive-area row (source rank, token) of slot source v. */
__device__ __forceinline__ uint64_t mep_slot_src_row(int v, int M) {
  return (uint64_t)MEP_LL_SLOT_RANK(v) * M + MEP_LL_SLOT_TOKEN(v);
}

/* Slot j of local expert le (source v) into recv_x. Whole warp. */
template <bool kFp8>
__device__ __forceinline__ void mep_copy_slot(const MepLLParams &p, const MepDispatchArgs &a,
                                              int le, int j, int v) {
  const int M = p.dims.max_tokens, cap = p.dims.world * M;
  mep_copy_recv_row<kFp8>(
      a, p.xp.local + p.set_off + p.lay.disp_recv + mep_slot_src_row(v, M) * a.row_bytes,
      (uint64_t)le * cap + j);
}

/* The block's own copy: warps copy each of its local experts' rows (the
 * first expert's slot sources from slot_cache), in kShare kernels the
 * first kMepHelpOwnRows of each (the rest are shared: mep_recv_help). A block
 * with several local experts deals their slots to its warps as one round
 * robin (mep_ll_deal_first_slot): a deal restarting at warp 0 for every
 * expert left warp 0 copying a row of each expert in series while most
 * warps idled (one slot per expert at 128 tokens of top-8 and 1024
 * experts). */
template <bool kFp8, bool kShare>
__device__ __forceinline__ void mep_recv_copy_own(const MepLLParams &p, const MepDispatchArgs &a,
                                                  const int32_t *slot_cache,
                                                  const int *filled_cache) {
  const int cap = p.dims.world * p.dims.max_tokens;
  const int warp = threadIdx.x / 32;
  int dealt = 0; /* slots of this block's earlier experts */
  for (int le = blockIdx.x, nth = 0; le < a.local_experts; le += gridDim.x, ++nth) {
    int filled = mep_recv_filled(a.recv_count, filled_cache, le, nth);
    if (kShare && filled > kMepHelpOwnRows) filled = kMepHelpOwnRows;
    const int32_t *slots = a.slot_src + (size_t)le * cap;
    const int j0 = mep_ll_deal_first_slot(warp, dealt, kMepWarps);
    dealt += filled;
    for (int j = j0; j < filled; j += kMepWarps)
      mep_copy_slot<kFp8>(p, a, le, j, nth == 0 && j < kMepSlotCache ? slot_cache[j] : slots[j]);
  }
}

/* What the shared rows' copy reads, by value: it runs as a call
 * (mep_recv_help), so that its loop and copy do not raise the register
 * count of the kernels around it (inlined beside the own copy, the fp8
 * kernels spilled 36-340 bytes at their 128-register bound). */
struct MepCopyShare {
  const char *rows;  /* the set's dispatch receive rows */
  void *recv_x, *recv_scales;
  const int32_t *slot_src, *recv_count;
  unsigned long long *help; /* the set's help words */
  uint32_t row_bytes;
  int hidden, scale_mode, M, cap, L;
};

__device__ __forceinline__ MepCopyShare mep_copy_share(const MepLLParams &p,
                                                      const MepDispatchArgs &a) {
  MepCopyShare c;
  c.rows = p.xp.local + p.set_off + p.lay.disp_recv;
  c.recv_x = a.recv_x;
  c.recv_scales = a.recv_scales;
  c.slot_src = a.slot_src;
  c.recv_count = a.recv_count;
  c.help = mep_help_words(p);
  c.row_bytes = a.row_bytes;
  c.hidden = a.hidden;
  c.scale_mode = a.scale_mode;
  c.M = p.dims.max_tokens;
  c.cap = p.dims.world * p.dims.max_tokens;
  c.L = a.local_experts;
  return c;
}

/* Claims one row of a published expert: returns (slots << 32) | the
 * claimed slot. The acquire pairs with the owner's release, so its slot
 * sources are seen; no release: a claim publishes nothing, and an acq_rel
 * add's fence would wait for the warp's row stores before every claim. */
__device__ __forceinline__ uint64_t mep_help_claim(unsigned long long *w) {
  uint64_t old;
  asm volatile("atom.acquire.gpu.global.add.u64 %0, [%1], 1;" : "=l"(old) : "l"(w) : "memory");
  return old;
}

/* A claim of local expert le's rows by lane 0, given to the warp: true and
 * *j, *v (the slot and its source) when it got one. cache: the owner's
 * slot_cache for its first expert, else NULL. Whole warp. */
__device__ __forceinline__ bool mep_help_take(const MepCopyShare &c, int le, const int32_t *cache,
                                              int *j, int *v) {
  const int lane = threadIdx.x & 31;
  uint32_t got = 0; /* the claimed slot, or ~0u */
  int src = 0;
  if (lane == 0) {
    const uint64_t w = mep_help_claim(c.help + le);
    got = (uint32_t)w < (uint32_t)(w >> 32) ? (uint32_t)w : ~0u;
    /* lane 0 reads the source after its own acquire */
    if (got != ~0u)
      src = cache != nullptr && got < (uint32_t)kMepSlotCache
                ? cache[got]
                : c.slot_src[(size_t)le * c.cap + got];
  }
  got = __shfl_sync(0xffffffffu, got, 0);
  *j = (int)got;
  *v = __shfl_sync(0xffffffffu, src, 0);
  return got != ~0u;
}

/* A warp's look for rows to help with: the help words of the kMepHelpLook
 * experts after the block's first (its own experts skipped: their warps
 * drain them); returns one with rows left, from a lane that depends on the
 * warp and block so that helpers spread, or -1. Whole warp. */
__device__ __forceinline__ int mep_help_look(const MepCopyShare &c) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const int look = c.L - 1 < kMepHelpLook ? c.L - 1 : kMepHelpLook;
  int le = (int)blockIdx.x % c.L + 1 + lane;
  if (le >= c.L) le -= c.L;
  uint64_t w = 0;
  if (lane < look && le % (int)gridDim.x != (int)blockIdx.x)
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(w) : "l"(c.help + le) : "memory");
  const unsigned open = __ballot_sync(0xffffffffu, (uint32_t)w < (uint32_t)(w >> 32));
  if (open == 0) return -1;
  const unsigned from = open & (~0u << ((warp * 7 + (int)blockIdx.x) & 31));
  return __shfl_sync(0xffffffffu, le, __ffs(from != 0 ? from : open) - 1);
}

/* Publishes the block's local experts with more than kMepHelpOwnRows
 * rows (thread 0, a release store each); returns whether it published
 * any (block-uniform). After a block barrier that follows the block's
 * slot writes, so they precede the release. */
__device__ __forceinline__ bool mep_help_publish(const MepDispatchArgs &a, const int *filled_cache,
                                                 unsigned long long *help) {
  bool any = false;
  for (int le = blockIdx.x, nth = 0; le < a.local_experts; le += gridDim.x, ++nth) {
    const int filled = mep_recv_filled(a.recv_count, filled_cache, le, nth);
    if (filled <= kMepHelpOwnRows) continue;
    any = true;
    if (threadIdx.x == 0)
      asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(help + le),
                   "l"(((uint64_t)filled << 32) | (uint64_t)kMepHelpOwnRows)
                   : "memory");
  }
  return any;
}

/* A warp's shared rows, after its own (mep_recv_copy_own): with `own`,
 * rows claimed from its block's published experts until none is left;
 * then with `look`, rows claimed from other blocks' (mep_help_look), at
 * most kMepHelpLooks looks. One loop with a single copy in it. Whole
 * warp. */
template <bool kFp8>
__device__ __noinline__ void mep_recv_help(MepCopyShare c, const int32_t *slot_cache,
                                           const int *filled_cache, bool own, bool look) {
  MepDispatchArgs a = {}; /* what mep_copy_recv_row reads */
  a.recv_x = c.recv_x;
  a.recv_scales = c.recv_scales;
  a.hidden = c.hidden;
  a.scale_mode = c.scale_mode;
  /* stage 1: claims from own experts; 2: others'; 3: done */
  int stage = own ? 1 : 2, le = blockIdx.x, nth = 0, looks = 0, other = -1;
  for (;;) {
    int row = -1, j = 0, v = 0; /* row: the local expert of slot j (source v) */
    while (stage == 1 && row < 0) {
      if (le >= c.L) {
        stage = 2;
        break;
      }
      if (mep_recv_filled(c.recv_count, filled_cache, le, nth) > kMepHelpOwnRows &&
          mep_help_take(c, le, nth == 0 ? slot_cache : nullptr, &j, &v)) {
        row = le;
        break;
      }
      le += gridDim.x;
      ++nth;
    }
    while (stage == 2 && row < 0) {
      if (other < 0) {
        other = look && looks < kMepHelpLooks ? mep_help_look(c) : -1;
        ++looks;
        if (other < 0) {
          stage = 3;
          break;
        }
      }
      if (mep_help_take(c, other, nullptr, &j, &v))
        row = other;
      else
        other = -1;
    }
    if (row < 0) return;
    mep_copy_recv_row<kFp8>(a, c.rows + mep_slot_src_row(v, c.M) * c.row_bytes,
                            (uint64_t)row * c.cap + j);
  }
}

/* A receive's end, once the slots are built and the counts seen: the row
 * copy (mep_recv_copy_own; in kShare kernels the first kMepHelpOwnRows
 * rows of each expert, then mep_recv_help), then the
 * block stores its copies of the signal shadows (next) and list tags
 * (tag). After a block barrier that follows the block's slot writes.
 * Kernels without kShare hold no shared copy at all: with it compiled in
 * but not taken, the fused dispatch at 1 token read 0.4-1.1 us slower
 * (EP2 fp8, 2 x H200). The kShare kernels cost uniform routing, where
 * nothing is published, 0.2-1.1 / 0.4-0.7 us in the fp8 dispatch at 128 /
 * 256 tokens, and save 2.7-6.2 us with hot experts (tools/bench/RESULTS.md,
 * sections at 60d8225 and 728b4eb). */
template <class Tp, bool kFp8, bool kShare>
__device__ __forceinline__ void mep_dispatch_recv_finish(const MepLLParams &p,
                                                         const MepDispatchArgs &a,
                                                         const uint64_t *next, const int *tag,
                                                         const int32_t *slot_cache,
                                                         const int *filled_cache) {
  if constexpr (kShare) {
    const bool shared = mep_help_publish(a, filled_cache, mep_help_words(p));
    /* the block's own claims come after its publication */
    if (shared) __syncthreads();
    mep_recv_copy_own<kFp8, true>(p, a, slot_cache, filled_cache);
    const bool look = threadIdx.x / 32 == kMepHelpLookWarp;
    if (shared || look)
      mep_recv_help<kFp8>(mep_copy_share(p, a), slot_cache, filled_cache, shared, look);
    if (shared) {
      __syncthreads(); /* every warp's claims are past the end */
      /* strong stores: other blocks' claims may still land on the words */
      for (int e = blockIdx.x + threadIdx.x * gridDim.x; e < a.local_experts;
           e += blockDim.x * gridDim.x)
        asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(mep_help_words(p) + e),
                     "l"((uint64_t)0)
                     : "memory");
    }
  } else {
    mep_recv_copy_own<kFp8, false>(p, a, slot_cache, filled_cache);
  }
  mep_stamp(p, MEP_LL_STAMP_COPIED);
  /* Only this block reads its shadow and tag copies: no grid-wide ticket. */
  mep_store_shadows<Tp>(p, next, [&](int r) { return mep_ll_sig_disp_cnt(&p.dims, r); },
                        [&](int r) { return mep_ll_sig_disp_row(&p.dims, r); });
  mep_slots_store(p.tags, mep_ll_tag_words(p.dims.world), p.dims.world, [&](int j) { return j; },
                  [&](int j) { return (uint32_t)tag[j]; });
  mep_stamp(p, MEP_LL_STAMP_DONE);
}

#endif /* MEP_LL_DISPATCH_COPY_CUH_ */
