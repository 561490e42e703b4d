/* ht_relay.cuh: a relay's receive of a network ring. Source s on another
 * node puts each token once into the ring of the rank at its own index on
 * this node (the relay), with the token's slots numbered for the whole
 * node; the relay keeps its own rows and copies every other rank's into
 * that rank's ring for s over NVLink, as if s had written them
 * (PROTOCOL.md "Relays"). */
#ifndef MEP_HT_RELAY_CUH_
#define MEP_HT_RELAY_CUH_

#include <stdint.h>

#include "kernels/ht/ht_device.cuh"
#include "kernels/ht/ht_rows.cuh"

/* The relay's state word (tail) and window word (head, written by the
 * destination) of forwarded ring (origin s, destination d, channel c). */
__device__ __forceinline__ uint64_t *mep_ht_fwd_tail(const MepHtParams &p, int s, int d, int c) {
  return reinterpret_cast<uint64_t *>(p.state + p.st.fwd_tail) + mep_ht_fwd_index(p, s, d, c);
}
__device__ __forceinline__ uint64_t *mep_ht_fwd_head(const MepHtParams &p, int s, int d, int c) {
  return reinterpret_cast<uint64_t *>(p.xp.local + p.win.fwd_head) + mep_ht_fwd_index(p, s, d, c);
}

/* The relay record of buffer set `set` (mep_ht_state_t.relay_n/mask): the
 * rows of network ring (s, c), and the local-rank masks of s's rows. */
__device__ __forceinline__ int32_t *mep_ht_relay_n(const MepHtParams &p, int set, int s, int c) {
  return reinterpret_cast<int32_t *>(p.state + p.st.relay_n) +
         ((uint64_t)set * p.dims.world + (uint64_t)s) * MEP_HT_MAX_CHANNELS + (uint64_t)c;
}
__device__ __forceinline__ uint16_t *mep_ht_relay_mask(const MepHtParams &p, int set, int s) {
  return reinterpret_cast<uint16_t *>(p.state + p.st.relay_mask) +
         ((uint64_t)set * p.dims.world + (uint64_t)s) * (uint64_t)p.dims.max_tokens;
}
/* Rows of s's network rings of the channels before c, from the record. */
__device__ __forceinline__ int mep_ht_relay_base(const MepHtParams &p, int set, int s, int c) {
  int b = 0;
  for (int cc = 0; cc < c; ++cc) b += *mep_ht_relay_n(p, set, s, cc);
  return b;
}

/* Drains network source s's ring of channel c: rows this rank keeps go to
 * output rows from `own_out` (unless draining), the others into their
 * rank's ring (s, c), each published with one release store of its tail
 * per chunk of up to 32 rows; the network ring's head goes back to s as a
 * signal add. The rows to expect are the relay count in the second word
 * of s's count entry. Rows are read and forwarded as s laid them out (the
 * row description in its count word), so a relay whose own call differs
 * still forwards them whole to ranks that refuse them. False when a wait
 * expired (recorded). Whole warp group. */
template <class Tp>
__device__ bool mep_ht_relay_ring(const MepHtParams &p, const mep_ht_dispatch_args_t &a,
                                  const MepHtGroups &g, int c, int s, uint32_t tag, int parity,
                                  int64_t own_out, bool drain, int32_t *hist,
                                  volatile uint64_t *wait_slot) {
  const int n = p.dims.node_ranks, me_l = p.xp.rank % n, node0 = p.xp.rank - me_l;
  const int e_local = a.num_experts / p.dims.world, lane = threadIdx.x & 31;
  /* mep_ht_read_counts saw s's count signal reach this call: the entry's
   * put has landed, and its first word is this call's. */
  const uint64_t *entry = reinterpret_cast<const uint64_t *>(
      p.xp.local + mep_ht_cnt16_off(p, p.win.cnt_net, parity, s, c));
  const uint32_t desc = MEP_HT_CNT_DESC(mep_ld_acquire_sys(entry));
  const int K = mep_row_desc_top_k(desc);
  const uint64_t payload = mep_ht_desc_payload(desc);
  const uint64_t w = mep_ld_acquire_sys(entry + 1);
  if (MEP_HT_CNT_TAG(w) != mep_ht_cnt_tag(tag)) {
    if (g.index == 0 && lane == 0)
      mep_record_timeout(p.wc, MEP_HT_OP_RELAY_WORD, s, -1, (uint64_t)mep_ht_cnt_tag(tag), w);
    return false;
  }
  const int expect = MEP_HT_CNT_ROWS(w);
  /* The record combine reduces along: this ring's rows, and each row's
   * local ranks after those of the earlier channels (their count words
   * are in: mep_ht_read_counts waited for every channel's). */
  int rec_base = 0;
  for (int cc = 0; cc < c; ++cc)
    rec_base += MEP_HT_CNT_ROWS(mep_ld_acquire_sys(
        reinterpret_cast<const uint64_t *>(p.xp.local +
                                           mep_ht_cnt16_off(p, p.win.cnt_net, parity, s, cc)) +
        1));
  uint16_t *rec = mep_ht_relay_mask(p, a.buffer_set, s) + rec_base;
  if (g.index == 0 && lane == 0) *mep_ht_relay_n(p, a.buffer_set, s, c) = expect;
  /* Lane l < n keeps the tail of the ring to local rank l; every warp of
   * the group keeps the same copy. */
  const bool fwd_lane = lane < n && lane != me_l;
  uint64_t ftail = fwd_lane ? *mep_ht_fwd_tail(p, s, node0 + lane, c) : 0u;
  uint64_t head = *mep_ht_state_u64(p, p.st.recv_head_d, s, c);
  bool ok = true;
  for (int got = 0; got < expect;) {
    const uint64_t tail = mep_ht_leader_wait(
        p, g, wait_slot, [&] { return mep_ht_sig_read<Tp>(p, MEP_HT_SIG_DISP_TAIL, s, c); },
        head + 1, MEP_HT_OP_DISPATCH_RECV, s, &ok);
    if (!ok) break;
    const int avail = (int)min(min(tail - head, (uint64_t)(expect - got)), (uint64_t)MEP_HT_CHUNK);
    /* Lane i: the local ranks row head + i goes to; lane l: the rows of
     * the chunk that go to local rank l (bit o: row head + o). */
    uint32_t ranks = 0;
    if (lane < avail) {
      const int32_t *slots = reinterpret_cast<const int32_t *>(
          p.xp.local +
          mep_ht_ring_off(p.win.disp_ring, p.win.disp_row, s, c,
                          (head + (uint64_t)lane) % MEP_HT_RING_ROWS) +
          payload);
      for (int k = 0; k < K; ++k) {
        const int32_t e = __ldcg(slots + k);
        if (e >= 0) ranks |= 1u << (e / e_local);
      }
    }
    if (g.index == 0 && lane < avail) rec[got + lane] = (uint16_t)ranks;
    uint32_t rows_of = 0;
    for (int l = 0; l < n; ++l) {
      const uint32_t b = __ballot_sync(~0u, (ranks >> l) & 1u);
      if (lane == l) rows_of = b;
    }
    /* Room in every ring this chunk writes into. */
    for (int l = 0; l < n && ok; ++l) {
      const uint32_t cnt = __popc(__shfl_sync(~0u, rows_of, l));
      const uint64_t ft = __shfl_sync(~0u, ftail, l);
      if (l == me_l || cnt == 0) continue;
      const uint64_t need = ft + cnt > MEP_HT_RING_ROWS ? ft + cnt - MEP_HT_RING_ROWS : 0;
      mep_ht_leader_wait(
          p, g, wait_slot,
          [&] { return mep_ld_acquire_sys(mep_ht_fwd_head(p, s, node0 + l, c)); }, need,
          MEP_HT_OP_DISPATCH_SPACE, node0 + l, &ok);
    }
    if (!ok) break;
    for (int o = g.index; o < avail; o += g.size) {
      const char *src = p.xp.local + mep_ht_ring_off(p.win.disp_ring, p.win.disp_row, s, c,
                                                     (head + (uint64_t)o) % MEP_HT_RING_ROWS);
      for (int l = 0; l < n; ++l) {
        const uint32_t b = __shfl_sync(~0u, rows_of, l);
        const uint64_t ft = __shfl_sync(~0u, ftail, l);
        if (((b >> o) & 1u) == 0) continue;
        const int pos = __popc(b & ((1u << o) - 1u));
        if (l == me_l) {
          if (!drain) mep_ht_read_row(a, payload, src, own_out + pos, l * e_local, e_local, hist);
          continue;
        }
        char *dst = static_cast<char *>(MepLsa::peer_ptr(
            p.xp, node0 + l,
            mep_ht_ring_off(p.win.disp_ring, p.win.disp_row, s, c, (ft + pos) % MEP_HT_RING_ROWS)));
        mep_ht_forward_row(payload, K, src, dst, l * e_local, e_local);
      }
    }
    /* Every warp's reads and stores of the chunk are done: publish the
     * forwarded rows to their ranks, then free the network ring's slots. */
    mep_ht_group_sync(g);
    if (fwd_lane && rows_of != 0) {
      ftail += (uint64_t)__popc(rows_of);
      if (g.index == 0)
        mep_ht_st_release(mep_ht_peer_word(p, node0 + lane, p.win.disp_tail, s, c), ftail);
    }
    own_out += __popc(__shfl_sync(~0u, rows_of, me_l));
    head += (uint64_t)avail;
    got += avail;
    if (g.index == 0 && lane == 0)
      mep_ht_publish<Tp>(p, s, p.win.disp_head, MEP_HT_SIG_DISP_HEAD, c, head, (uint64_t)avail);
  }
  if (g.index == 0) {
    if (lane == 0) *mep_ht_state_u64(p, p.st.recv_head_d, s, c) = head;
    if (fwd_lane) *mep_ht_fwd_tail(p, s, node0 + lane, c) = ftail;
  }
  return ok;
}

#endif /* MEP_HT_RELAY_CUH_ */
