/* ht_combine_nodes.cuh: HT combine summed per node (the config set
 * ranks_per_node) with the node sums formed on the relays (PROTOCOL.md
 * "Relays"). The ranks of a node send their rows of a remote token to the
 * token's relay there over NVLink; the relay sums them in f32 and puts one
 * f32 row per (token, node) to the token's rank, which adds its own node's
 * sum and the relays' in ascending node order. Also the bf16 helpers both
 * combine paths share. */
#ifndef MEP_HT_COMBINE_NODES_CUH_
#define MEP_HT_COMBINE_NODES_CUH_

#include <cuda_bf16.h>
#include <stdint.h>

#include "kernels/ht/ht_device.cuh"
#include "kernels/ht/ht_relay.cuh"

/* acc[0..7] += the 8 bf16 of v, in order. */
__device__ __forceinline__ void mep_ht_add8(float *acc, const uint4 v) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    acc[2 * i] += __uint_as_float(w[i] << 16);
    acc[2 * i + 1] += __uint_as_float(w[i] & 0xffff0000u);
  }
}

__device__ __forceinline__ uint32_t mep_ht_pack2(float lo, float hi) {
  const __nv_bfloat162 b = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t *>(&b);
}

/* Position pos of combine ring `ring` (channel c), or with `mine` this
 * rank's own row pos in y, read in place (own: its first own row). */
__device__ __forceinline__ const uint4 *mep_ht_comb_row(const MepHtParams &p, int c, int ring,
                                                        uint64_t pos, bool mine,
                                                        const uint16_t *own, int H) {
  return mine ? reinterpret_cast<const uint4 *>(own + pos * (uint64_t)H)
              : reinterpret_cast<const uint4 *>(
                    p.xp.local + mep_ht_ring_off(p.win.comb_ring, p.win.comb_row, ring, c,
                                                 pos % MEP_HT_RING_ROWS));
}

/* Row of token j of the chunk from rank d: in place in y for this rank,
 * else in d's combine ring. */
__device__ __forceinline__ const uint4 *mep_ht_sum_row(const MepHtParams &p, int c, int d, int j,
                                                       const uint64_t *cons, const uint32_t *bal,
                                                       int H, const uint16_t *own) {
  return mep_ht_comb_row(p, c, d, cons[d] + __popc(bal[d] & ((1u << j) - 1u)), d == p.xp.rank,
                         own, H);
}

/* The f32 node sum of token j of the chunk from relay x: two slots of x's
 * ring (mep_ht_relay_reduce), as 16-byte vectors (two per 8 channels). */
__device__ __forceinline__ const uint4 *mep_ht_node_sum_row(const MepHtParams &p, int c, int x,
                                                            int j, const uint64_t *cons,
                                                            const uint32_t *bal) {
  return mep_ht_comb_row(p, c, x, cons[x] + 2u * __popc(bal[x] & ((1u << j) - 1u)), false,
                         nullptr, 0);
}

/* The node sums below walk a row U vectors per lane at a time (lane l's
 * vectors v0 + 32 u + l, u < U) and issue the loads of G rows before
 * adding any of them: a lane has up to U * G 16-byte loads in flight (f32
 * rows: 2 U G), where adding a row at a time, a vector at a time, had one.
 * Each row's pointer is formed once per row, by the lane that holds its
 * ring's state, and reaches the others by shuffles: no pointer array, so
 * nothing in local memory and few registers (an array of a token's up to
 * 9 row pointers cost the kernel spills). The relay keeps one sum live (4
 * vectors of 2 rows: 8 loads); the token side keeps two, the nodes' so far
 * and its own node's (1 vector of 4 bf16 or 2 f32 rows: 4 loads). Larger
 * steps spill under the kernel's 128 registers (512 threads, one block
 * per SM): check nvcc -Xptxas -v after changing them. */
constexpr int kMepHtRelayU = 4, kMepHtRelayG = 2;
constexpr int kMepHtTokenU = 1, kMepHtTokenG = 4, kMepHtTokenG32 = 2;

template <int U>
__device__ __forceinline__ void mep_ht_node_zero(float acc[][8]) {
#pragma unroll
  for (int u = 0; u < U; ++u)
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[u][e] = 0.0f;
}

/* The row of the lowest lane in *lanes (its `row`, by shuffle), that lane
 * taken out of *lanes; nullptr when *lanes is empty. Whole warp, *lanes
 * the same on every lane. */
__device__ __forceinline__ const uint4 *mep_ht_node_take(const uint4 *row, uint32_t *lanes) {
  const bool any = *lanes != 0;
  const int l = any ? __ffs(*lanes) - 1 : 0;
  const unsigned long long r = __shfl_sync(~0u, reinterpret_cast<unsigned long long>(row), l);
  *lanes &= *lanes - 1u;
  return any ? reinterpret_cast<const uint4 *>(r) : nullptr;
}

/* acc[u] += the bf16 vector v0 + 32 u + lane of the row of each lane in
 * `lanes`, ascending: per channel the same mep_ht_add8 adds, in the same
 * order, as adding the rows one after another. Vectors at or past nv read
 * as zero; their sums are never stored. Whole warp, as mep_ht_node_take. */
template <int U, int G>
__device__ __forceinline__ void mep_ht_node_add_bf16(float acc[][8], const uint4 *row,
                                                     uint32_t lanes, int v0, int nv) {
  const int lane = threadIdx.x & 31;
  while (lanes != 0) {
    uint4 v[G][U];
    bool use[G];
#pragma unroll
    for (int k = 0; k < G; ++k) {
      const uint4 *r = mep_ht_node_take(row, &lanes);
      use[k] = r != nullptr;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int i = v0 + 32 * u + lane;
        v[k][u] = use[k] && i < nv ? __ldcg(r + i) : make_uint4(0u, 0u, 0u, 0u);
      }
    }
#pragma unroll
    for (int k = 0; k < G; ++k)
      if (use[k])
#pragma unroll
        for (int u = 0; u < U; ++u) mep_ht_add8(acc[u], v[k][u]);
  }
}

/* acc[u] += the f32 vector v0 + 32 u + lane (two float4) of the row of
 * each lane in `lanes`, ascending, as mep_ht_node_add_bf16. */
template <int U, int G>
__device__ __forceinline__ void mep_ht_node_add_f32(float acc[][8], const uint4 *row,
                                                    uint32_t lanes, int v0, int nv) {
  const int lane = threadIdx.x & 31;
  const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  while (lanes != 0) {
    float4 v[G][U][2];
    bool use[G];
#pragma unroll
    for (int k = 0; k < G; ++k) {
      const float4 *r = reinterpret_cast<const float4 *>(mep_ht_node_take(row, &lanes));
      use[k] = r != nullptr;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int i = v0 + 32 * u + lane;
        v[k][u][0] = use[k] && i < nv ? __ldcg(r + 2 * i) : zero;
        v[k][u][1] = use[k] && i < nv ? __ldcg(r + 2 * i + 1) : zero;
      }
    }
#pragma unroll
    for (int k = 0; k < G; ++k)
      if (use[k])
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const float4 x = v[k][u][0], y = v[k][u][1];
          acc[u][0] += x.x, acc[u][1] += x.y, acc[u][2] += x.z, acc[u][3] += x.w;
          acc[u][4] += y.x, acc[u][5] += y.y, acc[u][6] += y.z, acc[u][7] += y.w;
        }
  }
}

/* Whether this combine sums per node through relays: a network group
 * whose config set ranks_per_node, with several nodes of 2 or more ranks
 * (with nodes of one rank, or one node, the node sums change nothing and
 * the rows cross per rank as bf16). */
template <class Tp>
__device__ __forceinline__ bool mep_ht_sum_nodes(const MepHtParams &p) {
  if constexpr (!Tp::kStaged) {
    return false;
  } else {
    const int n = p.dims.node_ranks;
    return p.dims.sum_by_node != 0 && n > 1 && n < p.dims.world;
  }
}

/* Where the expert side's rows of source s's tokens go: to s (its ring for
 * this rank), or when s is relayed, to s's relay on this node, into the
 * ring that relay keeps for this rank's rows of s: index (node of s) n +
 * (this rank's index), an index whose own ring (a remote rank's rows for
 * the relay's tokens) node sums leave unused. */
struct MepHtCombTarget {
  int dst, ring;
};
template <class Tp>
__device__ __forceinline__ MepHtCombTarget mep_ht_comb_target(const MepHtParams &p, int s,
                                                              MepHtRoute route) {
  if (route != kMepHtRelayed) return MepHtCombTarget{s, p.xp.rank};
  const int n = p.dims.node_ranks, me_l = p.xp.rank % n;
  return MepHtCombTarget{p.xp.rank - me_l + s % n, (s / n) * n + me_l};
}

/* The relay's part of combine for network source s, channel c: along the
 * rows dispatch put into its network ring (the relay record), each row's
 * node sum (its local ranks' rows ascending, this rank's own from y at
 * `own`, in f32 from +0), staged and put as one f32 row (two ring slots)
 * into s's ring for this rank, a chunk of up to 32 rows at a time, then
 * the local ranks' rings freed and s's tail signal raised. False when a
 * wait expired (recorded). Whole warp group. */
template <class Tp>
__device__ bool mep_ht_relay_reduce(const MepHtParams &p, const mep_ht_combine_args_t &a,
                                    const MepHtGroups &g, int c, int s, int64_t own,
                                    volatile uint64_t *wait_slot) {
  const int n = p.dims.node_ranks, me_l = p.xp.rank % n, node0 = p.xp.rank - me_l;
  const int from = (s / n) * n, H = a.hidden, nv = H / 8, lane = threadIdx.x & 31;
  const int rows = *mep_ht_relay_n(p, a.layout_set, s, c);
  const uint16_t *masks =
      mep_ht_relay_mask(p, a.layout_set, s) + mep_ht_relay_base(p, a.layout_set, s, c);
  /* Lane l < n: how far this rank has read local rank l's ring for s. */
  const bool fwd_lane = lane < n && lane != me_l;
  uint64_t cons = fwd_lane ? *mep_ht_state_u64(p, p.st.recv_head_c, from + lane, c) : 0u;
  uint64_t tail = *mep_ht_state_u64(p, p.st.send_tail_c, s, c);
  bool ok = true;
  for (int done = 0; done < rows;) {
    const int m = min(MEP_HT_CHUNK, rows - done);
    const uint32_t mk = lane < m ? (uint32_t)masks[done + lane] : 0u;
    uint32_t rows_of = 0;
    for (int l = 0; l < n; ++l) {
      const uint32_t b = __ballot_sync(~0u, (mk >> l) & 1u);
      if (lane == l) rows_of = b;
    }
    const uint64_t need =
        tail + 2u * m > MEP_HT_RING_ROWS ? tail + 2u * m - MEP_HT_RING_ROWS : 0u;
    mep_ht_leader_wait(
        p, g, wait_slot,
        [&] { return mep_ht_counter<Tp>(p, p.win.comb_head, MEP_HT_SIG_COMB_HEAD, s, c); }, need,
        MEP_HT_OP_COMBINE_SPACE, s, &ok);
    for (int l = 0; l < n && ok; ++l) {
      const uint32_t cnt = __popc(__shfl_sync(~0u, rows_of, l));
      const uint64_t at = __shfl_sync(~0u, cons, l);
      if (l == me_l || cnt == 0) continue;
      mep_ht_leader_wait(
          p, g, wait_slot,
          [&] { return mep_ld_acquire_sys(mep_ht_word(p, p.win.comb_tail, from + l, c)); },
          at + cnt, MEP_HT_OP_COMBINE_RECV, node0 + l, &ok);
    }
    if (!ok) break;
    for (int o = g.index; o < m; o += g.size) {
      /* Row o's sources: the local ranks l in its mask (lane o's mk; bit
       * o of lane l's rows_of), summed ascending. Lane l forms the pointer
       * to l's row (this rank's own from y) from its ring state. o is the
       * same on every lane. */
      const uint32_t have = __shfl_sync(~0u, mk, o) & ((1u << n) - 1u);
      const uint64_t pos = __popc(rows_of & ((1u << o) - 1u));
      const uint4 *row = nullptr;
      if (((have >> lane) & 1u) != 0)
        row = lane == me_l ? mep_ht_comb_row(p, c, 0, (uint64_t)(own + (int64_t)pos), true,
                                             static_cast<const uint16_t *>(a.y), H)
                           : mep_ht_comb_row(p, c, from + lane, cons + pos, false, nullptr, H);
      /* Two slots of s's ring: tail stays even and the ring's rows are an
       * even number, so they are adjacent. */
      const uint64_t slot = (tail + 2u * (uint64_t)o) % MEP_HT_RING_ROWS;
      const uint64_t stage = mep_ht_ring_off(p.win.comb_stage, p.win.comb_row,
                                             mep_ht_comb_stage_slot(p, s), c, slot);
      float4 *dst = reinterpret_cast<float4 *>(p.xp.local + stage);
      for (int v0 = 0; v0 < nv; v0 += 32 * kMepHtRelayU) {
        float acc[kMepHtRelayU][8];
        mep_ht_node_zero<kMepHtRelayU>(acc);
        mep_ht_node_add_bf16<kMepHtRelayU, kMepHtRelayG>(acc, row, have, v0, nv);
#pragma unroll
        for (int u = 0; u < kMepHtRelayU; ++u) {
          const int i = v0 + 32 * u + lane;
          if (i >= nv) continue;
          dst[2 * i] = make_float4(acc[u][0], acc[u][1], acc[u][2], acc[u][3]);
          dst[2 * i + 1] = make_float4(acc[u][4], acc[u][5], acc[u][6], acc[u][7]);
        }
      }
      __syncwarp();
      Tp::put_warp_unsignalled(
          p.xp, s, mep_ht_ring_off(p.win.comb_ring, p.win.comb_row, p.xp.rank, c, slot), stage,
          4u * (uint32_t)H);
    }
    /* Every warp's reads and puts of the chunk are done. */
    mep_ht_group_sync(g);
    if (fwd_lane && rows_of != 0) {
      cons += (uint64_t)__popc(rows_of);
      if (g.index == 0)
        mep_ht_st_release(mep_ht_peer_word(p, node0 + lane, p.win.comb_head, s, c), cons);
    }
    own += __popc(__shfl_sync(~0u, rows_of, me_l));
    tail += 2u * (uint64_t)m;
    done += m;
    if (g.index == 0 && lane == 0)
      mep_ht_publish<Tp>(p, s, p.win.comb_tail, MEP_HT_SIG_COMB_TAIL, c, tail, 2u * (uint64_t)m);
  }
  Tp::flush_warp(p.xp);
  if (ok && g.index == 0) {
    if (lane == 0) *mep_ht_state_u64(p, p.st.send_tail_c, s, c) = tail;
    if (fwd_lane) *mep_ht_state_u64(p, p.st.recv_head_c, from + lane, c) = cons;
  }
  return ok;
}

/* The token side of a combine summed per node: per token, this node's
 * rows (ascending ranks, this rank's own from y) summed in f32 from +0,
 * and every other node's f32 sum from its relay (the rank at this rank's
 * index there), added in ascending node order from +0, rounded to bf16
 * once. Block-wide; same chunks and ring frees as mep_ht_combine_recv. */
template <class Tp>
__device__ void mep_ht_combine_recv_nodes(const MepHtParams &p, const mep_ht_combine_args_t &a,
                                          int c, uint32_t *mask_sh) {
  __shared__ uint64_t cons[MEP_HT_MAX_RANKS];
  __shared__ uint32_t bal[MEP_HT_MAX_RANKS];
  __shared__ uint32_t masks[MEP_HT_CHUNK];
  __shared__ uint64_t seen[MEP_HT_THREADS / 32][MEP_HT_MAX_RANKS]; /* lane 0 of each warp */
  __shared__ int failed;
  __shared__ int64_t own_base;
  const int R = p.dims.world, n = p.dims.node_ranks, me = p.xp.rank, me_l = me % n;
  const int node0 = me - me_l, e_local = a.num_experts / R, lane = threadIdx.x & 31;
  const int warp = threadIdx.x / 32, warps = blockDim.x / 32, H = a.hidden, nv = H / 8;
  int t0, t1;
  mep_ht_channel_tokens(a.num_tokens, a.channels, c, &t0, &t1);
  /* Ring d carries one bf16 row per token from a rank of this node, or two
   * slots (one f32 row) per token from another node's relay. */
  auto width = [&](int d) { return d / n == me / n ? 1u : 2u; };
  for (int d = threadIdx.x; d < R; d += blockDim.x)
    cons[d] = d == me ? 0 : *mep_ht_state_u64(p, p.st.recv_head_c, d, c);
  if (threadIdx.x == 0) {
    own_base = mep_ht_own_base(p, a.layout_set, a.channels, c);
    failed = 0;
  }
  if (lane == 0)
    for (int d = 0; d < R; ++d) seen[warp][d] = 0;
  const MepHtMasks mc = mep_ht_masks_fill(mask_sh, a.topk_idx, a.topk_idx_bytes, t0, t1, a.top_k,
                                          a.num_experts, e_local);
  const uint16_t *own = static_cast<const uint16_t *>(a.y);
  for (int base = t0; base < t1; base += MEP_HT_CHUNK) {
    __syncthreads(); /* cons, bal and masks of the previous chunk are done with */
    if (failed) break;
    if (warp == 0) {
      const uint32_t m = mep_ht_lane_mask(mc, a.topk_idx, a.topk_idx_bytes, base, a.top_k,
                                          a.num_experts, e_local);
      masks[lane] = m;
      for (int d = 0; d < R; ++d) {
        const bool here = d / n == me / n;
        const bool relay = !here && d % n == me_l;
        const bool uses = here ? ((m >> d) & 1u) != 0
                               : relay && ((m >> (d - me_l)) & ((1u << n) - 1u)) != 0;
        const uint32_t b = __ballot_sync(~0u, uses);
        if (lane == 0) bal[d] = b;
      }
    }
    __syncthreads();
    const int n_tok = min(MEP_HT_CHUNK, t1 - base);
    for (int j = warp; j < n_tok; j += warps) {
      bool ok = true;
      if (lane == 0) {
        for (int d = 0; d < R && ok; ++d) {
          if (d == me || ((bal[d] >> j) & 1u) == 0) continue;
          const uint64_t w = width(d);
          const uint64_t pos = cons[d] + w * __popc(bal[d] & ((1u << j) - 1u));
          if (pos + w <= seen[warp][d]) continue;
          uint64_t v = 0;
          ok = mep_wait_ge(
              p.wc,
              [&] { return mep_ht_counter<Tp>(p, p.win.comb_tail, MEP_HT_SIG_COMB_TAIL, d, c); },
              pos + w, MEP_HT_OP_COMBINE_RECV, d, -1, &v);
          seen[warp][d] = v;
        }
      }
      const bool all_there = __shfl_sync(~0u, ok ? 1 : 0, 0) != 0;
      __syncwarp(); /* the row loads follow lane 0's acquires */
      if (!all_there) {
        if (lane == 0) failed = 1;
        continue;
      }
      const uint32_t m = masks[j];
      /* The token's rows, by ring: lane d forms the pointer to the row in
       * ring d, a bf16 row from rank d of this node (lanes `local`) or
       * another node's f32 sum from its relay d here (lanes `relays`, in
       * ascending node order; `below`: those of nodes below this one). */
      const uint32_t local = m & (((1u << n) - 1u) << node0);
      uint32_t relays = 0;
      for (int b = 0; b < R / n; ++b)
        if (b * n != node0 && ((bal[b * n + me_l] >> j) & 1u) != 0)
          relays |= 1u << (b * n + me_l);
      const uint4 *row = nullptr;
      if (((local >> lane) & 1u) != 0)
        row = mep_ht_sum_row(p, c, lane, j, cons, bal, H, own + own_base * (int64_t)H);
      else if (((relays >> lane) & 1u) != 0)
        row = mep_ht_node_sum_row(p, c, lane, j, cons, bal);
      const uint32_t below = relays & ((1u << node0) - 1u);
      /* Per channel, the f32 adds of the node order: +0, the sums of the
       * nodes below this one, this node's sum (its rows from +0), the sums
       * of the nodes above; rounded to bf16 once. */
      uint4 *out = reinterpret_cast<uint4 *>(static_cast<uint16_t *>(a.out) +
                                             (uint64_t)(base + j) * H);
      for (int v0 = 0; v0 < nv; v0 += 32 * kMepHtTokenU) {
        float acc[kMepHtTokenU][8], part[kMepHtTokenU][8];
        mep_ht_node_zero<kMepHtTokenU>(acc);
        mep_ht_node_add_f32<kMepHtTokenU, kMepHtTokenG32>(acc, row, below, v0, nv);
        mep_ht_node_zero<kMepHtTokenU>(part);
        mep_ht_node_add_bf16<kMepHtTokenU, kMepHtTokenG>(part, row, local, v0, nv);
#pragma unroll
        for (int u = 0; u < kMepHtTokenU; ++u)
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[u][e] += part[u][e];
        mep_ht_node_add_f32<kMepHtTokenU, kMepHtTokenG32>(acc, row, relays & ~below, v0, nv);
#pragma unroll
        for (int u = 0; u < kMepHtTokenU; ++u) {
          const int i = v0 + 32 * u + lane;
          if (i < nv)
            out[i] = make_uint4(mep_ht_pack2(acc[u][0], acc[u][1]),
                                mep_ht_pack2(acc[u][2], acc[u][3]),
                                mep_ht_pack2(acc[u][4], acc[u][5]),
                                mep_ht_pack2(acc[u][6], acc[u][7]));
        }
      }
    }
    /* Every warp's reads of this chunk's rows are done: free them. */
    __syncthreads();
    for (int d = threadIdx.x; d < R; d += blockDim.x) {
      const uint64_t k = width(d) * (uint64_t)__popc(bal[d]);
      if (k == 0) continue;
      cons[d] += k;
      if (d == me) continue;
      mep_ht_publish<Tp>(p, d, p.win.comb_head, MEP_HT_SIG_COMB_HEAD, c, cons[d], k);
    }
  }
  __syncthreads();
  /* Only the rings this side reads: the other remote indices hold the
   * positions of the relay's rings, which this rank's sender block keeps
   * (mep_ht_relay_reduce) while this block runs. */
  if (!failed)
    for (int d = threadIdx.x; d < R; d += blockDim.x)
      if (d != me && (d / n == me / n || d % n == me_l))
        *mep_ht_state_u64(p, p.st.recv_head_c, d, c) = cons[d];
}

#endif /* MEP_HT_COMBINE_NODES_CUH_ */
