/* ll_dispatch_lsa.cuh: the LL dispatch's expert lists over LSA (NVLink
 * stores), both ends.
 *
 * The sender holds its routing, so it also lists, for every expert of the
 * group, which of its (token, k) slots name it, in (token, k) order: one
 * warp-sized unit per expert walks the local topk_idx (ballots, no block
 * barrier) and stores the entries and a count word straight into the
 * expert's rank (mep_ll_elist_count / mep_ll_elist_entry). A receive block
 * then reads, per local expert and source, one count word and that
 * source's few entries, all loads in flight at once, instead of scanning
 * every source's whole slot list in block-wide steps (one system-scope load
 * round trip per 960 words). The per-token slot list still travels: the
 * receive marks from it the routes of slots whose expert is on another
 * rank, and its head gives each source's token count and mode.
 *
 * Receive block layout: warps 0..14 read the list heads, the expert lists
 * (writing the slots: slot_src, route, counts) and then their share of the
 * slot lists (each slot's weight, and ELSEWHERE for slots whose expert is
 * on another rank), every first load of the three issued together; warp
 * 15 (sending the block's arrival first in the fused kernel) waits for the
 * count signals meanwhile, so the join finds them seen. Then every warp
 * copies rows, as in the staged receive. */
#ifndef MEP_LL_DISPATCH_LSA_CUH_
#define MEP_LL_DISPATCH_LSA_CUH_

#include "kernels/ll/ll_dispatch_copy.cuh"

/* Routing ids per lane per load step of an expert-list unit: 512 ids in
 * flight together. 32 (1024, one round trip at 128 tokens of top-8) spilled
 * in the fused kernel and measured 0.3-0.5 us slower at 1 and 128 tokens
 * (EP2 fp8 on 2 x H200). */
constexpr int kMepElistU = 16;

/* Warps of a receive block that read lists (the last one waits for the
 * count signals). */
constexpr int kMepListWarps = kMepWarps - 1;
constexpr int kMepListThreads = kMepListWarps * 32;

/* Window offset of expert list (local expert le, source r) in this set. */
__device__ __forceinline__ uint64_t mep_elist_off(const MepLLParams &p, int le, int r) {
  return p.set_off + p.lay.disp_elist +
         ((uint64_t)le * p.dims.world + (uint64_t)r) * mep_ll_elist_bytes(&p.dims);
}
/* Expert list (local expert le, source r) in this rank's window: word 0 the
 * count, words 1.. the entries. */
__device__ __forceinline__ uint64_t *mep_elist(const MepLLParams &p, int le, int r) {
  return reinterpret_cast<uint64_t *>(p.xp.local + mep_elist_off(p, le, r));
}

/* Routing ids per lane of a list with at most 32 * kMepElistSmallU ids
 * (16 tokens of top-8): one load step of that many ids instead of the
 * kMepElistU-step loop, most of whose loads and ballots are empty there.
 * EP2 fp8 on 2 x H200, 8 tokens: the hook send half 8.8-9.1 -> 8.4-8.5 us,
 * its slowest list unit done at 1.50 instead of 1.92-2.02 us after entry;
 * the fused dispatch within its range. A further step of 8 ids per lane up
 * to 256 ids measured equal at 32 tokens. */
constexpr int kMepElistSmallU = 4;

/* Stores the entries of expert e's list (the first M hits in (token, k)
 * order) from ids [0, n), U ids per lane per load step, and returns the
 * hits. Whole warp. */
template <int U, typename IdxT>
__device__ __forceinline__ uint32_t mep_elist_scan(const IdxT *ids, int n, int K, int M, int e,
                                                   uint32_t tag, uint64_t *list) {
  const int lane = threadIdx.x & 31;
  const unsigned lower = (1u << lane) - 1u;
  uint32_t hits = 0;
  for (int base = 0; base < n; base += 32 * U) {
    bool hit[U];
    {
      IdxT id[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int i = base + u * 32 + lane;
        id[u] = i < n ? ids[i] : (IdxT)-1;
      }
      /* e is a valid id, so an out-of-range one never matches */
#pragma unroll
      for (int u = 0; u < U; ++u) hit[u] = id[u] == (IdxT)e;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const unsigned ball = __ballot_sync(0xffffffffu, hit[u]);
      if (ball == 0) continue;
      const uint32_t pos = hits + __popc(ball & lower);
      const int i = base + u * 32 + lane;
      if (hit[u] && pos < (uint32_t)M)
        mep_st_relaxed_sys(list + 1 + pos, mep_ll_elist_entry(i / K, i % K, tag));
      hits += __popc(ball);
    }
  }
  return hits;
}

/* Send: expert e's list from this rank, at e's rank. Whole warp. Only the
 * first max_tokens hits are listed (more only with an expert repeated
 * within tokens); the count word carries them all, and the receiver marks
 * the rest DROPPED from the slot list. */
template <class Tp, typename IdxT>
__device__ __forceinline__ void mep_send_expert_list(const MepLLParams &p,
                                                     const MepDispatchArgs &a, int e,
                                                     uint32_t tag) {
  const int lane = threadIdx.x & 31;
  const int K = a.top_k, T = a.tokens, M = p.dims.max_tokens, n = T * K;
  int le;
  const int d = mep_expert_home(a, e, &le);
  uint64_t *list = static_cast<uint64_t *>(Tp::peer_ptr(p.xp, d, mep_elist_off(p, le, p.xp.rank)));
  const IdxT *ids = static_cast<const IdxT *>(a.topk);
  /* Up to 32 ids (1-4 tokens of top-8): one load and one ballot per lane
   * instead of the loop's kMepElistU steps, most of them empty. The list
   * blocks are receive blocks too and start their receive earlier; with
   * the receive's next-expert loads (mep_dispatch_recv_lsa) that takes
   * 1.4-1.9 us off a 1-token fused dispatch on 24 SMs (EP1, one H200). */
  if (n <= 32) {
    const bool hit = lane < n && ids[lane] == (IdxT)e;
    const unsigned ball = __ballot_sync(0xffffffffu, hit);
    const uint32_t pos = __popc(ball & ((1u << lane) - 1u));
    if (hit && pos < (uint32_t)M)
      mep_st_relaxed_sys(list + 1 + pos, mep_ll_elist_entry(lane / K, lane % K, tag));
    if (lane == 0) mep_st_relaxed_sys(list, mep_ll_elist_count(__popc(ball), T, tag));
    return;
  }
  const uint32_t hits = n <= 32 * kMepElistSmallU
                            ? mep_elist_scan<kMepElistSmallU>(ids, n, K, M, e, tag, list)
                            : mep_elist_scan<kMepElistU>(ids, n, K, M, e, tag, list);
  if (lane == 0) mep_st_relaxed_sys(list, mep_ll_elist_count(hits, T, tag));
}

/* Hits in source r's count word `c` for local expert le, checked against
 * the tokens its slot-list head gave: a count word whose token count
 * differs, or with more hits than tokens * top_k slots, comes from a
 * corrupt or mismatched peer; it is recorded (BAD_SIGNAL), sets *failed and
 * counts 0, so no entry is read past the list. One lane. */
__device__ __forceinline__ int mep_elist_count_checked(const MepLLParams &p, uint64_t c, int le,
                                                       int r, int tokens, int top_k,
                                                       int *failed) {
  const uint32_t hits = mep_ll_elist_hits(c);
  if (mep_ll_elist_tokens(c) == tokens && hits <= (uint32_t)(tokens * top_k)) return (int)hits;
  mep_record_timeout(p.wc, MEP_LL_OP_BAD_SIGNAL, r, le, (uint64_t)tokens, c);
  *failed = 1;
  return 0;
}

/* Sum over sources r' < r of their capped list counts (cnt: shared
 * memory). Whole warp. */
__device__ __forceinline__ int mep_elist_offset(const int *cnt, int r, int M) {
  int s = 0;
  for (int q = threadIdx.x & 31; q < r; q += 32) s += cnt[q] < M ? cnt[q] : M;
  return __reduce_add_sync(0xffffffffu, s);
}

/* Only with an expert repeated within tokens: source r listed `listed`
 * (more than max_tokens) hits for local expert le; its slots past the
 * first max_tokens in (token, k) order route DROPPED (their weights come
 * with the marks), and the notice says so. Walks r's slot list. Whole
 * warp. */
__device__ __forceinline__ void mep_mark_dropped(const MepLLParams &p, const MepDispatchArgs &a,
                                                 const uint64_t *words, int le, int r, int tokens,
                                                 int listed, uint32_t tag, int *failed) {
  const int lane = threadIdx.x & 31, M = p.dims.max_tokens, n = tokens * a.top_k;
  if (lane == 0) mep_record_repeated_expert(p, r, le, listed);
  const unsigned lower = (1u << lane) - 1u;
  int seen = 0;
  for (int i0 = 0; i0 < n; i0 += 32) {
    const int i = i0 + lane;
    uint64_t w = 0;
    if (i < n) w = mep_list_fresh(p, words + i, mep_ld_relaxed_sys(words + i), tag, r, failed);
    const bool hit = i < n && mep_ll_list_expert(w) == le;
    const unsigned ball = __ballot_sync(0xffffffffu, hit);
    if (hit && seen + __popc(ball & lower) >= M)
      a.route[(size_t)r * M * a.top_k + i].slot = MEP_LL_ROUTE_DROPPED;
    seen += __popc(ball);
  }
}

/* This block's share of the slot lists, in 32-word pieces (source, q),
 * one per list warp per round: round 0's words are loaded once the heads
 * are read (first) and used after the expert lists. Each slot's route gets
 * its weight, and ELSEWHERE where its expert is not here (the expert-list
 * readers write the others' slot fields). Whole warp. */
struct MepMarks {
  int per_src; /* pieces per source: its capacity, max_tokens * top_k words */
  int first;   /* round 0's piece index */
  int stride;  /* pieces per round over the grid */
};
__device__ __forceinline__ MepMarks mep_marks(const MepLLParams &p, const MepDispatchArgs &a) {
  MepMarks m;
  m.per_src = (p.dims.max_tokens * a.top_k + 31) / 32;
  m.first = blockIdx.x * kMepListWarps + threadIdx.x / 32;
  m.stride = gridDim.x * kMepListWarps;
  return m;
}
template <typename WordsOf>
__device__ __forceinline__ uint64_t mep_mark_load(const MepLLParams &p, const MepMarks &m, int s,
                                                  const int *tokens, int top_k, WordsOf words_of) {
  const int r = s / m.per_src, i = (s % m.per_src) * 32 + (threadIdx.x & 31);
  return r < p.dims.world && i < tokens[r] * top_k ? mep_ld_relaxed_sys(words_of(r) + i) : 0u;
}
template <typename WordsOf>
__device__ __forceinline__ void mep_mark_routes(const MepLLParams &p, const MepDispatchArgs &a,
                                                const MepMarks &m, uint64_t first,
                                                const int *tokens, const int *tag,
                                                WordsOf words_of, int *failed) {
  const int R = p.dims.world, M = p.dims.max_tokens, K = a.top_k;
  for (int s = m.first; s < R * m.per_src; s += m.stride) {
    const int r = s / m.per_src, i = (s % m.per_src) * 32 + (threadIdx.x & 31);
    if (i >= tokens[r] * K) continue;
    const uint64_t seen = s == m.first ? first : mep_ld_relaxed_sys(words_of(r) + i);
    const uint64_t v = mep_list_fresh(p, words_of(r) + i, seen, (uint32_t)tag[r], r, failed);
    const int ex = mep_ll_list_expert(v);
    mep_ll_route_t *rt = a.route + (size_t)r * M * K + i;
    rt->weight_bits = (int32_t)mep_ll_list_weight_bits(v);
    if (ex < 0 || ex >= a.local_experts) rt->slot = MEP_LL_ROUTE_ELSEWHERE;
  }
}

/* Piece c (32 words; word 0 of piece 0 is the count) of source r's list
 * for local expert le: each lane's entry (w: its word as loaded) becomes a
 * slot after those of sources r' < r (cnt: the expert's count per source),
 * written to slot_src, the route and, for the block's first expert,
 * slot_cache; the entry is zeroed once read. Whole warp. The hits past
 * max_tokens are the caller's (mep_mark_dropped, once per list). */
__device__ __forceinline__ void mep_elist_piece(const MepLLParams &p, const MepDispatchArgs &a,
                                                const int *cnt, int le, int r, int c, uint64_t w,
                                                const int *tokens, const int *tag, bool first_le,
                                                int32_t *slot_cache, int *failed) {
  const int M = p.dims.max_tokens, K = a.top_k, lane = threadIdx.x & 31;
  const int n = cnt[r] < M ? cnt[r] : M; /* entries are words 1..n */
  uint64_t *el = mep_elist(p, le, r);
  const int j = c * 32 + lane;
  const int off = mep_elist_offset(cnt, r, M);
  if (j >= 1 && j <= n) {
    w = mep_list_fresh(p, el + j, w, (uint32_t)tag[r], r, failed);
    const int slot = off + j - 1;
    const int tok = mep_ll_elist_token(w), k = mep_ll_elist_k(w);
    /* an entry past the head's tokens would index past the source's
     * routes: a corrupt or mismatched peer, failed like a bad count */
    if (tok < tokens[r] && k < K) {
      const int32_t v = MEP_LL_SLOT_PACK(r, tok, k);
      a.slot_src[(size_t)le * p.dims.world * M + slot] = v;
      if (first_le && slot < kMepSlotCache) slot_cache[slot] = v;
      a.route[((size_t)r * M + tok) * K + k].slot = le * p.dims.world * M + slot;
    } else {
      mep_record_timeout(p.wc, MEP_LL_OP_BAD_SIGNAL, r, le, (uint64_t)tokens[r] * K, w);
      *failed = 1;
    }
    el[j] = 0; /* read: zero until the next call's entry lands */
  }
}

/* A block with several local experts reads their lists in batches: the
 * count words and first pieces of up to kMepBatchUnits (expert, source)
 * pairs load in one round trip into shared memory, then one pass writes
 * every slot of the batch, with three barriers per batch instead of two
 * and a round trip per expert (the receive's walk grew ~1 us per expert). */
constexpr int kMepBatchLoads = 4; /* first pieces per list warp in flight */
constexpr int kMepBatchUnits = kMepListWarps * kMepBatchLoads;
struct MepElistBatch {
  uint64_t words[kMepBatchUnits][32]; /* pair u = expert * R + source: its piece 0 */
  int cnt[kMepBatchUnits];            /* pair u's checked count */
  int longer;                         /* some list of the batch goes past piece 0 */
};

/* Experts per batch (0: the batch would not fit, R > kMepBatchUnits). */
__device__ __forceinline__ int mep_elist_batch_experts(int R) { return kMepBatchUnits / R; }

/* Issues the loads of batch pairs [0, units) (pair u: local expert
 * le_of(u / R), source u % R; piece 0's words 0..M) and stores them in
 * b->words. List warps. */
template <typename LeOf>
__device__ __forceinline__ void mep_elist_batch_load(const MepLLParams &p, MepElistBatch *b,
                                                     int units, LeOf le_of) {
  const int R = p.dims.world, lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  uint64_t v[kMepBatchLoads];
#pragma unroll
  for (int i = 0; i < kMepBatchLoads; ++i) {
    const int u = warp + i * kMepListWarps;
    v[i] = u < units && lane <= p.dims.max_tokens
               ? mep_ld_relaxed_sys(mep_elist(p, le_of(u / R), u % R) + lane)
               : 0u;
  }
#pragma unroll
  for (int i = 0; i < kMepBatchLoads; ++i) {
    const int u = warp + i * kMepListWarps;
    if (u < units) b->words[u][lane] = v[i];
  }
}

/* One batch of `experts` local experts (le_of(0), le_of(1), ...) whose
 * pieces b->words holds: checks the count words, writes every slot,
 * recv_count and src_count, and zeroes what it read. i0: the block's
 * experts before the batch (0: it holds the first one, slot_cache);
 * filled_cache: the block's (kMepFilledCache). List warps; ends after a
 * list barrier. */
template <typename LeOf, typename Sync>
__device__ __forceinline__ void mep_elist_batch_take(const MepLLParams &p,
                                                     const MepDispatchArgs &a, MepElistBatch *b,
                                                     int experts, LeOf le_of, int i0,
                                                     const int *tokens, const int *tag,
                                                     int32_t *slot_cache, int *filled_cache,
                                                     Sync list_sync, int *failed) {
  const bool first = i0 == 0;
  const int R = p.dims.world, M = p.dims.max_tokens, K = a.top_k;
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const int units = experts * R, pieces = (M + 1 + 31) / 32;
  if (threadIdx.x == 0) b->longer = 0;
  list_sync(); /* b->words (and the last batch's readers are done with cnt) */
  for (int u = threadIdx.x; u < units; u += kMepListThreads) {
    const int le = le_of(u / R), r = u % R;
    const uint64_t *cw = mep_elist(p, le, r);
    const uint64_t c = mep_list_fresh(p, cw, b->words[u][0], (uint32_t)tag[r], r, failed);
    b->cnt[u] = mep_elist_count_checked(p, c, le, r, tokens[r], K, failed);
    if (b->cnt[u] >= 32) b->longer = 1;
  }
  list_sync(); /* cnt, longer */
  if (first && threadIdx.x == 0) mep_stamp_here(p, MEP_LL_STAMP_FIRST_WORDS);
  for (int u = warp; u < units; u += kMepListWarps) {
    const int i = u / R, r = u % R;
    mep_elist_piece(p, a, b->cnt + i * R, le_of(i), r, 0, b->words[u][lane], tokens, tag,
                    first && i == 0, slot_cache, failed);
    if (b->cnt[u] > M)
      mep_mark_dropped(p, a, mep_list_words(p, r), le_of(i), r, tokens[r], b->cnt[u],
                       (uint32_t)tag[r], failed);
  }
  if (b->longer) /* block-uniform: the rest of the long lists, piece by piece */
    for (int q = warp; q < units * (pieces - 1); q += kMepListWarps) {
      const int u = q % units, c = 1 + q / units, i = u / R, r = u % R;
      const int n = b->cnt[u] < M ? b->cnt[u] : M;
      if (c * 32 > n) continue; /* warp-uniform */
      const int j = c * 32 + lane;
      const uint64_t w = j <= n ? mep_ld_relaxed_sys(mep_elist(p, le_of(i), r) + j) : 0u;
      mep_elist_piece(p, a, b->cnt + i * R, le_of(i), r, c, w, tokens, tag, first && i == 0,
                      slot_cache, failed);
    }
  for (int i = warp; i < experts; i += kMepListWarps) {
    const int filled = mep_elist_offset(b->cnt + i * R, R, M);
    if (lane == 0) {
      a.recv_count[le_of(i)] = filled;
      if (i0 + i < kMepFilledCache) filled_cache[i0 + i] = filled;
    }
  }
  for (int u = threadIdx.x; u < units; u += kMepListThreads)
    a.src_count[le_of(u / R) * R + u % R] = b->cnt[u] < M ? b->cnt[u] : M;
  list_sync(); /* every piece is past its count word */
  for (int u = threadIdx.x; u < units; u += kMepListThreads)
    mep_elist(p, le_of(u / R), u % R)[0] = 0;
}

/* smem: MepRecvSmem (next: each source's count signal after this
 * receive, then its code; puts unused). */
template <class Tp, bool kFp8, bool kArriveAside, bool kBatched, bool kShare>
__device__ __forceinline__ void mep_dispatch_recv_lsa(const MepLLParams &p,
                                                      const MepDispatchArgs &a, int *smem) {
  static_assert(!Tp::kStaged && !Tp::kRowSignals, "expert lists are the LSA receive");
  /* failed: a bad code after the join; scan_failed: an expired wait or a
   * bad head before it (read only after the join). */
  __shared__ int failed, scan_failed;
  __shared__ int32_t slot_cache[kMepSlotCache]; /* this block's first expert */
  __shared__ int filled_cache[kMepFilledCache];
  const int R = p.dims.world, M = p.dims.max_tokens, K = a.top_k;
  const MepRecvSmem sm = mep_recv_smem(smem, R);
  /* in dynamic shared memory only when batched (mep_dispatch_recv_smem) */
  MepElistBatch &batch =
      *reinterpret_cast<MepElistBatch *>(reinterpret_cast<char *>(smem) + mep_recv_smem_base(R));
  uint64_t *next = sm.next;
  int *tokens = sm.tokens, *puts = sm.puts, *weighted = sm.weighted, *tag = sm.tag, *cnt = sm.cnt;
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  auto head_of = [&](int r) { return mep_list_head(p, r); };
  auto words_of = [&](int r) { return mep_list_words(p, r); };
  auto list_sync = [] { asm volatile("bar.sync 1, %0;" ::"n"(kMepListThreads) : "memory"); };

  if (threadIdx.x == 0) failed = scan_failed = 0;
  __syncthreads();
  if (warp == kMepWarps - 1) {
    if (kArriveAside) {
      /* The send half ended with a block barrier after its stores, so
       * this warp's release adds carry every thread's rows. */
      const uint64_t code = mep_ll_disp_code(a.tokens, 0, a.weighted, M);
      mep_arrival_send<Tp>(p, mep_ll_sig_disp_cnt(&p.dims, p.xp.rank), [&](int) { return code; },
                           lane, 32);
    }
    /* The count signals cover the rows; their codes are checked after the
     * join. */
    for (int r = lane; r < R; r += 32)
      if (!mep_dispatch_count_wait<Tp>(p, r, &next[r], &next[R + r])) scan_failed = 1;
    __syncwarp();
    if (lane == 0) mep_stamp_here(p, MEP_LL_STAMP_COUNTS);
  } else {
    /* Units (source r, 32-word piece c) of an expert's lists: r = u % R,
     * c = u / R; word 0 of piece 0 is the count. */
    const int pieces = (M + 1 + 31) / 32;
    const MepMarks marks = mep_marks(p, a);
    /* First loads, all at once: the heads, the first expert's count words
     * and each source's first piece of its list. */
    const int le0 = blockIdx.x;
    /* several local experts here: their lists in batches (MepElistBatch) */
    const int experts = le0 < a.local_experts ? (a.local_experts - 1 - le0) / gridDim.x + 1 : 0;
    const int per_batch = mep_elist_batch_experts(R);
    const bool batched = kBatched && experts >= 2 && per_batch >= 1;
    auto batch_from = [&](int i0) {
      return [&, i0](int i) { return le0 + (i0 + i) * (int)gridDim.x; };
    };
    const int r_own = threadIdx.x; /* the source whose head and count this thread reads first */
    /* own_count / spec: the current expert's count word of source r_own and
     * piece 0 of source `warp`'s list, loaded one expert ahead */
    uint64_t head0 = 0, own_count = 0, spec = 0;
    if (r_own < R) {
      head0 = mep_ld_relaxed_sys(head_of(r_own));
      if (!batched && le0 < a.local_experts)
        own_count = mep_ld_relaxed_sys(mep_elist(p, le0, r_own));
    }
    /* piece 0 only: most lists end there, and a load per word of every
     * piece would cost system-scope loads (each ~1 us) by the hundred */
    if (!batched && le0 < a.local_experts && warp < R && lane <= M)
      spec = mep_ld_relaxed_sys(mep_elist(p, le0, warp) + lane);
    if constexpr (kBatched)
      if (batched)
        mep_elist_batch_load(p, &batch, (experts < per_batch ? experts : per_batch) * R,
                             batch_from(0));
    for (int r = threadIdx.x; r < R; r += kMepListThreads) {
      const uint32_t t = mep_ll_next_tag(mep_tag(p, r));
      tag[r] = (int)t;
      const uint64_t h = mep_list_fresh(p, head_of(r), r == r_own ? head0 : mep_ld_relaxed_sys(head_of(r)),
                                        t, r, &scan_failed);
      const int n = mep_ll_head_tokens(h);
      if (n > M) {
        mep_record_timeout(p.wc, MEP_LL_OP_BAD_SIGNAL, r, -1, t, h);
        scan_failed = 1;
      } else if (!mep_head_desc_agrees<kFp8>(p, a, h, r, &scan_failed)) {
        scan_failed = 1;
      }
      tokens[r] = n > M ? 0 : n;
      weighted[r] = mep_ll_head_weighted(h);
      if (blockIdx.x == 0) a.src_tokens[r] = tokens[r] | (weighted[r] ? MEP_LL_SRC_WEIGHTED : 0);
    }
    if (threadIdx.x == 0) mep_stamp_here(p, MEP_LL_STAMP_HEADS);
    list_sync(); /* tokens and tag */
    /* this warp's first slot-list piece, used after the expert lists */
    const uint64_t mark0 = mep_mark_load(p, marks, marks.first, tokens, a.top_k, words_of);
    if constexpr (kBatched)
      for (int i0 = 0; batched && i0 < experts; i0 += per_batch) {
        const int n = experts - i0 < per_batch ? experts - i0 : per_batch;
        if (i0 > 0) mep_elist_batch_load(p, &batch, n * R, batch_from(i0));
        mep_elist_batch_take(p, a, &batch, n, batch_from(i0), i0, tokens, tag, slot_cache,
                             filled_cache, list_sync, &scan_failed);
        if (i0 == 0 && threadIdx.x == 0) mep_stamp_here(p, MEP_LL_STAMP_FIRST_STEP);
      }
    for (int le = batched ? a.local_experts : le0, nth = 0; le < a.local_experts;
         le += gridDim.x, ++nth) {
      const bool first_le = nth == 0;
      for (int r = threadIdx.x; r < R; r += kMepListThreads) {
        const uint64_t *cw = mep_elist(p, le, r);
        const uint64_t c0 = r == r_own ? own_count : mep_ld_relaxed_sys(cw);
        const uint64_t c = mep_list_fresh(p, cw, c0, (uint32_t)tag[r], r, &scan_failed);
        cnt[r] = mep_elist_count_checked(p, c, le, r, tokens[r], K, &scan_failed);
      }
      list_sync(); /* cnt */
      if (first_le && threadIdx.x == 0) mep_stamp_here(p, MEP_LL_STAMP_FIRST_WORDS);
      /* A block with several experts: this one's count words are fresh, so
       * the senders' lists have most likely all landed; the next expert's
       * count words and first pieces load now, under this one's entries,
       * and usually need no round trip of their own (a stale one waits in
       * mep_list_fresh as before). Measured with the one-ballot list unit
       * (mep_send_expert_list); without it this gained nothing. */
      const int le_next = le + gridDim.x;
      const uint64_t spec_cur = spec;
      if (le_next < a.local_experts) {
        if (r_own < R) own_count = mep_ld_relaxed_sys(mep_elist(p, le_next, r_own));
        if (warp < R && lane <= M) spec = mep_ld_relaxed_sys(mep_elist(p, le_next, warp) + lane);
      }
      for (int u = warp; u < R * pieces; u += kMepListWarps) {
        const int r = u % R, c = u / R;
        const int n = cnt[r] < M ? cnt[r] : M; /* entries are words 1..n */
        if (c * 32 > n) continue;              /* warp-uniform */
        const int j = c * 32 + lane;
        /* piece 0 of source `warp` was loaded one expert ahead (spec) */
        const uint64_t w = u == warp && warp < R ? spec_cur
                           : j >= 1 && j <= n    ? mep_ld_relaxed_sys(mep_elist(p, le, r) + j)
                                                 : 0u;
        mep_elist_piece(p, a, cnt, le, r, c, w, tokens, tag, first_le, slot_cache, &scan_failed);
        if (c == 0 && cnt[r] > M)
          mep_mark_dropped(p, a, words_of(r), le, r, tokens[r], cnt[r], (uint32_t)tag[r],
                           &scan_failed);
      }
      if (warp == 0) {
        const int filled = mep_elist_offset(cnt, R, M);
        if (lane == 0) {
          a.recv_count[le] = filled;
          if (nth < kMepFilledCache) filled_cache[nth] = filled;
        }
      }
      for (int r = threadIdx.x; r < R; r += kMepListThreads)
        a.src_count[le * R + r] = cnt[r] < M ? cnt[r] : M;
      list_sync(); /* cnt is reused; every unit is past its count word */
      for (int r = threadIdx.x; r < R; r += kMepListThreads) mep_elist(p, le, r)[0] = 0;
      if (first_le && threadIdx.x == 0) mep_stamp_here(p, MEP_LL_STAMP_FIRST_STEP);
    }
    if (threadIdx.x == 0) mep_stamp_here(p, MEP_LL_STAMP_SCANNED);
    mep_mark_routes(p, a, marks, mark0, tokens, tag, words_of, &scan_failed);
    if (threadIdx.x == 0) mep_stamp_here(p, MEP_LL_STAMP_MARKED);
  }
  __syncthreads(); /* the counts warp's shadows; this block's slots, counts and routes */
  mep_stamp(p, MEP_LL_STAMP_JOINED);
  /* The record says why; the handle may be partly written, no row is
   * copied. */
  if (scan_failed) return;
  mep_dispatch_check_codes(p, next, tokens, puts, weighted, &failed);
  __syncthreads();
  if (failed) return;
  mep_stamp(p, MEP_LL_STAMP_SEEN);
  mep_dispatch_recv_finish<Tp, kFp8, kShare>(p, a, next, tag, slot_cache, filled_cache);
}

#endif /* MEP_LL_DISPATCH_LSA_CUH_ */
