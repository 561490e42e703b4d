/* ll_dispatch_body.cuh: the LL dispatch's two halves as device functions,
 * shared by the separate send/receive kernels (hooks) and the fused kernel
 * (one launch when the receive is not deferred).
 *
 * Send: each token goes once to each rank that holds at least one of its
 * experts, into the (source rank, token) row of that rank's receive area,
 * together with the token's slot-list words as the destination sees them
 * (local expert per k, or none; the weight; the call's tag), and a list
 * head (tokens, weighted, tag); the receiver builds the per-expert slots
 * (deterministic order) itself. LSA: work unit = (token, destination,
 * chunk of 512 or 1024 channels: MepDispatchArgs.chunk); the warp loads
 * its chunk, then the routing, and quantises straight into the peer's row
 * (16-byte stores); every block
 * then adds its arrival to each destination's count signal (the fused
 * kernel leaves that to its receive half's last warp). Staged transports
 * (GIN, GIN-emulated): one warp per token quantises once into the local
 * staging row (a put's source must be in the window), puts it once per
 * destination, and the last block puts each destination's list and sends
 * the count signals.
 *
 * LSA also sends every expert's list of this rank's slots that name it
 * (ll_dispatch_lsa.cuh), as the first work units.
 *
 * Receive: LSA reads, per local expert, each source's expert list as its
 * tagged words land, before the rows are complete, then waits for the
 * count signals; staged transports wait for the counts and puts first and
 * scan the slot lists. Either way the slots come in (source rank, token,
 * k) order. Warps then copy the rows into the slots. Writes the handle
 * (slot sources, counts, and each received slot's route for combine).
 * Each block then advances its own copies of the signal shadows and list
 * tags. */
#ifndef MEP_LL_DISPATCH_BODY_CUH_
#define MEP_LL_DISPATCH_BODY_CUH_

#include "kernels/ll/ll_dispatch_copy.cuh"
#include "kernels/ll/ll_dispatch_lsa.cuh"
#include "kernels/ll/ll_units.h"

/* kArrive = false (the fused LSA kernel): the block's arrival is left to
 * the receive half, whose last warp sends it while the others read the
 * expert lists (mep_dispatch_recv_body<.., true>). */
template <class Tp, bool kFp8, typename IdxT, bool kArrive = true>
__device__ __forceinline__ void mep_dispatch_send_body(const MepLLParams &p,
                                                       const MepDispatchArgs &a) {
  static_assert(kArrive || !Tp::kStaged, "only LSA leaves its arrival to the receive half");
  const int lane = threadIdx.x & 31;
  const int nwarps = gridDim.x * (MEP_LL_THREADS / 32);
  const int gwarp = blockIdx.x * (MEP_LL_THREADS / 32) + threadIdx.x / 32;
  const int K = a.top_k, R = p.dims.world, T = a.tokens, M = p.dims.max_tokens;
  const uint64_t list_bytes = mep_ll_list_bytes(&p.dims);
  const uint64_t my_row = (uint64_t)p.xp.rank * M; /* this rank's rows at every destination */
  const uint64_t my_list = p.set_off + p.lay.disp_list + (uint64_t)p.xp.rank * list_bytes;
  /* This call's list tag: every block's copy holds the last one sent. */
  const uint32_t tag = mep_ll_next_tag(mep_tag(p, R));
  const uint64_t head =
      mep_ll_list_head(T, a.weighted, mep_row_desc(a.hidden, K, kFp8, a.scale_mode), tag);
  mep_stamp(p, MEP_LL_STAMP_ENTRY);

  if constexpr (!Tp::kStaged) {
    auto words_at = [&](int d) {
      return reinterpret_cast<uint64_t *>(
          static_cast<char *>(Tp::peer_ptr(p.xp, d, my_list)) + MEP_LL_LIST_HEAD_BYTES);
    };
    if (blockIdx.x == 0)
      for (int d = threadIdx.x; d < R; d += blockDim.x)
        mep_st_relaxed_sys(static_cast<uint64_t *>(Tp::peer_ptr(p.xp, d, my_list)), head);
    /* One index space over the warps, so no warp takes two units while
     * others idle: every expert's list first (the receivers' slot building
     * waits on them), then (token, destination, chunk) rows, then 32-word
     * pieces of the slot lists past the call's words: every word of a
     * list's capacity (max_tokens * the group's top_k, whatever this call's
     * top_k) gets this call's tag, with no expert there, so no word keeps a
     * tag old enough to come round again (mep_ll_list_word). */
    const int E = a.local_experts * R;
    const int nch = a.nch;
    const mep_fastdiv_t by_nch = mep_fastdiv_of(nch, a.mul_nch);
    const mep_fastdiv_t by_world = mep_fastdiv_of(R, a.mul_world);
    const int rows = T * R * nch;
    const int words = M * p.dims.top_k;
    const int fill_units = (words - T * K + 31) / 32;
    /* A small call's row units each on their own SM (ll_units.h): packed
     * 14 to one SM, they shared its four schedulers and a chunk's
     * quantisation took ~1 us after its loads (EP1, H200, 1 token). */
    const int first = mep_ll_send_first_unit(E, (int)blockIdx.x, (int)(threadIdx.x / 32),
                                             (int)gridDim.x, MEP_LL_THREADS / 32);
    for (int u = first; u < E + rows + R * fill_units; u += nwarps) {
      if (u < E) {
        mep_send_expert_list<Tp, IdxT>(p, a, u, tag);
        continue;
      }
      if (u >= E + rows) {
        const int f = u - E - rows, fr = mep_fastdiv(f, by_world);
        const int d = f - fr * R, i = T * K + fr * 32 + lane;
        if (i < words) mep_st_relaxed_sys(words_at(d) + i, mep_ll_list_word(-1, 0u, tag));
        continue;
      }
      const int td = mep_fastdiv(u - E, by_nch), ch = u - E - td * nch;
      const int t = mep_fastdiv(td, by_world), d = td - t * R;
      const int c0 = ch * a.chunk;
      const int n = a.hidden - c0 < a.chunk ? a.hidden - c0 : a.chunk;
      uint4 v[4];
      mep_chunk_load<kFp8>(a.x + (size_t)t * a.hidden + c0, n, v);
      const float w = ch == 0 ? mep_slot_weight(a, t, lane) : 0.f;
      int le;
      const int dst = mep_slot_dst<IdxT>(p, a, t, lane, &le);
      if (ch == 0 && lane < K)
        mep_st_relaxed_sys(words_at(d) + t * K + lane, mep_list_word(w, dst, le, d, tag));
      if (__ballot_sync(0xffffffffu, dst == d) == 0) continue;
      char *drow = static_cast<char *>(
          Tp::peer_ptr(p.xp, d, p.set_off + p.lay.disp_recv + (my_row + t) * a.row_bytes));
      mep_chunk_store<kFp8>(a, v, drow, c0, n);
    }
    mep_stamp(p, MEP_LL_STAMP_SENT);
    if constexpr (kArrive) {
      const uint64_t code = mep_ll_disp_code(T, 0, a.weighted, M);
      mep_arrive<Tp>(p, mep_ll_sig_disp_cnt(&p.dims, p.xp.rank), [&](int) { return code; });
      mep_stamp(p, MEP_LL_STAMP_SIGNALLED);
    }
  } else {
    const uint64_t stage_rows = p.set_off + p.lay.stage;
    const uint64_t stage_list = p.set_off + p.lay.stage_list;
    const uint32_t row_sig = mep_ll_sig_disp_row(&p.dims, p.xp.rank);
    auto staged_words = [&](int d) {
      return reinterpret_cast<uint64_t *>(p.xp.local + stage_list + d * list_bytes +
                                          MEP_LL_LIST_HEAD_BYTES);
    };
    if (blockIdx.x == 0)
      for (int d = threadIdx.x; d < R; d += blockDim.x)
        *reinterpret_cast<uint64_t *>(p.xp.local + stage_list + d * list_bytes) = head;
    for (int t = gwarp; t < T; t += nwarps) {
      const uint64_t srow = stage_rows + (uint64_t)t * a.row_bytes;
      mep_write_row<kFp8>(a, a.x + (size_t)t * a.hidden, p.xp.local + srow);
      const float w = mep_slot_weight(a, t, lane);
      int le;
      const int dst = mep_slot_dst<IdxT>(p, a, t, lane, &le);
      if (lane < K)
        for (int d = 0; d < R; ++d) staged_words(d)[t * K + lane] = mep_list_word(w, dst, le, d, tag);
      __syncwarp(); /* staging row complete before any lane's put reads it */
      for (int kk = 0; kk < K; ++kk) {
        const int d = __shfl_sync(0xffffffffu, dst, kk);
        /* once per destination: only at its first slot */
        if (d < 0 || __ballot_sync(0xffffffffu, lane < kk && dst == d) != 0) continue;
        Tp::put_warp(p.xp, d, p.set_off + p.lay.disp_recv + (my_row + t) * a.row_bytes,
                     p.xp.local + srow, srow, a.row_bytes, row_sig);
        if (lane == 0) atomicAdd(&p.puts[d], 1u);
      }
    }
    mep_stamp(p, MEP_LL_STAMP_SENT);
    /* The last block puts each destination's list (head and this call's
     * words: the receiver reads it only after the count) and its count. */
    if (mep_last_block(&p.tickets[MEP_LL_TICKET_DISPATCH_SEND])) {
      for (int d = threadIdx.x / 32; d < R; d += MEP_LL_THREADS / 32) {
        const uint32_t rows = mep_ld_volatile_u32(&p.puts[d]);
        const uint64_t src = stage_list + d * list_bytes;
        Tp::put_warp(p.xp, d, my_list, p.xp.local + src, src,
                     (uint32_t)mep_ll_align16(MEP_LL_LIST_HEAD_BYTES + (uint64_t)T * K * 8u),
                     row_sig);
        if (lane == 0) {
          p.puts[d] = 0;
          Tp::signal(p.xp, d, mep_ll_sig_disp_cnt(&p.dims, p.xp.rank),
                     mep_ll_disp_code(T, (int)rows + 1, a.weighted, M));
        }
      }
      mep_stamp(p, MEP_LL_STAMP_SIGNALLED);
    }
  }
  __syncthreads(); /* every thread has read the block's tag copy */
  mep_slots_store(p.tags, mep_ll_tag_words(R), 1, [&](int) { return R; }, [&](int) { return tag; });
  Tp::flush_warp(p.xp);
}

/* Staged transports (GIN, GIN-emulated): the counts and row puts first (a
 * list arrives in one put, so once its count is seen it is whole), then,
 * for each local expert and each source rank in order, a block-wide stable
 * compaction of that source's slot list gives the expert's slots (source
 * rank, then token, then k).
 * smem: MepRecvSmem (next: each source's count and row signal shadows
 * after this receive; cnt unused). */
template <class Tp, bool kFp8>
__device__ __forceinline__ void mep_dispatch_recv_staged(const MepLLParams &p,
                                                         const MepDispatchArgs &a, int *smem) {
  static_assert(Tp::kStaged && Tp::kRowSignals, "the scan receive is the staged transports'");
  __shared__ int warp_hits[kMepWarps];
  __shared__ int failed; /* read only after a block barrier */
  __shared__ int32_t slot_cache[kMepSlotCache]; /* this block's first expert */
  __shared__ int filled_cache[kMepFilledCache];
  const int R = p.dims.world, M = p.dims.max_tokens, K = a.top_k;
  const MepRecvSmem sm = mep_recv_smem(smem, R);
  uint64_t *next = sm.next;
  int *tokens = sm.tokens, *puts = sm.puts, *weighted = sm.weighted, *tag = sm.tag;
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const int cap = R * M; /* slots per local expert */
  auto head_of = [&](int r) { return mep_list_head(p, r); };
  auto words_of = [&](int r) { return mep_list_words(p, r); };

  if (threadIdx.x == 0) failed = 0;
  __syncthreads();
  mep_dispatch_wait_counts<Tp>(p, next, tokens, puts, weighted, &failed);
  __syncthreads();
  if (failed) return;
  mep_stamp(p, MEP_LL_STAMP_SEEN);
  /* The list head must agree with the count's code. */
  for (int r = threadIdx.x; r < R; r += blockDim.x) {
    const uint32_t t = mep_ll_next_tag(mep_tag(p, r));
    tag[r] = (int)t;
    const uint64_t h = mep_list_fresh(p, head_of(r), mep_ld_relaxed_sys(head_of(r)), t, r, &failed);
    if (mep_ll_head_tokens(h) != tokens[r] || mep_ll_head_weighted(h) != weighted[r]) {
      mep_record_timeout(p.wc, MEP_LL_OP_BAD_SIGNAL, r, -1, t, h);
      failed = 1;
    } else if (!mep_head_desc_agrees<kFp8>(p, a, h, r, &failed)) {
      failed = 1;
    }
  }
  __syncthreads();
  if (failed) return;
  mep_stamp(p, MEP_LL_STAMP_HEADS);
  if (blockIdx.x == 0)
    for (int r = threadIdx.x; r < R; r += blockDim.x)
      a.src_tokens[r] = tokens[r] | (weighted[r] ? MEP_LL_SRC_WEIGHTED : 0);

  /* Scan steps: MEP_LL_THREADS * kMepScanPer words of one source, thread j
   * holding words j * kMepScanPer ..; the next step's words (this source's
   * next, or the next source's first) load during the current one. */
  constexpr int kStep = MEP_LL_THREADS * kMepScanPer;
  auto load_step = [&](int r, int i0, uint64_t *ent) {
#pragma unroll
    for (int e = 0; e < kMepScanPer; ++e) {
      const int i = i0 + threadIdx.x * kMepScanPer + e;
      ent[e] = r < R && i < tokens[r] * K ? mep_ld_relaxed_sys(words_of(r) + i) : 0u;
    }
  };
  auto next_source = [&](int r) {
    do ++r; while (r < R && tokens[r] == 0);
    return r;
  };
  for (int le = blockIdx.x, nth = 0; le < a.local_experts; le += gridDim.x, ++nth) {
    int32_t *slots = a.slot_src + (size_t)le * cap;
    int filled = 0; /* block-uniform */
    uint64_t ent[kMepScanPer];
    load_step(next_source(-1), 0, ent);
    for (int r = 0; r < R; ++r) {
      const int n = tokens[r] * K;
      int hits = 0; /* block-uniform: this expert's entries of source r so far */
      for (int i0 = 0; i0 < n; i0 += kStep) {
        const bool more = i0 + kStep < n;
        uint64_t nxt[kMepScanPer];
        load_step(more ? r : next_source(r), more ? i0 + kStep : 0, nxt);
        const int ib = i0 + threadIdx.x * kMepScanPer;
        bool hit[kMepScanPer];
        int mine = 0;
        unsigned below = 0; /* this warp's hits before this thread's words */
        const unsigned lower = (1u << lane) - 1u;
#pragma unroll
        for (int e = 0; e < kMepScanPer; ++e) {
          const int i = ib + e;
          if (i < n) ent[e] = mep_list_fresh(p, words_of(r) + i, ent[e], (uint32_t)tag[r], r, &failed);
          const int ex = i < n ? mep_ll_list_expert(ent[e]) : -1;
          hit[e] = i < n && ex == le;
          /* Block 0's first expert visits every word: it also marks the
           * routes of slots whose expert is on another rank. */
          if (le == 0 && i < n && (ex < 0 || ex >= a.local_experts))
            a.route[(size_t)r * M * K + i] = {MEP_LL_ROUTE_ELSEWHERE, 0};
          const unsigned ball = __ballot_sync(0xffffffffu, hit[e]);
          below += __popc(ball & lower);
          mine += __popc(ball);
        }
        if (lane == 0) warp_hits[warp] = mine;
        __syncthreads();
        int before = 0, all = 0;
#pragma unroll
        for (int w = 0; w < kMepWarps; ++w) {
          const int v = warp_hits[w];
          before += w < warp ? v : 0;
          all += v;
        }
        int pos = hits + before + (int)below;
#pragma unroll
        for (int e = 0; e < kMepScanPer; ++e) {
          if (!hit[e]) continue;
          const int i = ib + e;
          /* more than max_tokens hits from one source only happens with an
           * expert repeated within a token: the excess is dropped */
          if (pos < M) {
            const int32_t v = MEP_LL_SLOT_PACK(r, i / K, i % K);
            slots[filled + pos] = v;
            if (le == (int)blockIdx.x && filled + pos < kMepSlotCache) slot_cache[filled + pos] = v;
          }
          a.route[(size_t)r * M * K + i] = {pos < M ? le * cap + filled + pos
                                                    : MEP_LL_ROUTE_DROPPED,
                                            (int32_t)mep_ll_list_weight_bits(ent[e])};
          ++pos;
        }
        hits += all;
        __syncthreads(); /* warp_hits is reused */
#pragma unroll
        for (int e = 0; e < kMepScanPer; ++e) ent[e] = nxt[e];
      }
      if (hits > M) { /* an expert repeated within r's tokens: the excess was dropped */
        if (threadIdx.x == 0) mep_record_repeated_expert(p, r, le, hits);
        hits = M;
      }
      if (threadIdx.x == 0) a.src_count[le * R + r] = hits;
      filled += hits;
    }
    if (threadIdx.x == 0) {
      a.recv_count[le] = filled;
      if (nth < kMepFilledCache) filled_cache[nth] = filled;
    }
  }
  mep_stamp(p, MEP_LL_STAMP_SCANNED);
  __syncthreads(); /* failed; this block's slot sources and counts are written */
  if (failed) return;
  mep_dispatch_recv_finish<Tp, kFp8, false>(p, a, next, tag, slot_cache, filled_cache);
}

/* The receive half: LSA reads the senders' expert lists
 * (ll_dispatch_lsa.cuh), staged transports scan the slot lists.
 * kArriveAside (the fused LSA kernel, whose send half leaves its arrival to
 * this half): the heads warp sends the block's arrival first. */
template <class Tp, bool kFp8, bool kArriveAside = false, bool kBatched = false,
          bool kShare = false>
__device__ __forceinline__ void mep_dispatch_recv_body(const MepLLParams &p,
                                                       const MepDispatchArgs &a, int *smem) {
  static_assert(!kBatched || !Tp::kStaged, "the list batches are the LSA receive's");
  static_assert(!kShare || (!Tp::kStaged && !kBatched),
                "the shared row copy is the LSA receive's, without list batches");
  if constexpr (Tp::kStaged)
    mep_dispatch_recv_staged<Tp, kFp8>(p, a, smem);
  else
    mep_dispatch_recv_lsa<Tp, kFp8, kArriveAside, kBatched, kShare>(p, a, smem);
}

/* The pointer rules of each half (after mep_ll_dispatch_check). */
static inline mep_kstatus_t mep_dispatch_check_send_ptrs(const char *op,
                                                           const mep_ll_dispatch_args_t *a) {
  /* A rank with no tokens is normal, and an empty tensor may carry NULL
   * data (torch's data_ptr() of an empty tensor is 0): nothing reads them. */
  if (a->num_tokens > 0 && (a->x == nullptr || a->topk_idx == nullptr))
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT, "%s: x or topk_idx is NULL with %d tokens",
                             op, a->num_tokens);
  if (a->weighted != 0 && a->weighted != 1)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT, "%s: weighted is %d; it must be 0 or 1",
                             op, a->weighted);
  if (a->weighted && a->num_tokens > 0 && a->topk_weights == nullptr)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "%s: weighted is 1 but topk_weights is NULL with %d tokens", op,
                             a->num_tokens);
  return MEP_KSTATUS_OK;
}
static inline mep_kstatus_t mep_dispatch_check_recv_ptrs(const char *op,
                                                           const mep_ll_dispatch_args_t *a) {
  if (a->recv_x == nullptr || a->recv_count == nullptr || a->slot_src == nullptr ||
      a->src_count == nullptr || a->route == nullptr || a->src_tokens == nullptr ||
      (a->fp8 && a->recv_scales == nullptr))
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "%s: recv_x, recv_count, slot_src, src_count, route, src_tokens "
                             "(and recv_scales for fp8) must not be NULL", op);
  return MEP_KSTATUS_OK;
}

/* Whether a receive on `grid` blocks reads its lists in batches (the
 * kernels' kBatched): an LSA receive (the staged ones scan slot lists),
 * some block holds several local experts, and a batch holds at least one
 * expert's sources (mep_elist_batch_experts). Only
 * those launches run the kernels with the batch code: with it compiled in,
 * a grid of one expert per block read 0.8-1.1 us slower in the hook
 * receive at 128 tokens although it never ran (EP1, one H200). */
static inline bool mep_dispatch_recv_batched(const mep_ll_ctx_t *ctx, int grid, int local_experts) {
  return ctx->transport == MEP_LL_TRANSPORT_LSA && local_experts > grid &&
         ctx->dims.world <= kMepBatchUnits;
}

/* Whether a receive's kernel holds the shared row copy (the kernels'
 * kShare; ll_dispatch_copy.cuh): an LSA receive that does not batch its
 * lists, in a call whose rows per expert, counting this rank's tokens for
 * every source, reach kMepHelpMinMean. This choice alone turns sharing
 * on: the kernel publishes whatever expert has more rows than its block
 * copies itself, however many tokens the sources really sent. */
static inline bool mep_dispatch_recv_shares(const mep_ll_ctx_t *ctx,
                                            const mep_ll_dispatch_args_t *a, bool batched) {
  return ctx->transport == MEP_LL_TRANSPORT_LSA && !batched &&
         (int64_t)a->num_tokens * a->top_k * ctx->dims.world >=
             (int64_t)kMepHelpMinMean * a->num_experts;
}

/* Dynamic shared memory of the receive half (MepRecvSmem), and the list
 * batch when batched. */
static inline size_t mep_dispatch_recv_smem(const mep_ll_ctx_t *ctx, bool batched) {
  const size_t base = mep_recv_smem_base(ctx->dims.world);
  return batched ? base + sizeof(MepElistBatch) : base;
}

#endif /* MEP_LL_DISPATCH_BODY_CUH_ */