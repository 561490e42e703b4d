/* ht_dispatch.cu: the HT dispatch kernel. One cooperative launch of 2C
 * blocks: even blocks send channel c (a contiguous range of this rank's
 * tokens), odd blocks receive channel c from every source. Each token
 * crosses once per destination rank on its node and once per remote node
 * (to the relay there, which fans it out: ht_relay.cuh), through a
 * bounded ring per (source, destination, channel); rows land packed by
 * source rank, then token. */
#include <cuda_runtime.h>

#include "kernels/ht/ht_device.cuh"
#include "kernels/ht/ht_launch.cuh"
#include "kernels/ht/ht_relay.cuh"
#include "kernels/ht/ht_rows.cuh"

namespace {

/* This rank's own rows of the channel (mc), output rows from `out`: the
 * group places the rows of even chunks k (of 32 tokens) when `sender`,
 * the odd ones otherwise, so the sender block (pushes into the peers'
 * rings, with a small own-rows group: mep_ht_send_groups) and the
 * receiver block (ring to recv_x copies) each copy half. On 2 x H200,
 * 4096 tokens, 24 SMs, half took dispatch from 227.5-230.3 to 222.4-228.5
 * us against the sender taking a third. Whole warp group. */
__device__ void mep_ht_place_own_part(const mep_ht_dispatch_args_t &a, const MepHtGroups &g,
                                      const MepHtMasks &mc, int me, int e_local, int64_t out,
                                      bool sender, int32_t *hist) {
  for (int base = mc.t0, k = 0; base < mc.t1; base += MEP_HT_CHUNK, ++k) {
    const uint32_t bal = mep_ht_chunk_ballot(a, mc, base, MepHtSpan{me, 1}, e_local);
    const int n = __popc(bal);
    if ((k % 2 == 0) == sender)
      for (int o = g.index; o < n; o += g.size)
        mep_ht_place_own(a, base + mep_ht_nth_bit(bal, o), me, e_local, out + o, hist);
    out += n;
  }
}

/* What mep_ht_read_counts learnt: where channel c's rows from each source
 * land (base: rows packed by source, then channel), N_recv, the first
 * source whose rows are described otherwise than this call's, with its
 * description (refusal: s << 32 | desc; ~0 when none), and whether any
 * source's call (this rank's included) has worst-case rows. Every rank
 * reads the same words, so all agree on whether some call differs and on
 * `worst`. */
struct MepHtCounts {
  int64_t base[MEP_HT_MAX_RANKS];
  int64_t total;
  unsigned long long refusal;
  int worst;
};
__device__ __forceinline__ bool mep_ht_refused(const MepHtCounts &k) { return k.refusal != ~0ull; }

/* Every source's count word of every channel for this call's tag: rows
 * per (source, channel) into n[R * C], and into k the rest above. A
 * network source's word is there once its count signal has counted this
 * call (its put carries the signal after the word). False on every thread
 * when a wait expired or a source split its tokens into another number of
 * channels (recorded). A source whose row description differs from `mine`
 * still has its rows counted (they are drained). Block-wide. */
template <class Tp>
__device__ bool mep_ht_read_counts(const MepHtParams &p, uint32_t tag, uint32_t mine, int parity,
                                   int c, int32_t *n, MepHtCounts *k) {
  __shared__ int failed;
  const int R = p.dims.world, C = p.chan;
  const uint32_t word_tag = mep_ht_cnt_tag(tag);
  if (threadIdx.x == 0) {
    failed = 0;
    k->refusal = ~0ull;
    k->worst = 0;
  }
  __syncthreads();
  const uint64_t cnt_off = p.win.cnt + (uint64_t)parity * R * MEP_HT_MAX_CHANNELS * 8u;
  for (int i = threadIdx.x; i < R * C; i += blockDim.x) {
    const int s = i / C, cc = i % C;
    const bool net = mep_ht_net<Tp>(p, s);
    const uint64_t *w = net ? reinterpret_cast<const uint64_t *>(
                                  p.xp.local + mep_ht_cnt16_off(p, p.win.cnt_net, parity, s, cc))
                            : mep_ht_word(p, cnt_off, s, cc);
    uint64_t seen = 0;
    n[i] = 0;
    bool got;
    if (net) {
      /* The signal counts every call of s (each adds 1 to all of its
       * channels' signals), so its low 32 bits reach the tag with this
       * call's put; compared modulo 2^32, as the tag wraps. */
      got = mep_wait(
          p.wc, [&] { return mep_ht_sig_read<Tp>(p, MEP_HT_SIG_CNT, s, cc); },
          [&](uint64_t v) { return (int32_t)((uint32_t)v - tag) >= 0; }, tag,
          MEP_HT_OP_DISPATCH_COUNTS, s, -1, &seen);
      seen = got ? mep_ld_acquire_sys(w) : seen;
      if (got && MEP_HT_CNT_TAG(seen) != word_tag) {
        /* The signal counted this call but the word is another's: s sent
         * none on this channel (every call adds 1 to all of its signals). */
        mep_record_timeout(p.wc, MEP_HT_OP_CHANNEL_UNSENT, s, -1, (uint64_t)C, seen);
        got = false;
      }
    } else {
      got = mep_wait(
          p.wc, [&] { return mep_ld_acquire_sys(w); },
          [&](uint64_t v) { return MEP_HT_CNT_TAG(v) == word_tag; }, word_tag,
          MEP_HT_OP_DISPATCH_COUNTS, s, -1, &seen);
    }
    if (!got) {
      failed = 1;
    } else if (MEP_HT_CNT_CHAN(seen) != C) {
      mep_record_timeout(p.wc, MEP_HT_OP_CHANNELS, s, -1, (uint64_t)C, seen);
      failed = 1;
    } else {
      n[i] = MEP_HT_CNT_ROWS(seen);
      if (MEP_HT_CNT_DESC(seen) != mine)
        atomicMin(&k->refusal, (unsigned long long)s << 32 | MEP_HT_CNT_DESC(seen));
      if (MEP_HT_CNT_WORST(seen)) k->worst = 1;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int64_t sum = 0;
    for (int s = 0; s < R; ++s) {
      int64_t before = 0, all = 0;
      for (int cc = 0; cc < C; ++cc) {
        if (cc < c) before += n[s * C + cc];
        all += n[s * C + cc];
      }
      k->base[s] = sum + before;
      sum += all;
    }
    k->total = sum;
  }
  __syncthreads();
  return failed == 0;
}

/* Destination d = g.group's rows of channel c through its ring: chunks of
 * up to 32 rows, each written once room is there, then published with one
 * release store of the tail. A network destination is a relay: its ring
 * carries the rows of every token with an expert on d's node, numbered
 * for that node (ht_rows.cuh). They are written into this rank's staging
 * ring and put from there; the chunk's signal add on d's tail signal for
 * (this rank, c) follows every warp's puts. Whole warp group. */
template <class Tp>
__device__ void mep_ht_send_ring(const MepHtParams &p, const mep_ht_dispatch_args_t &a,
                                 const MepHtGroups &g, int c, const MepHtMasks &mc,
                                 volatile uint64_t *wait_slot) {
  const int d = g.group, e_local = a.num_experts / p.dims.world, lane = threadIdx.x & 31;
  uint64_t tail = *mep_ht_state_u64(p, p.st.send_tail_d, d, c);
  const uint64_t payload = mep_ht_payload_bytes(a.hidden, a.fp8, a.scale_words);
  const bool net = mep_ht_net<Tp>(p, d);
  const MepHtSpan sp =
      net ? MepHtSpan{d - d % p.dims.node_ranks, p.dims.node_ranks} : MepHtSpan{d, 1};
  const uint32_t put_bytes = (uint32_t)mep_ht_align(payload + 8u * (uint64_t)a.top_k, 16);
  bool ok = true;
  /* The last head the group saw: while it leaves room for a chunk, the
   * chunk goes without a wait (the group's two barriers and the far
   * end's load). Every warp holds the same value, so all decide alike. */
  uint64_t head_seen = 0;
  /* Chunks of a multiple of the group's warps in tokens (24 for 12
   * warps): where every token has a row here (EP2) each warp writes as
   * many rows as the others before the group's barrier, where 32 tokens
   * had 8 of 12 warps write a third row while 4 waited. */
  const int step = MEP_HT_CHUNK / g.size * g.size;
  const uint32_t in_step = step == 32 ? ~0u : (1u << step) - 1u;
  for (int base = mc.t0; base < mc.t1 && ok; base += step) {
    const uint32_t bal = mep_ht_chunk_ballot(a, mc, base, sp, e_local) & in_step;
    const int n = __popc(bal);
    if (n == 0) continue;
    /* Room for n rows: the destination has drained up to tail + n - Q. */
    const uint64_t need = tail + n > MEP_HT_RING_ROWS ? tail + n - MEP_HT_RING_ROWS : 0;
    if (need > head_seen) {
      head_seen = mep_ht_leader_wait(
          p, g, wait_slot,
          [&] { return mep_ht_counter<Tp>(p, p.win.disp_head, MEP_HT_SIG_DISP_HEAD, d, c); },
          need, MEP_HT_OP_DISPATCH_SPACE, d, &ok);
      if (!ok) break;
    }
    for (int o = g.index; o < n; o += g.size) {
      const uint64_t slot = (tail + (uint64_t)o) % MEP_HT_RING_ROWS;
      const uint64_t ring = mep_ht_ring_off(p.win.disp_ring, p.win.disp_row, p.xp.rank, c, slot);
      const int t = base + mep_ht_nth_bit(bal, o);
      if (net) {
        const uint64_t stage = mep_ht_ring_off(p.win.disp_stage, p.win.disp_row,
                                               d / p.dims.node_ranks, c, slot);
        mep_ht_write_row(a, payload, t, sp, e_local, p.xp.local + stage);
        __syncwarp(); /* the put reads what every lane wrote */
        Tp::put_warp_unsignalled(p.xp, d, ring, stage, put_bytes);
      } else {
        mep_ht_write_row(a, payload, t, sp, e_local,
                         static_cast<char *>(MepLsa::peer_ptr(p.xp, d, ring)));
      }
    }
    /* Every warp's rows, then one publication of the tail carries them.
     * Publishing every chunk beats fewer, larger publications: on 2 x
     * H200 at 4096 tokens, 24 SMs, every 2 chunks took dispatch from 237
     * to 246 us and every 4 to 336 us (the receivers wait longer for
     * rows than the senders' releases cost). */
    mep_ht_group_sync(g);
    tail += (uint64_t)n;
    if (g.index == 0 && lane == 0)
      mep_ht_publish<Tp>(p, d, p.win.disp_tail, MEP_HT_SIG_DISP_TAIL, c, tail, (uint64_t)n);
  }
  if (net) Tp::flush_warp(p.xp);
  if (g.index == 0 && lane == 0) *mep_ht_state_u64(p, p.st.send_tail_d, d, c) = tail;
}

template <class Tp>
__device__ void mep_ht_dispatch_send(const MepHtParams &p, const mep_ht_dispatch_args_t &a, int c,
                                     uint32_t tag, int parity, uint32_t *mask_sh) {
  __shared__ uint32_t cnt[MEP_HT_MAX_RANKS];
  __shared__ uint32_t cnt_node[MEP_HT_MAX_RANKS];
  __shared__ volatile uint64_t wait_slot[MEP_HT_THREADS / 32][2];
  __shared__ int32_t n_sh[MEP_HT_MAX_RANKS * MEP_HT_MAX_CHANNELS];
  __shared__ MepHtCounts k;
  __shared__ int32_t hist[MEP_MAX_LOCAL_EXPERTS];
  const int R = p.dims.world, e_local = a.num_experts / R;
  const uint32_t desc = mep_row_desc(a.hidden, a.top_k, a.fp8, a.scale_mode);
  /* Ranks per node for the relays' counts (the whole group without
   * network peers, where no relay exists). */
  const int nr = Tp::kStaged ? p.dims.node_ranks : R;
  int t0, t1;
  mep_ht_channel_tokens(a.num_tokens, p.chan, c, &t0, &t1);

  /* This channel's rows for each destination and for each node's relay,
   * announced first so every receiver learns where its rows go before any
   * arrive. */
  for (int d = threadIdx.x; d < R; d += blockDim.x) cnt[d] = cnt_node[d] = 0;
  __syncthreads();
  for (int t = t0 + threadIdx.x; t < t1; t += blockDim.x) {
    int bad_k;
    uint64_t m = mep_ht_dest_mask(a.topk_idx, a.topk_idx_bytes, t, a.top_k, a.num_experts,
                                  e_local, &bad_k);
    if (bad_k >= 0)
      mep_ht_record_bad_routing(p.wc, t, bad_k,
                                mep_ht_topk(a.topk_idx, a.topk_idx_bytes,
                                            (int64_t)t * a.top_k + bad_k));
    if (t - t0 < MEP_HT_MASK_CACHE) mask_sh[t - t0] = (uint32_t)m;
    if (Tp::kStaged)
      for (int b = 0; b < R / nr; ++b)
        if (mep_ht_in_span(m, MepHtSpan{b * nr, nr})) atomicAdd(&cnt_node[b], 1u);
    while (m != 0) {
      atomicAdd(&cnt[__ffsll((long long)m) - 1], 1u);
      m &= m - 1;
    }
  }
  __syncthreads();
  const MepHtMasks mc{mask_sh, t0, t1}; /* filled above: the chunks' ballots read it */
  const uint64_t cnt_off = p.win.cnt + (uint64_t)parity * R * MEP_HT_MAX_CHANNELS * 8u;
  for (int d = threadIdx.x / 32; d < R; d += blockDim.x / 32) {
    const uint64_t word = MEP_HT_CNT_WORD(tag, a.pad, desc, p.chan, cnt[d]);
    if (mep_ht_net<Tp>(p, d)) {
      /* Staged per (parity, destination): the next call's word goes to
       * the other slot, so an unfinished put never reads a newer one. A
       * relay's second word counts the rows of its network ring (every
       * token with an expert on its node); other ranks' is 0. */
      const uint64_t stage = mep_ht_cnt16_off(p, p.win.cnt_stage, parity, d, c);
      const uint64_t node_word =
          mep_ht_route<Tp>(p, d) == kMepHtNetwork
              ? MEP_HT_CNT_WORD(tag, a.pad, desc, p.chan, cnt_node[d / nr])
              : 0u;
      if ((threadIdx.x & 31) == 0)
        *reinterpret_cast<uint4 *>(p.xp.local + stage) =
            make_uint4((uint32_t)word, (uint32_t)(word >> 32), (uint32_t)node_word,
                       (uint32_t)(node_word >> 32));
      __syncwarp();
      Tp::put_warp(p.xp, d, mep_ht_cnt16_off(p, p.win.cnt_net, parity, p.xp.rank, c), nullptr,
                   stage, 16u,
                   mep_ht_sig(R, MEP_HT_SIG_CNT, p.xp.rank, c));
      /* The channels this call does not use count it too (blocks c, c + C,
       * ... below MEP_HT_MAX_CHANNELS): a later call with more channels
       * (set_num_sms) then finds each signal at its tag as well. */
      if ((threadIdx.x & 31) == 0)
        for (int cc = c + p.chan; cc < MEP_HT_MAX_CHANNELS; cc += p.chan)
          Tp::signal(p.xp, d, mep_ht_sig(R, MEP_HT_SIG_CNT, p.xp.rank, cc), 1u);
      /* No flush: this slot is staged again two calls later, after d has
       * used the word (its call finished before its next one fed ours). */
    } else if ((threadIdx.x & 31) == 0) {
      mep_st_relaxed_sys(mep_ht_peer_word(p, d, cnt_off, p.xp.rank, c), word);
    }
  }

  /* Where this channel's own rows land needs every source's counts. */
  if (!mep_ht_read_counts<Tp>(p, tag, desc, parity, c, n_sh, &k)) return;
  const bool drain = k.total > a.recv_capacity || mep_ht_refused(k);
  for (int i = threadIdx.x; i < e_local; i += blockDim.x) hist[i] = 0;
  __syncthreads();

  /* One destination per warp group (R <= MEP_HT_MAX_RANKS warps); every
   * warp of the group tracks the ring's tail itself. A rank on another
   * node that is not this rank's relay there gets its rows from that
   * relay: its group has nothing to send. */
  const MepHtGroups g = mep_ht_send_groups(R, p.xp.rank);
  const int d = g.group;
  if (d == p.xp.rank) {
    if (!drain) mep_ht_place_own_part(a, g, mc, d, e_local, k.base[d], true, hist);
  } else if (d < R && mep_ht_route<Tp>(p, d) != kMepHtRelayed) {
    mep_ht_send_ring<Tp>(p, a, g, c, mc, wait_slot[g.group]);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < e_local; i += blockDim.x)
    if (hist[i] != 0) atomicAdd(&a.recv_count[i], hist[i]);
}

template <class Tp>
__device__ void mep_ht_dispatch_recv(const MepHtParams &p, const mep_ht_dispatch_args_t &a, int c,
                                     uint32_t tag, int parity, uint32_t *mask_sh) {
  __shared__ int32_t n_sh[MEP_HT_MAX_RANKS * MEP_HT_MAX_CHANNELS];
  __shared__ MepHtCounts k;
  __shared__ int32_t hist[MEP_MAX_LOCAL_EXPERTS];
  __shared__ volatile uint64_t wait_slot[MEP_HT_THREADS / 32][2];
  const int R = p.dims.world, C = p.chan, e_local = a.num_experts / R;
  const int lane = threadIdx.x & 31;
  for (int i = threadIdx.x; i < e_local; i += blockDim.x) hist[i] = 0;
  int t0, t1;
  mep_ht_channel_tokens(a.num_tokens, C, c, &t0, &t1);
  /* This rank's own rows of the channel are placed here in part; their
   * masks load while the count words are still on their way. */
  const MepHtMasks mc = mep_ht_masks_fill(mask_sh, a.topk_idx, a.topk_idx_bytes, t0, t1, a.top_k,
                                          a.num_experts, e_local);

  const uint32_t desc = mep_row_desc(a.hidden, a.top_k, a.fp8, a.scale_mode);
  if (!mep_ht_read_counts<Tp>(p, tag, desc, parity, c, n_sh, &k)) return;
  const int64_t total = k.total;
  /* A source whose rows are laid out otherwise (another hidden, top_k or
   * row format): every rank drains its rings unwritten and refuses the
   * call, since any two ranks that differ each see the other. When some
   * rank's call has worst-case rows, no host sync learns of it there, so
   * every rank records it (fatal) instead, without the abort flag, which
   * would stop the drain its peers wait on; worst-case rows are all marked
   * empty for the experts. */
  const bool refused = mep_ht_refused(k);
  const bool drain = total > a.recv_capacity || refused;
  if (refused && k.worst && c == 0 && threadIdx.x == 0)
    mep_publish_record(p.wc.err, p.wc, MEP_HT_OP_ROW_DESC, (int)(k.refusal >> 32), -1, desc,
                       k.refusal & 0xffffffffu);
  if (c == 0) {
    /* The layout this set's combine sends back along, and N_recv. */
    int32_t *layout = mep_ht_layout_n(p, a.buffer_set);
    for (int i = threadIdx.x; i < R * C; i += blockDim.x)
      layout[(i / C) * MEP_HT_MAX_CHANNELS + i % C] = n_sh[i];
    if (threadIdx.x == 0) {
      reinterpret_cast<int32_t *>(p.state + p.st.layout_chan)[a.buffer_set] = C;
      /* Past recv_capacity the rows are drained unwritten; the runtime
       * compares N_recv with the capacity itself (it knows the call). */
      if (a.num_recv != nullptr)
        *a.num_recv = refused ? mep_ht_refused_recv((int)(k.refusal >> 32),
                                                    (uint32_t)(k.refusal & 0xffffffffu))
                              : total;
    }
  }
  if (a.pad && (refused || !drain)) {
    const int K = a.top_k;
    for (int64_t i = (refused ? 0 : total) * K + (int64_t)c * blockDim.x + threadIdx.x;
         i < a.recv_capacity * K;
         i += (int64_t)C * blockDim.x) {
      a.recv_topk_idx[i] = -1;
      a.recv_topk_weights[i] = 0.0f;
    }
  }

  const MepHtGroups g = mep_ht_groups(R);
  const uint64_t payload = mep_ht_payload_bytes(a.hidden, a.fp8, a.scale_words);
  if (g.group < g.count) {
    bool ok = true;
    for (int s = g.group; s < R && ok; s += g.count) {
      if (s == p.xp.rank) {
        if (!drain) mep_ht_place_own_part(a, g, mc, s, e_local, k.base[s], false, hist);
        continue;
      }
      const MepHtRoute route = mep_ht_route<Tp>(p, s);
      if (route == kMepHtNetwork) {
        ok = mep_ht_relay_ring<Tp>(p, a, g, c, s, tag, parity, k.base[s], drain, hist,
                                   wait_slot[g.group]);
        continue;
      }
      /* s's own ring, or the one s's relay on this node fills: both have
       * their tail in this window; the head goes to whichever writes it,
       * and an expired wait names that rank. */
      const int writer =
          route == kMepHtRelayed ? p.xp.rank - p.xp.rank % p.dims.node_ranks + s % p.dims.node_ranks
                                 : s;
      uint64_t *head_at =
          route == kMepHtRelayed
              ? reinterpret_cast<uint64_t *>(MepLsa::peer_ptr(
                    p.xp, writer, p.win.fwd_head + 8u * mep_ht_fwd_index(p, s, p.xp.rank, c)))
              : mep_ht_peer_word(p, s, p.win.disp_head, p.xp.rank, c);
      const int expect = n_sh[s * C + c];
      uint64_t head = *mep_ht_state_u64(p, p.st.recv_head_d, s, c);
      int got = 0;
      while (got < expect) {
        const uint64_t tail = mep_ht_leader_wait(
            p, g, wait_slot[g.group],
            [&] { return mep_ld_acquire_sys(mep_ht_word(p, p.win.disp_tail, s, c)); }, head + 1,
            MEP_HT_OP_DISPATCH_RECV, writer, &ok);
        if (!ok) break;
        const int avail = (int)min(tail - head, (uint64_t)(expect - got));
        if (!drain) {
          for (int o = g.index; o < avail; o += g.size) {
            const char *src =
                p.xp.local + mep_ht_ring_off(p.win.disp_ring, p.win.disp_row, s, c,
                                             (head + (uint64_t)o) % MEP_HT_RING_ROWS);
            mep_ht_read_row(a, payload, src, k.base[s] + got + o, 0, e_local, hist);
          }
        }
        /* The group's reads are done before the release store frees the slots. */
        mep_ht_group_sync(g);
        head += (uint64_t)avail;
        got += avail;
        if (g.index == 0 && lane == 0) mep_ht_st_release(head_at, head);
      }
      if (g.index == 0 && lane == 0) *mep_ht_state_u64(p, p.st.recv_head_d, s, c) = head;
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < e_local; i += blockDim.x)
    if (hist[i] != 0) atomicAdd(&a.recv_count[i], hist[i]);
}

template <class Tp>
/* __grid_constant__: the parameter block is read where it was passed;
 * without it every thread copied its 536 bytes to the stack on entry and
 * read fields back from there (~5.5 us per launch on H200). */
__global__ void __launch_bounds__(MEP_HT_THREADS, 1)
    mep_ht_dispatch_kernel(const __grid_constant__ MepHtParams p, const mep_ht_dispatch_args_t a) {
  uint32_t *epoch = mep_ht_state_u32(p, p.st.epoch);
  const uint32_t e = *reinterpret_cast<volatile uint32_t *>(epoch);
  __shared__ uint32_t mask_sh[MEP_HT_MASK_CACHE];
  const int c = blockIdx.x / 2;
  if (blockIdx.x % 2 == 0) {
    mep_ht_dispatch_send<Tp>(p, a, c, e + 1u, (int)(e & 1u), mask_sh);
  } else {
    mep_ht_dispatch_recv<Tp>(p, a, c, e + 1u, (int)(e & 1u), mask_sh);
  }
  /* Every block read e before any arrives here, so the next call (stream
   * ordered after this one) reads e + 1 everywhere. */
  mep_ht_advance_epoch(mep_ht_state_u32(p, p.st.ticket_dispatch), epoch, e, p.wc);
}

}  // namespace

/* Both transports' and the emulation's instances (mep_ht_load). */
extern "C" cudaError_t mep_ht_dispatch_load(void) {
  return mep_load_kernels(mep_ht_dispatch_kernel<MepLsa>, mep_ht_dispatch_kernel<MepGin>,
                          mep_ht_dispatch_kernel<MepGinEmu>);
}

extern "C" mep_kstatus_t mep_ht_dispatch(const mep_ht_ctx_t *ctx,
                                         const mep_ht_dispatch_args_t *a, void *stream) {
  mep_kstatus_t st = mep_ht_check_dispatch(ctx, a);
  if (st != MEP_KSTATUS_OK) return st;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  MepHtParams p;
  mep_ht_make_params(ctx, a->buffer_set, mep_ht_channels_for(ctx->num_sms), &p);
  if (a->recv_count != nullptr) {
    st = mep_kernels_cuda_check(
        "ht dispatch: cudaMemsetAsync(recv_count)",
        cudaMemsetAsync(a->recv_count, 0, (size_t)(a->num_experts / ctx->dims.world) * 4u, s));
    if (st != MEP_KSTATUS_OK) return st;
  }
  return mep_kernels_cuda_check(
      "ht dispatch: launch", mep_ht_for_transport(ctx->transport, [&](auto tp) {
        return mep_ht_launch(mep_ht_dispatch_kernel<decltype(tp)>, 2 * p.chan, s, p, *a);
      }));
}
