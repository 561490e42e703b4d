/* ht_combine.cu: the HT combine kernel. The reverse of dispatch along the
 * same channels: even blocks (experts' side) send each received row's
 * partial result back in the order it arrived, odd blocks (tokens' side)
 * walk their channel's tokens in order and sum each token's rows from its
 * ranks in ascending rank order, in f32 from +0, rounded to bf16 once. A
 * group that sums per node (dims.sum_by_node) takes the per-node path of
 * ht_combine_nodes.cuh instead: node sums from the relays, then the node
 * sums in ascending node order. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/ht/ht_combine_nodes.cuh"
#include "kernels/ht/ht_device.cuh"
#include "kernels/ht/ht_launch.cuh"

namespace {

template <class Tp>
__device__ void mep_ht_combine_send(const MepHtParams &p, const mep_ht_combine_args_t &a, int c) {
  __shared__ int64_t base_sh[MEP_HT_MAX_RANKS];
  __shared__ int32_t n_sh[MEP_HT_MAX_RANKS];
  __shared__ volatile uint64_t wait_slot[MEP_HT_THREADS / 32][2];
  const int R = p.dims.world, C = p.chan, lane = threadIdx.x & 31;
  __shared__ int mismatch;
  const int32_t *layout = mep_ht_layout_n(p, a.layout_set);
  if (threadIdx.x == 0) {
    /* The layout the dispatch left for this set must be split as we are. */
    const int32_t chan = reinterpret_cast<const int32_t *>(p.state + p.st.layout_chan)[a.layout_set];
    mismatch = chan != C;
    if (mismatch) mep_record_timeout(p.wc, MEP_HT_OP_CHANNELS, -1, -1, (uint64_t)C, (uint64_t)chan);
    int64_t total = 0;
    for (int s = 0; s < R; ++s) {
      int64_t before = 0, all = 0;
      for (int cc = 0; cc < C; ++cc) {
        const int32_t n = layout[s * MEP_HT_MAX_CHANNELS + cc];
        if (cc < c) before += n;
        all += n;
      }
      base_sh[s] = total + before;
      n_sh[s] = layout[s * MEP_HT_MAX_CHANNELS + c];
      total += all;
    }
  }
  __syncthreads();
  if (mismatch) return;
  /* This rank's own rows stay (its receive blocks read them from y), so
   * the block's warps split over the other ranks only: all 16 push the
   * one peer at EP2. */
  if (R == 1) return;
  const MepHtGroups g = mep_ht_groups(R - 1);
  if (g.group >= g.count) return;
  const uint32_t row_bytes = 2u * (uint32_t)a.hidden;
  const bool nodes = mep_ht_sum_nodes<Tp>(p);
  for (int j = g.group; j < R - 1; j += g.count) {
    const int s = j < p.xp.rank ? j : j + 1, n = n_sh[s];
    const MepHtRoute route = nodes ? mep_ht_route<Tp>(p, s) : kMepHtDirect;
    if (route == kMepHtNetwork) {
      /* s's relay here: its node's rows of s's tokens, summed, go back. */
      if (!mep_ht_relay_reduce<Tp>(p, a, g, c, s, base_sh[s], wait_slot[g.group])) break;
      continue;
    }
    /* Rows go to s, or with node sums to s's relay on this node, into the
     * ring it keeps for this rank's rows of s's node (mep_ht_comb_fwd). */
    const MepHtCombTarget tg = mep_ht_comb_target<Tp>(p, s, route);
    const bool net = mep_ht_net<Tp>(p, tg.dst);
    uint64_t tail = *mep_ht_state_u64(p, p.st.send_tail_c, s, c);
    bool ok = true;
    /* The last head the group saw: while it leaves room for a chunk, the
     * chunk goes without a wait (as the dispatch sender does). */
    uint64_t head_seen = 0;
    for (int sent = 0; sent < n;) {
      const int m = min(MEP_HT_CHUNK, n - sent);
      const uint64_t need = tail + m > MEP_HT_RING_ROWS ? tail + m - MEP_HT_RING_ROWS : 0;
      if (need > head_seen) {
        head_seen = mep_ht_leader_wait(
            p, g, wait_slot[g.group],
            [&] {
              return route == kMepHtRelayed
                         ? mep_ld_acquire_sys(mep_ht_word(p, p.win.comb_head, s, c))
                         : mep_ht_counter<Tp>(p, p.win.comb_head, MEP_HT_SIG_COMB_HEAD, s, c);
            },
            need, MEP_HT_OP_COMBINE_SPACE, tg.dst, &ok);
        if (!ok) break;
      }
      for (int o = g.index; o < m; o += g.size) {
        const char *src = static_cast<const char *>(a.y) +
                          (uint64_t)(base_sh[s] + sent + o) * row_bytes;
        const uint64_t slot = (tail + (uint64_t)o) % MEP_HT_RING_ROWS;
        const uint64_t ring = mep_ht_ring_off(p.win.comb_ring, p.win.comb_row, tg.ring, c, slot);
        if (net) {
          /* A network put reads the window: the row goes through staging. */
          const uint64_t stage =
              mep_ht_ring_off(p.win.comb_stage, p.win.comb_row, mep_ht_comb_stage_slot(p, s), c,
                              slot);
          mep_copy_warp<kMepHtCopyU>(p.xp.local + stage, src, row_bytes);
          __syncwarp();
          Tp::put_warp_unsignalled(p.xp, s, ring, stage, row_bytes);
        } else {
          mep_copy_warp<kMepHtCopyU>(MepLsa::peer_ptr(p.xp, tg.dst, ring), src, row_bytes);
        }
      }
      mep_ht_group_sync(g);
      tail += (uint64_t)m;
      sent += m;
      if (g.index == 0 && lane == 0) {
        if (route == kMepHtRelayed)
          mep_ht_st_release(mep_ht_peer_word(p, tg.dst, p.win.comb_tail, tg.ring, c), tail);
        else
          mep_ht_publish<Tp>(p, s, p.win.comb_tail, MEP_HT_SIG_COMB_TAIL, c, tail, (uint64_t)m);
      }
    }
    if (net) Tp::flush_warp(p.xp);
    if (!ok) break;
    if (g.index == 0 && lane == 0) *mep_ht_state_u64(p, p.st.send_tail_c, s, c) = tail;
  }
}

/* Vectors per lane per step of the sum: kMepHtSumU loads of each rank's
 * row in flight before any is used (one load latency per step). */
constexpr int kMepHtSumU = 8;

/* A token with rows from at most two ranks (every token at EP2): both
 * rows' vectors of a step are loaded before any is added, so a step costs
 * one load latency for twice the bytes of the general loop. Same order
 * and rounding: (+0 + row a) + row b in f32, a the lower rank; a missing
 * b adds +0, which leaves any sum of +0 + a unchanged. 10 vectors take a
 * hidden-7168 row (896 vectors) in three steps where 8 took four: on 2 x
 * H200 at 4096 tokens, 24 SMs, combine 240-247 -> 235.5-239.6 us; 12 was
 * no faster (128 registers, no spills either way). */
constexpr int kMepHtSum2U = 10;
__device__ __forceinline__ void mep_ht_sum_two(const uint4 *ra, const uint4 *rb, int nv,
                                               uint4 *out) {
  const int lane = threadIdx.x & 31;
  for (int v0 = 0; v0 < nv; v0 += 32 * kMepHtSum2U) {
    uint4 va[kMepHtSum2U], vb[kMepHtSum2U];
#pragma unroll
    for (int u = 0; u < kMepHtSum2U; ++u) {
      const int i = v0 + u * 32 + lane;
      const bool in = i < nv;
      va[u] = in && ra != nullptr ? __ldcg(ra + i) : make_uint4(0u, 0u, 0u, 0u);
      vb[u] = in && rb != nullptr ? __ldcg(rb + i) : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int u = 0; u < kMepHtSum2U; ++u) {
      const int i = v0 + u * 32 + lane;
      float acc[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[e] = 0.0f;
      mep_ht_add8(acc, va[u]);
      mep_ht_add8(acc, vb[u]);
      if (i < nv)
        out[i] = make_uint4(mep_ht_pack2(acc[0], acc[1]), mep_ht_pack2(acc[2], acc[3]),
                            mep_ht_pack2(acc[4], acc[5]), mep_ht_pack2(acc[6], acc[7]));
    }
  }
}

/* out = a token's rows from the ranks in mask m (row_of(d): rank d's row,
 * called by the whole warp), summed in ascending rank order in f32 from
 * +0, rounded to bf16 once. Whole warp. */
template <class RowOf>
__device__ __forceinline__ void mep_ht_sum_rows(uint32_t m, int H, RowOf row_of, uint4 *out) {
  const int lane = threadIdx.x & 31, nv = H / 8;
  if (__popc(m) <= 2) {
    const int da = m != 0 ? __ffs(m) - 1 : -1;
    const uint32_t rest = m != 0 ? m & (m - 1) : 0u;
    const int db = rest != 0 ? __ffs(rest) - 1 : -1;
    const uint4 *ra = da >= 0 ? row_of(da) : nullptr;
    const uint4 *rb = db >= 0 ? row_of(db) : nullptr;
    mep_ht_sum_two(ra, rb, nv, out);
    return;
  }
  for (int v0 = 0; v0 < nv; v0 += 32 * kMepHtSumU) {
    float acc[kMepHtSumU][8];
#pragma unroll
    for (int u = 0; u < kMepHtSumU; ++u)
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[u][e] = 0.0f;
    for (uint32_t left = m; left != 0; left &= left - 1) {
      const uint4 *row = row_of(__ffs(left) - 1);
      uint4 v[kMepHtSumU];
#pragma unroll
      for (int u = 0; u < kMepHtSumU; ++u) {
        const int i = v0 + u * 32 + lane;
        v[u] = i < nv ? __ldcg(row + i) : make_uint4(0u, 0u, 0u, 0u);
      }
#pragma unroll
      for (int u = 0; u < kMepHtSumU; ++u) mep_ht_add8(acc[u], v[u]);
    }
#pragma unroll
    for (int u = 0; u < kMepHtSumU; ++u) {
      const int i = v0 + u * 32 + lane;
      if (i < nv)
        out[i] = make_uint4(mep_ht_pack2(acc[u][0], acc[u][1]), mep_ht_pack2(acc[u][2], acc[u][3]),
                            mep_ht_pack2(acc[u][4], acc[u][5]), mep_ht_pack2(acc[u][6], acc[u][7]));
    }
  }
}

/* Chunks (of 32 tokens) a summing warp may run ahead of the last chunk
 * whose rows were freed: the slots of the per-chunk done counters. As many
 * as a ring holds, so the rows a warp waits for lie within one ring's
 * length of the freed ones, where the sender can push them once it has
 * room for their 32-row send chunk (at most one more freed chunk). With
 * more slots a warp could wait on rows a whole ring further on, which only
 * this rank's own slower warps hold back, and an expired wait there would
 * name a healthy peer. */
constexpr int kMepHtCombSlots = MEP_HT_RING_ROWS / MEP_HT_CHUNK;
static_assert(kMepHtCombSlots >= 2, "a ring holds at least two chunks");

/* One chunk's view for a warp: lane d (d < R) holds ring d's position of
 * the chunk's first row (cons) and which of the chunk's tokens have a row
 * from rank d (bal); every lane holds its token's rank mask (lm). */
struct MepHtChunkView {
  uint32_t lm, bal;
};
__device__ __forceinline__ MepHtChunkView mep_ht_chunk_view(const mep_ht_combine_args_t &a,
                                                            const MepHtMasks &mc, int base, int R,
                                                            int e_local) {
  const int lane = threadIdx.x & 31;
  MepHtChunkView v;
  v.lm = mep_ht_lane_mask(mc, a.topk_idx, a.topk_idx_bytes, base, a.top_k, a.num_experts,
                          e_local);
  v.bal = 0;
  for (int d = 0; d < R; ++d) {
    const uint32_t b = __ballot_sync(~0u, (v.lm >> d) & 1u);
    if (lane == d) v.bal = b;
  }
  return v;
}

/* The token side. The block's last warp frees rows; the others sum
 * tokens, token i of the channel by worker i % workers, running ahead of
 * each other freely: no block barrier per chunk. A worker counts each
 * token it finishes in its chunk's slot (done); the freeing warp waits
 * for a chunk's count to reach its tokens, then releases the chunk's rows
 * to every sender (one head store per rank), so no summing warp waits on
 * a release's fence or on a slower warp's tokens. A worker waits for the
 * rows of its token only (each lane d the tail of ring d, in parallel),
 * and starts a chunk at most kMepHtCombSlots past the last freed one. */
template <class Tp>
__device__ void mep_ht_combine_recv(const MepHtParams &p, const mep_ht_combine_args_t &a, int c,
                                    uint32_t *mask_sh) {
  __shared__ int done[kMepHtCombSlots];
  __shared__ int freed; /* chunks whose rows are freed */
  __shared__ int failed;
  __shared__ int64_t own_base;
  const int R = p.dims.world, me = p.xp.rank, e_local = a.num_experts / R;
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32, workers = blockDim.x / 32 - 1;
  const int H = a.hidden;
  int t0, t1;
  mep_ht_channel_tokens(a.num_tokens, a.channels, c, &t0, &t1);
  const int chunks = (t1 - t0 + MEP_HT_CHUNK - 1) / MEP_HT_CHUNK;
  if (threadIdx.x < kMepHtCombSlots) done[threadIdx.x] = 0;
  if (threadIdx.x == 0) {
    freed = 0;
    failed = 0;
    /* Own rows are read in place from y, at the row where this channel's
     * own rows were received (their positions count from 0). */
    own_base = mep_ht_own_base(p, a.layout_set, a.channels, c);
  }
  const MepHtMasks mc = mep_ht_masks_fill(mask_sh, a.topk_idx, a.topk_idx_bytes, t0, t1, a.top_k,
                                          a.num_experts, e_local);
  __syncthreads();
  uint64_t cons = lane < R && lane != me ? *mep_ht_state_u64(p, p.st.recv_head_c, lane, c) : 0;
  volatile int *vfreed = &freed, *vfailed = &failed;

  if (warp == workers) {
    /* The freeing warp: lane d releases ring d's rows, chunk by chunk. */
    for (int k = 0; k < chunks; ++k) {
      const int base = t0 + k * MEP_HT_CHUNK, n_tok = min(MEP_HT_CHUNK, t1 - base);
      const MepHtChunkView v = mep_ht_chunk_view(a, mc, base, R, e_local);
      volatile int *slot = &done[k % kMepHtCombSlots];
      bool ok = true;
      if (lane == 0) {
        ok = mep_ht_wait_block(p.wc, slot, n_tok, vfailed, MEP_HT_OP_COMBINE_RECV);
        if (!ok) *vfailed = 1;
        __threadfence_block(); /* the workers' reads of the chunk's rows come first */
      }
      if (!__shfl_sync(~0u, ok ? 1 : 0, 0)) break;
      __syncwarp(); /* and before every lane's release */
      const int n = __popc(v.bal);
      if (lane < R && n != 0) {
        cons += (uint64_t)n;
        if (lane != me)
          mep_ht_publish<Tp>(p, lane, p.win.comb_head, MEP_HT_SIG_COMB_HEAD, c, cons,
                             (uint64_t)n);
      }
      __syncwarp();
      if (lane == 0) {
        *slot = 0;
        __threadfence_block(); /* the slot is clear before a worker may reuse it */
        *vfreed = k + 1;
      }
    }
    __syncwarp();
    if (*vfailed == 0 && lane < R && lane != me) *mep_ht_state_u64(p, p.st.recv_head_c, lane, c) = cons;
  } else {
    uint64_t seen = 0; /* lane d: the last tail of ring d it saw */
    const uint16_t *own = static_cast<const uint16_t *>(a.y) + own_base * (int64_t)H;
    for (int k = 0; k < chunks; ++k) {
      /* One vote per warp: lanes reading the flag apart could leave the
       * loop apart, and every step below is a whole-warp operation. */
      if (__any_sync(~0u, *vfailed != 0)) break;
      const int base = t0 + k * MEP_HT_CHUNK, n_tok = min(MEP_HT_CHUNK, t1 - base);
      const MepHtChunkView v = mep_ht_chunk_view(a, mc, base, R, e_local);
      int j = ((warp - (base - t0)) % workers + workers) % workers;
      if (j < n_tok && k >= kMepHtCombSlots) {
        bool ok = true;
        if (lane == 0) {
          ok = mep_ht_wait_block(p.wc, vfreed, k - kMepHtCombSlots + 1, vfailed,
                                 MEP_HT_OP_COMBINE_RECV);
          if (!ok) *vfailed = 1; /* the block gives up now, not at the backstop */
        }
        if (!__shfl_sync(~0u, ok ? 1 : 0, 0)) break;
      }
      for (; j < n_tok; j += workers) {
        const uint32_t m = __shfl_sync(~0u, v.lm, j);
        const uint64_t pos = cons + __popc(v.bal & ((1u << j) - 1u));
        /* Lane d waits for ring d's tail to pass the token's row. */
        bool ok = true;
        if (lane < R && lane != me && ((m >> lane) & 1u) && pos >= seen) {
          uint64_t t = 0;
          ok = mep_wait_ge(
              p.wc,
              [&] { return mep_ht_counter<Tp>(p, p.win.comb_tail, MEP_HT_SIG_COMB_TAIL, lane, c); },
              pos + 1, MEP_HT_OP_COMBINE_RECV, lane, -1, &t);
          seen = t;
        }
        if (!__all_sync(~0u, ok)) {
          if (lane == 0) *vfailed = 1;
          break;
        }
        /* A vote orders no memory: the barrier puts every lane's row loads
         * after the acquires of the tails. */
        __syncwarp();
        mep_ht_sum_rows(
            m, H,
            [&](int d) {
              return mep_ht_comb_row(p, c, d, __shfl_sync(~0u, pos, d), d == me, own, H);
            },
            reinterpret_cast<uint4 *>(static_cast<uint16_t *>(a.out) + (uint64_t)(base + j) * H));
        __syncwarp();
        if (lane == 0) {
          __threadfence_block(); /* this token's reads before its count */
          atomicAdd(&done[k % kMepHtCombSlots], 1);
        }
      }
      cons += (uint64_t)__popc(v.bal);
    }
  }
  __syncthreads();
}

template <class Tp>
/* __grid_constant__: the parameter block is read where it was passed;
 * without it every thread copied its 536 bytes to the stack on entry and
 * read fields back from there (~5.5 us per launch on H200). */
__global__ void __launch_bounds__(MEP_HT_THREADS, 1)
    mep_ht_combine_kernel(const __grid_constant__ MepHtParams p, const mep_ht_combine_args_t a) {
  __shared__ uint32_t mask_sh[MEP_HT_MASK_CACHE];
  const int c = blockIdx.x / 2;
  if (blockIdx.x % 2 == 0) {
    mep_ht_combine_send<Tp>(p, a, c);
  } else if (mep_ht_sum_nodes<Tp>(p)) {
    mep_ht_combine_recv_nodes<Tp>(p, a, c, mask_sh);
  } else {
    mep_ht_combine_recv<Tp>(p, a, c, mask_sh);
  }
}

}  // namespace

/* Both transports' and the emulation's instances (mep_ht_load). */
extern "C" cudaError_t mep_ht_combine_load(void) {
  return mep_load_kernels(mep_ht_combine_kernel<MepLsa>, mep_ht_combine_kernel<MepGin>,
                          mep_ht_combine_kernel<MepGinEmu>);
}

extern "C" mep_kstatus_t mep_ht_combine(const mep_ht_ctx_t *ctx, const mep_ht_combine_args_t *a,
                                        void *stream) {
  mep_kstatus_t st = mep_ht_check_combine(ctx, a);
  if (st != MEP_KSTATUS_OK) return st;
  MepHtParams p;
  mep_ht_make_params(ctx, a->layout_set, a->channels, &p);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  return mep_kernels_cuda_check(
      "ht combine: launch", mep_ht_for_transport(ctx->transport, [&](auto tp) {
        return mep_ht_launch(mep_ht_combine_kernel<decltype(tp)>, 2 * p.chan, s, p, *a);
      }));
}
