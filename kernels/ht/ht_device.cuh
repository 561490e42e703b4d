/* ht_device.cuh: what the HT dispatch and combine kernels share: their
 * parameter block, routing decode (a token's destination ranks as a mask),
 * the channel split, warp-group barriers, and the ring leader's bounded
 * waits. Rings and counters: kernels/ht/PROTOCOL.md. */
#ifndef MEP_HT_DEVICE_CUH_
#define MEP_HT_DEVICE_CUH_

#include <stdint.h>

#include "kernels/ht/ht.h"
#include "kernels/ht/ht_layout.h"
#include "kernels/transport/transport.cuh"

/* 16-byte vectors per lane in flight in a row copy: a 14 KB bf16 row in
 * two steps, one load latency each. */
constexpr uint32_t kMepHtCopyU = 16;

struct MepHtParams {
  MepXport xp;
  MepWaitCtx wc;
  mep_ht_dims_t dims;
  mep_ht_window_t win;
  char *state;       /* device state base (mep_ht_state_layout) */
  mep_ht_state_t st;
  int chan;          /* channels of this launch */
};

/* Warps per peer group: blocks split their warps into groups, one peer
 * per group at a time; with more peers than warps each warp is a group. */
struct MepHtGroups {
  int size;   /* warps per group */
  int count;  /* groups */
  int group;  /* this warp's group (>= count: idle) */
  int index;  /* this warp's index in its group */
};

__device__ __forceinline__ MepHtGroups mep_ht_groups(int peers) {
  const int warps = blockDim.x / 32, warp = threadIdx.x / 32;
  MepHtGroups g;
  g.size = peers >= warps ? 1 : warps / peers;
  g.count = warps / g.size;
  g.group = warp / g.size;
  g.index = warp % g.size;
  return g;
}

/* The dispatch sender's groups: group d (d = destination rank) pushes
 * d's rows, and the group of this rank (`me`) places its own rows, half
 * of them (mep_ht_place_own_part). Pushing a row costs a warp more
 * than copying one locally, so the own group gets W / (R + 2) warps (4 of
 * 16 at R = 2) and the peers share the rest evenly; leftover warps idle
 * (group >= R). Groups of more than one warp use named barrier 1 + d, so
 * their d must stay below 15: with 16 warps only R <= 8 has such groups. */
__device__ __forceinline__ MepHtGroups mep_ht_send_groups(int R, int me) {
  const int warps = blockDim.x / 32, warp = threadIdx.x / 32;
  MepHtGroups g;
  g.count = R;
  if (R == 1) {
    g.size = warps;
    g.group = 0;
    g.index = warp;
    return g;
  }
  const int own = max(1, warps / (R + 2)), peer = max(1, (warps - own) / (R - 1));
  if (warp < own) {
    g.size = own;
    g.group = me;
    g.index = warp;
    return g;
  }
  const int j = (warp - own) / peer;
  g.size = peer;
  g.group = j >= R - 1 ? R : (j < me ? j : j + 1);
  g.index = (warp - own) % peer;
  return g;
}

/* Synchronises the warps of one group (named barrier 1 + group; barrier 0
 * is __syncthreads). A one-warp group needs only __syncwarp. */
__device__ __forceinline__ void mep_ht_group_sync(const MepHtGroups &g) {
  if (g.size == 1) {
    __syncwarp();
  } else {
    asm volatile("bar.sync %0, %1;" ::"r"(1 + g.group), "r"(g.size * 32) : "memory");
  }
}

/* Token range [t0, t1) of channel c: contiguous, so rows stay in token
 * order per (source, channel) and so per source. */
__device__ __forceinline__ void mep_ht_channel_tokens(int tokens, int chan, int c, int *t0,
                                                      int *t1) {
  *t0 = (int)((int64_t)tokens * c / chan);
  *t1 = (int)((int64_t)tokens * (c + 1) / chan);
}

__device__ __forceinline__ int64_t mep_ht_topk(const void *idx, int bytes, int64_t i) {
  return bytes == 8 ? static_cast<const int64_t *>(idx)[i]
                    : (int64_t) static_cast<const int32_t *>(idx)[i];
}

/* The ranks token t has an expert on (bit r). Out-of-range ids are
 * dropped like -1; *bad_k (where given) gets the first such slot, or -1. */
__device__ __forceinline__ uint64_t mep_ht_dest_mask(const void *idx, int bytes, int t, int K,
                                                     int num_experts, int e_local,
                                                     int *bad_k = nullptr) {
  uint64_t m = 0;
  if (bad_k != nullptr) *bad_k = -1;
  for (int k = 0; k < K; ++k) {
    const int64_t e = mep_ht_topk(idx, bytes, (int64_t)t * K + k);
    if (e >= 0 && e < num_experts) {
      m |= 1ull << (int)(e / e_local);
    } else if (bad_k != nullptr && e != -1 && *bad_k < 0) {
      *bad_k = k;
    }
  }
  return m;
}

/* Notes an out-of-range routing entry (its slot went as -1) unless the
 * notice record already holds one not yet reported; the runtime reports
 * it once through group_poll_error. Never aborts anything. The value is
 * clamped to int32, as LL's, so the sentence never names an in-range id. */
static __device__ __noinline__ void mep_ht_record_bad_routing(const MepWaitCtx &w, int token,
                                                              int k, int64_t value) {
  if (w.notice != nullptr)
    mep_publish_record(w.notice, w, MEP_HT_OP_BAD_ROUTING, -1,
                       value < INT32_MIN   ? INT32_MIN
                       : value > INT32_MAX ? INT32_MAX
                                           : (int)value,
                       (uint64_t)token, (uint64_t)k);
}

__device__ __forceinline__ void mep_ht_st_release(uint64_t *p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

/* Counter (peer, c) of array `off` in our own window, or in peer's. */
__device__ __forceinline__ uint64_t *mep_ht_word(const MepHtParams &p, uint64_t off, int peer,
                                                 int c) {
  return reinterpret_cast<uint64_t *>(p.xp.local + off +
                                      ((uint64_t)peer * MEP_HT_MAX_CHANNELS + c) * 8u);
}
__device__ __forceinline__ uint64_t *mep_ht_peer_word(const MepHtParams &p, int dst, uint64_t off,
                                                      int peer, int c) {
  return reinterpret_cast<uint64_t *>(MepLsa::peer_ptr(
      p.xp, dst, off + ((uint64_t)peer * MEP_HT_MAX_CHANNELS + c) * 8u));
}
/* Row `slot` of ring (peer, c) of a ring array at window offset `off`. */
__device__ __forceinline__ uint64_t mep_ht_ring_off(uint64_t off, uint64_t row, int peer, int c,
                                                    uint64_t slot) {
  return off + (((uint64_t)peer * MEP_HT_MAX_CHANNELS + c) * MEP_HT_RING_ROWS + slot) * row;
}

/* The combine staging slot of a network put to source s
 * (mep_ht_comb_stage_slots): per node with node sums, else per rank. */
__device__ __forceinline__ int mep_ht_comb_stage_slot(const MepHtParams &p, int s) {
  return p.dims.sum_by_node ? s / p.dims.node_ranks : s;
}

/* Entry (parity, peer, c) of a network count-word array (16-byte entries
 * [2][R][C]) at window offset `off`: win.cnt_net holds the word source
 * `peer` sent us, win.cnt_stage our staged copy of the one for
 * destination `peer`. */
__device__ __forceinline__ uint64_t mep_ht_cnt16_off(const MepHtParams &p, uint64_t off,
                                                     int parity, int peer, int c) {
  return off + (((uint64_t)parity * p.dims.world + (uint64_t)peer) * MEP_HT_MAX_CHANNELS + c) * 16u;
}

/* Device state words: per-(peer, channel) u64 arrays and scalars. */
__device__ __forceinline__ uint64_t *mep_ht_state_u64(const MepHtParams &p, uint64_t off,
                                                      int peer, int c) {
  return reinterpret_cast<uint64_t *>(p.state + off) + (uint64_t)peer * MEP_HT_MAX_CHANNELS + c;
}
__device__ __forceinline__ uint32_t *mep_ht_state_u32(const MepHtParams &p, uint64_t off) {
  return reinterpret_cast<uint32_t *>(p.state + off);
}
__device__ __forceinline__ int32_t *mep_ht_layout_n(const MepHtParams &p, int set) {
  return reinterpret_cast<int32_t *>(p.state + p.st.layout_n) +
         (uint64_t)set * p.dims.world * MEP_HT_MAX_CHANNELS;
}

/* Combine's token side: the row of y where this rank's own rows of
 * channel c start (rows packed by source, then channel, in the layout of
 * buffer set `set`). */
__device__ __forceinline__ int64_t mep_ht_own_base(const MepHtParams &p, int set, int channels,
                                                   int c) {
  const int32_t *layout = mep_ht_layout_n(p, set);
  int64_t b = 0;
  for (int s = 0; s <= p.xp.rank; ++s)
    for (int cc = 0; cc < (s < p.xp.rank ? channels : c); ++cc)
      b += layout[s * MEP_HT_MAX_CHANNELS + cc];
  return b;
}

/* The destination masks of a channel's first MEP_HT_MASK_CACHE tokens,
 * computed once per launch by the whole block into shared memory: a
 * chunk's ballots then cost a shared load instead of a global one (the
 * routing's load latency paid before every chunk of 32 rows was 10-20 %
 * of a chunk's copy time). Tokens past the cache are decoded again. */
#define MEP_HT_MASK_CACHE 2048
static_assert(MEP_HT_MAX_RANKS <= 32, "an HT destination mask is 32 bits");
struct MepHtMasks {
  uint32_t *sh; /* [MEP_HT_MASK_CACHE], token t0 + i at i */
  int t0, t1;
};

/* Fills the cache for channel [t0, t1). Block-wide; the caller's barrier
 * publishes it. */
__device__ __forceinline__ MepHtMasks mep_ht_masks_fill(uint32_t *sh, const void *idx, int bytes,
                                                       int t0, int t1, int K, int num_experts,
                                                       int e_local) {
  for (int t = t0 + (int)threadIdx.x; t < t1 && t - t0 < MEP_HT_MASK_CACHE; t += blockDim.x)
    sh[t - t0] = (uint32_t)mep_ht_dest_mask(idx, bytes, t, K, num_experts, e_local);
  return MepHtMasks{sh, t0, t1};
}

/* Token t's destination mask (0 past the channel's end). */
__device__ __forceinline__ uint32_t mep_ht_mask_at(const MepHtMasks &mc, const void *idx, int bytes,
                                                   int t, int K, int num_experts, int e_local) {
  if (t >= mc.t1) return 0u;
  if (t - mc.t0 < MEP_HT_MASK_CACHE) return mc.sh[t - mc.t0];
  return (uint32_t)mep_ht_dest_mask(idx, bytes, t, K, num_experts, e_local);
}

/* The destination ranks of token base + lane (0 past the channel's end):
 * one chunk's masks, one per lane. */
__device__ __forceinline__ uint32_t mep_ht_lane_mask(const MepHtMasks &mc, const void *idx,
                                                     int bytes, int base, int K, int num_experts,
                                                     int e_local) {
  return mep_ht_mask_at(mc, idx, bytes, base + (int)(threadIdx.x & 31), K, num_experts, e_local);
}

/* The group leader (lane 0 of the group's first warp) waits until
 * load() reaches `target`, then the group learns the value it saw, or 0
 * with *ok = false when the wait expired or another wait aborted. */
template <class Load>
__device__ __forceinline__ uint64_t mep_ht_leader_wait(const MepHtParams &p,
                                                       const MepHtGroups &g,
                                                       volatile uint64_t *slot, Load load,
                                                       uint64_t target, int op, int peer,
                                                       bool *ok) {
  if (g.index == 0 && (threadIdx.x & 31) == 0) {
    uint64_t seen = 0;
    const bool got = mep_wait_ge(p.wc, load, target, op, peer, -1, &seen);
    *slot = got ? seen : 0;
    slot[1] = got ? 1u : 0u;
  }
  mep_ht_group_sync(g);
  const uint64_t v = *slot;
  *ok = slot[1] != 0;
  mep_ht_group_sync(g); /* the slot is reused by the next wait */
  return v;
}

/* Waits until *v >= target, where *v is a count in shared memory that
 * other warps of the block advance, each of their own waits bounded:
 * gives up when one of them set *failed or another wait aborted, and as a
 * backstop after four timeouts with no progress (recorded as `op`, peer
 * -1). One thread. */
__device__ __forceinline__ bool mep_ht_wait_block(const MepWaitCtx &w, volatile int *v, int target,
                                                  volatile int *failed, int op) {
  long long start = clock64();
  int last = *v;
  for (uint32_t iter = 1;; ++iter) {
    const int x = *v;
    if (x >= target) return true;
    if (*failed) return false;
    if (x != last) {
      last = x;
      start = clock64();
    }
    if ((iter & 1023u) == 0) {
      if (mep_ld_volatile_u32(w.abort_flag)) return false;
      if ((uint64_t)(clock64() - start) > 4u * w.timeout_cycles) {
        mep_record_timeout(w, op, -1, -1, (uint64_t)target, (uint64_t)x);
        return false;
      }
    }
  }
}

/* Whether peer d is reached through the network protocol: on another node
 * of a group with network peers (never for the LSA-only kernels, where Tp
 * is MepLsa and this folds to false). */
template <class Tp>
__device__ __forceinline__ bool mep_ht_net(const MepHtParams &p, int d) {
  if constexpr (!Tp::kStaged) {
    return false;
  } else {
    const int n = p.dims.node_ranks;
    return d / n != p.xp.rank / n;
  }
}

/* How dispatch rows travel between this rank and rank y (PROTOCOL.md
 * "Relays"): directly over NVLink when y is on this node (always, for the
 * LSA-only kernels); over the network when y is on another node at this
 * rank's index in its node (y relays this rank's rows for its whole node,
 * and this rank relays y's for this node); otherwise through the relay of
 * the receiving node (y's relay here, or this rank's there), whose
 * NVLink stores fill the receiver's ring. Combine's rows go back the same
 * way when the group sums per node (dims.sum_by_node: a relay sums its
 * node's rows and puts one f32 row per token to the token's rank,
 * ht_combine_nodes.cuh); otherwise each goes straight to its token's rank,
 * over the network when that rank is on another node (mep_ht_net). */
enum MepHtRoute { kMepHtDirect, kMepHtNetwork, kMepHtRelayed };
template <class Tp>
__device__ __forceinline__ MepHtRoute mep_ht_route(const MepHtParams &p, int y) {
  if (!mep_ht_net<Tp>(p, y)) return kMepHtDirect;
  const int n = p.dims.node_ranks;
  return y % n == p.xp.rank % n ? kMepHtNetwork : kMepHtRelayed;
}

/* Index of ring (origin s, destination d, channel c) in the relay's
 * forwarding arrays (window fwd_head, state fwd_tail), [R][R][C]. */
__device__ __forceinline__ uint64_t mep_ht_fwd_index(const MepHtParams &p, int s, int d, int c) {
  return ((uint64_t)s * p.dims.world + (uint64_t)d) * MEP_HT_MAX_CHANNELS + (uint64_t)c;
}

/* Signal (kind, peer, c) of this rank, as GIN or its emulation keeps it. */
template <class Tp>
__device__ __forceinline__ uint64_t mep_ht_sig_read(const MepHtParams &p, int kind, int peer,
                                                    int c) {
  return Tp::read_signal(p.xp, mep_ht_sig(p.dims.world, kind, peer, c));
}

/* A ring's counter `pos` at the counter array `off`, for its other end:
 * a release store of the position into an NVLink peer's window, or for a
 * network peer an add of `delta` (the rows since the last) to its signal
 * (kind, this rank, c), after a fence that puts every earlier access of
 * the caller's group (ordered by its barrier) first. One thread. */
template <class Tp>
__device__ __forceinline__ void mep_ht_publish(const MepHtParams &p, int peer, uint64_t off,
                                               int kind, int c, uint64_t pos, uint64_t delta) {
  if (mep_ht_net<Tp>(p, peer)) {
    __threadfence_system();
    Tp::signal(p.xp, peer, mep_ht_sig(p.dims.world, kind, p.xp.rank, c), delta);
  } else {
    mep_ht_st_release(mep_ht_peer_word(p, peer, off, p.xp.rank, c), pos);
  }
}

/* The counter `off` (peer, c) of this rank's window, or for a network peer
 * its signal (kind, peer, c): a ring's far end's position. */
template <class Tp>
__device__ __forceinline__ uint64_t mep_ht_counter(const MepHtParams &p, uint64_t off, int kind,
                                                   int peer, int c) {
  return mep_ht_net<Tp>(p, peer) ? mep_ht_sig_read<Tp>(p, kind, peer, c)
                                 : mep_ld_acquire_sys(mep_ht_word(p, off, peer, c));
}

/* Ends a dispatch launch: the last block to arrive sets the epoch to e + 1
 * and resets the ticket for the next launch (a kernel boundary away). A
 * fatal record published without the abort flag (MEP_HT_OP_ROW_DESC: the
 * rings had to drain) raises it there, once every block is done, so the
 * failed group's later kernels already queued give up at once. Only
 * thread 0 of each block takes part, after its block's barrier. */
__device__ __forceinline__ void mep_ht_advance_epoch(uint32_t *ticket, uint32_t *epoch,
                                                     uint32_t e, const MepWaitCtx &wc) {
  __syncthreads();
  if (threadIdx.x != 0) return;
  if (atomicAdd(ticket, 1u) == gridDim.x - 1) {
    *ticket = 0;
    *epoch = e + 1u;
    __threadfence(); /* every block's record before its ticket is seen */
    if (*reinterpret_cast<volatile int32_t *>(&wc.err->flag) != 0) atomicExch(wc.abort_flag, 1u);
  }
}

/* Warp copy of `words` 4-byte words (any alignment of 4). */
__device__ __forceinline__ void mep_ht_copy_words(uint32_t *dst, const uint32_t *src, int words) {
  for (int i = threadIdx.x & 31; i < words; i += 32) dst[i] = __ldcg(src + i);
}

#endif /* MEP_HT_DEVICE_CUH_ */
