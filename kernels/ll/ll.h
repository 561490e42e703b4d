/* ll.h: host launchers of the low-latency (LL) dispatch/combine kernels.
 * Plain C: the runtime includes this, never the CUDA C++ behind it. Each
 * operation is a send half and a receive half (separate kernels, nothing
 * resident in between) so the receive can be deferred (hooks). */
#ifndef MEP_LL_H_
#define MEP_LL_H_

#include <stddef.h>
#include <stdint.h>

#include "kernels/common/error_record.h"
#include "kernels/common/kernels_types.h"
#include "kernels/common/limits.h"
#include "kernels/ll/ll_layout.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Which wait expired (mep_ll_error_record_t.op; 0 in a zeroed record).
 * 1 and 3 stay unused: send halves wait only for pushed weights (8). */
enum {
  /* Receive halves waiting for a peer's count or rows. */
  MEP_LL_OP_DISPATCH_RECV = 2,
  MEP_LL_OP_COMBINE_RECV = 4,
  /* Not a wait: a dispatch met a topk_idx value outside -1..num_experts-1
   * and dropped that slot (expert = the value, expected = token, seen = k).
   * Written into the notice record; nothing is aborted. */
  MEP_LL_OP_BAD_ROUTING = 5,
  /* A receive read a count signal value no sender produces (a late
   * signal piled onto a later one after a timeout, or corruption; expected
   * = the value after the last receive, seen = the value), a slot-list
   * head that disagrees with the count (expected = the tag, seen = the
   * head), or an LSA expert list that disagrees with the head (expert =
   * the local expert; a count word: expected = the head's tokens; an
   * entry: expected = tokens * top_k; seen = the word); fatal. */
  MEP_LL_OP_BAD_SIGNAL = 6,
  /* A dispatch receive waiting for a peer's slot list (head or word) to
   * carry this call's tag: expected = the tag, seen = the tag found. */
  MEP_LL_OP_DISPATCH_LIST = 7,
  /* A combine send half waiting for a source's pushed weight word
   * (mep_ll_weight_word) to carry this combine's epoch: expected = the
   * epoch, seen = the epoch found. */
  MEP_LL_OP_COMBINE_WEIGHTS = 8,
  /* A combine receive waiting for a rank's flagged partial words
   * (mep_ll_flag_word, calls of at most mep_ll_flag_tokens tokens over
   * LSA) or line partials (mep_ll_line_row_bytes, larger calls) to carry
   * this combine's epoch: expected = the epoch, seen = the epoch found (a
   * line's flag word: the epoch in both halves). */
  MEP_LL_OP_COMBINE_FLAGGED = 9,
  /* Not a wait: a dispatch receive found source `peer` listing more than
   * max_tokens slots for local expert `expert`, which only an expert
   * repeated within a token makes; the slots past the first max_tokens in
   * (token, k) order were dropped (MEP_LL_ROUTE_DROPPED). expected =
   * max_tokens, seen = the slots listed. Written into the notice record. */
  MEP_LL_OP_REPEATED_EXPERT = 10,
  /* A dispatch, before its send, waiting for rank `peer` to have started
   * the combine of the buffer set's previous dispatch, which shows that
   * the peer received that dispatch (mep_ll_await_combine): expected /
   * seen are that combine's count signal values. */
  MEP_LL_OP_DISPATCH_REUSE = 11,
  /* A combine found that rank `peer`'s combine answers another dispatch
   * than this rank's (the ranks combined two pending dispatches in
   * different orders): expected = this rank's dispatch code, seen = the
   * peer's, each (the dispatch's list tag on its set << 1) | that set
   * (mep_ll_disp_ident); nothing of that peer's combine was summed. Found
   * by the receive's count check, or by the send half while it waits for
   * that peer's pushed weights. Fatal. */
  MEP_LL_OP_COMBINE_OTHER_DISPATCH = 12,
  /* A dispatch receive found that rank `peer` made the call with another
   * hidden, top_k or row format (its slot-list head's row description):
   * expected = this rank's description, seen = the peer's
   * (kernels/common/row_desc.h); none of its rows was copied (an LSA
   * receive may still have walked its lists, bounded by the head's checks).
   * Fatal. */
  MEP_LL_OP_ROW_DESC = 13
};

/* The LL kernels' records (kernels/common/error_record.h), op MEP_LL_OP_*. */
typedef mep_error_record_t mep_ll_error_record_t;

typedef enum mep_ll_transport {
  MEP_LL_TRANSPORT_LSA = 1,          /* moe_ep_transport_t's numbers */
  MEP_LL_TRANSPORT_GIN = 2,
  MEP_LL_TRANSPORT_GIN_EMULATED = 3
} mep_ll_transport_t;

/* Everything the kernels need about the group; built once by the runtime,
 * borrowed by every launch. */
typedef struct mep_ll_ctx {
  const void *dev_comm;  /* struct ncclDevComm, host copy (borrowed) */
  void *window;          /* ncclWindow_t of the symmetric buffer */
  void *window_local;    /* this rank's local pointer to that buffer */
  uint64_t window_bytes; /* >= mep_ll_buffer_bytes(dims) */
  mep_ll_dims_t dims;    /* capacities the buffer was sized for */
  int32_t rank;
  int32_t transport;     /* mep_ll_transport_t */
  int32_t num_sms;       /* blocks per launch (set_num_sms) */
  int32_t reserved0;
  uint64_t timeout_cycles;            /* device clocks; see mep_ll_timeout_cycles */
  void *state;                        /* device, mep_ll_state_bytes(dims), zeroed */
  mep_ll_error_record_t *error_dev;   /* device alias of the host-mapped record */
  mep_ll_error_record_t *notice_dev;  /* optional (NULL: not recorded): routing notices */
  /* LSA (and GIN-emulated) addressing, from mep_ll_resolve_lsa: the
   * window's address at LSA rank i is lsa_base + i * lsa_stride, so the
   * kernels compute peer pointers without loading the window descriptor. */
  uint64_t lsa_base;
  uint64_t lsa_stride;
  /* This rank's window through the same LSA mapping (0: not resolved). The
   * kernels read their own window here, never through window_local: the
   * fused kernels write their own rows and signals through the LSA
   * address, and two virtual aliases of one allocation are not ordered
   * within a kernel without a proxy fence. */
  uint64_t lsa_local;
  /* Diagnostics only (NULL in production): device buffer of
   * MEP_LL_STAMP_POINTS u64 per block where the dispatch kernels write
   * %globaltimer at each phase boundary (see MEP_LL_STAMP_*), so a test can
   * see where a launch's time goes without a profiler's replay. Only the
   * stamped build of these kernels (//kernels/ll:ll_stamped) writes them;
   * the others refuse a context that sets it. */
  uint64_t *stamps;
} mep_ll_ctx_t;

/* Phase boundaries stamped into mep_ll_ctx_t.stamps[block * POINTS + i]
 * (0 where a block does not reach one). */
enum {
  MEP_LL_STAMP_ENTRY = 0,     /* first instruction */
  MEP_LL_STAMP_SENT = 1,      /* thread 0's own send units done */
  MEP_LL_STAMP_SIGNALLED = 2, /* count signals issued (LSA: the block's
                                 arrival; staged: the last block); not
                                 stamped where the fused LSA kernel's last
                                 warp sends it */
  MEP_LL_STAMP_HEADS = 3,     /* receive: every source's list head read */
  MEP_LL_STAMP_SCANNED = 4,   /* receive: the block's experts' slots built */
  MEP_LL_STAMP_SEEN = 5,      /* receive: every source's count seen */
  MEP_LL_STAMP_COPIED = 6,    /* receive: every row copied */
  MEP_LL_STAMP_DONE = 7,      /* receive: shadows and tags stored */
  MEP_LL_STAMP_WORD_WAITS = 8, /* not a time: list words (slot or expert
                                  lists) the block found without this
                                  call's tag and waited for */
  MEP_LL_STAMP_FIRST_WORDS = 9,  /* receive: LSA, the block's first
                                    expert's list counts read; staged, the
                                    first scan step's words loaded */
  MEP_LL_STAMP_FIRST_STEP = 10,  /* receive: LSA, that expert's slots
                                    written; staged, the first scan step
                                    done */
  MEP_LL_STAMP_COUNTS = 11,      /* receive (LSA): every source's count
                                    signal seen by the warp that waits
                                    for them beside the list reads */
  MEP_LL_STAMP_MARKED = 12,      /* receive (LSA): the block's share of
                                    the slot lists' routes marked */
  MEP_LL_STAMP_JOINED = 13,      /* receive (LSA): past the barrier that
                                    joins the list warps and the count
                                    warp, before the counts' codes are
                                    checked */
  MEP_LL_STAMP_POINTS = 14
};

/* Where the expert side finds one received (source rank, token, k) slot at
 * combine time: the slot's index in recv_x / y (le * R * max_tokens + row),
 * MEP_LL_ROUTE_ELSEWHERE when slot k names an expert on another rank,
 * MEP_LL_ROUTE_DROPPED when it names a local expert whose slots from that
 * source overflowed (a repeated expert; it contributes nothing). Written by
 * the dispatch receive, indexed [source rank][token * top_k + k]. */
typedef struct mep_ll_route {
  int32_t slot;
  int32_t weight_bits; /* f32 bits of the source's topk_weights[token][k] */
} mep_ll_route_t;
#define MEP_LL_ROUTE_ELSEWHERE (-1)
#define MEP_LL_ROUTE_DROPPED (-2)
/* src_tokens[r] = tokens rank r sent | MEP_LL_SRC_WEIGHTED when its slot
 * lists carried weights: combine then returns that source one pre-reduced
 * partial per token instead of one row per slot. Per source, so ranks that
 * differ in whether they pass weights to dispatch still combine correctly. */
#define MEP_LL_SRC_WEIGHTED (1 << 16)
#define MEP_LL_SRC_TOKENS(v) ((v) & (MEP_LL_SRC_WEIGHTED - 1))

typedef struct mep_ll_dispatch_args {
  const void *x;          /* [T, H] bf16 */
  const void *topk_idx;   /* [T, K] int32 or int64, -1 = no expert */
  int32_t topk_idx_bytes; /* 4 or 8 */
  int32_t num_tokens;     /* T, 0..max_tokens */
  int32_t hidden;         /* H, <= dims.hidden */
  int32_t top_k;          /* K, 1..min(dims.top_k, MEP_MAX_TOP_K) */
  int32_t num_experts;    /* global; E_local = num_experts / world */
  int32_t fp8;            /* 0: bf16 rows; 1: fp8 e4m3 + scales */
  int32_t scale_mode;     /* MEP_FP8_SCALE_* (fp8 only) */
  int32_t buffer_set;     /* 0 or 1 */
  /* outputs (receive half) */
  void *recv_x;           /* [E_local, R*max_tokens, H] bf16 or fp8 */
  void *recv_scales;      /* f32 [.., H/128] or int32 [.., ceil(H/512)] */
  int32_t *recv_count;    /* [E_local] */
  /* handle (written by the receive half, read by combine) */
  int32_t *slot_src;      /* [E_local, R*max_tokens] packed (rank, token, k) */
  int32_t *src_count;     /* [E_local, R] rows from each source rank */
  /* handle, for combine (receive half): per received slot, where combine
   * finds it; per source, its tokens and whether it sent weights */
  mep_ll_route_t *route;     /* [R, max_tokens * top_k] */
  int32_t *src_tokens;       /* [R], see MEP_LL_SRC_WEIGHTED */
  /* send half: weighted = 1 sends topk_weights ([T, K] f32; may be NULL
   * only when T = 0) with the slot lists, so the experts' ranks pre-reduce
   * this rank's tokens at combine (see mep_ll_combine_args_t.partials). */
  int32_t weighted;
  int32_t reserved1;
  const float *topk_weights;
} mep_ll_dispatch_args_t;

/* Combine args describe the same layer call as the dispatch whose handle
 * arrays they pass: num_tokens, hidden, top_k and num_experts must be the
 * dispatch's (the route and slot arrays are indexed with them; the runtime
 * takes them from the handle). */
typedef struct mep_ll_combine_args {
  const void *y;             /* [E_local, R*max_tokens, H] bf16 */
  const void *topk_idx;      /* [T, K] as in dispatch */
  int32_t topk_idx_bytes;
  /* [T, K]; over LSA (partials = 0) the send half pushes them to the
   * experts' ranks, so both halves need them */
  const float *topk_weights;
  void *out;                 /* [T, H] bf16 */
  int32_t num_tokens;
  int32_t hidden;
  int32_t top_k;
  int32_t num_experts;
  int32_t buffer_set;
  /* The buffer set of the dispatch this combine answers (the runtime: the
   * handle's). With that dispatch's list tag, which the set's state holds
   * until the set's next dispatch, it names the dispatch alike on every
   * rank, graph replays included; every rank's combine tells each source
   * which dispatch it answers, and a source that finds another than its
   * own records MEP_LL_OP_COMBINE_OTHER_DISPATCH before it sums that
   * rank's rows. */
  int32_t dispatch_set;
  const int32_t *recv_count; /* handle, from dispatch */
  const int32_t *slot_src;
  const int32_t *src_count;
  const mep_ll_route_t *route;  /* handle, from dispatch (send half) */
  const int32_t *src_tokens;
  /* 1 when this rank's dispatch was weighted: the experts' ranks return
   * one partial per (token, rank) (w * y summed in f32 in k order, bf16),
   * and the receive half adds them in f32 in the order the token's ranks
   * first appear in its top-k list; topk_weights is then not read. With 0
   * the sum is the same: over LSA the send half first pushes this rank's
   * weights to the experts' ranks (mep_ll_weight_word), which pre-reduce
   * as above; over staged transports every slot's row comes back and the
   * receive half forms the same partials. */
  int32_t partials;
  int32_t reserved1;
} mep_ll_combine_args_t;

/* slot_src packing: 11 bits token (< 2048), 5 bits k, 16 bits rank. */
#define MEP_LL_SLOT_PACK(rank, token, k) \
  ((int32_t)(((uint32_t)(rank) << 16) | ((uint32_t)(k) << 11) | (uint32_t)(token)))
#define MEP_LL_SLOT_RANK(v) ((int32_t)((uint32_t)(v) >> 16))
#define MEP_LL_SLOT_K(v) ((int32_t)(((uint32_t)(v) >> 11) & 31u))
#define MEP_LL_SLOT_TOKEN(v) ((int32_t)((uint32_t)(v) & 2047u))

/* Exact symmetric-buffer bytes for dims (its num_sets buffer sets, with or
 * without staging: lsa_only). */
uint64_t mep_ll_buffer_bytes(const mep_ll_dims_t *dims);
/* Device state bytes (ordinary device memory, zero before first use). */
uint64_t mep_ll_state_bytes(const mep_ll_dims_t *dims);
/* kernel_ms -> device clocks at the device's peak SM clock. */
mep_kstatus_t mep_ll_timeout_cycles(int cuda_device, int32_t kernel_ms,
                                      uint64_t *cycles);
/* The LSA addressing both modes' kernels use (LSA peer p's window at
 * base + p * stride; this rank's at local) from the window's device-side
 * descriptor: its first mep_ll_window_desc_bytes() bytes, at the window
 * handle in device memory, copied to the host by the caller (no kernel: a
 * module's first load waits for all work on the device).
 * mep_ll_resolve_lsa fills ctx->lsa_base / lsa_stride / lsa_local from
 * ctx->window, copying synchronously on the legacy default stream (tests). */
size_t mep_ll_window_desc_bytes(void);
mep_kstatus_t mep_ll_lsa_from_desc(const void *desc, uint64_t *base, uint64_t *stride,
                                   uint64_t *local);
mep_kstatus_t mep_ll_resolve_lsa(mep_ll_ctx_t *ctx);
/* Clears what a timed-out wait leaves behind in this rank's device state:
 * the abort flag, the block tickets and the put counters (state must be
 * idle). For tests that go on after a timeout they caused on purpose: the
 * window itself (signals, slot and expert lists a receive gave up on) is
 * not repaired, so after a real timeout the group is destroyed (the
 * runtime reports TIMEOUT on every later call). */
mep_kstatus_t mep_ll_clear_abort(const mep_ll_ctx_t *ctx, void *stream);
/* Raises the abort flag in this rank's device state (queued on stream, a
 * copy engine's work): every wait of a kernel in flight gives up at its
 * next check instead of running to timeout_cycles. For the teardown of a
 * failed group; the state is then good for nothing but freeing. */
mep_kstatus_t mep_ll_raise_abort(const mep_ll_ctx_t *ctx, void *stream);

/* Every rule the launchers of a call's halves check (shape, context and the
 * pointers of both the send and the receive), without touching the GPU;
 * `op` names the call in the sentence. The runtime asks before it queues
 * anything for the call (stream waits, mep_ll_await_combine): a refusal
 * then leaves no work queued, and a deferred receive is never refused
 * after its send half went out. */
mep_kstatus_t mep_ll_dispatch_validate(const char *op, const mep_ll_ctx_t *ctx,
                                       const mep_ll_dispatch_args_t *args);
mep_kstatus_t mep_ll_combine_validate(const char *op, const mep_ll_ctx_t *ctx,
                                      const mep_ll_combine_args_t *args);

/* Launchers: validate, launch on `stream` (cudaStream_t), return at once.
 * INVALID_ARGUMENT without touching the GPU when an argument breaks a rule;
 * mep_kernels_last_error() then says which. */
mep_kstatus_t mep_ll_dispatch_send(const mep_ll_ctx_t *ctx,
                                     const mep_ll_dispatch_args_t *args, void *stream);
mep_kstatus_t mep_ll_dispatch_recv(const mep_ll_ctx_t *ctx,
                                     const mep_ll_dispatch_args_t *args, void *stream);
mep_kstatus_t mep_ll_combine_send(const mep_ll_ctx_t *ctx,
                                    const mep_ll_combine_args_t *args, void *stream);
mep_kstatus_t mep_ll_combine_recv(const mep_ll_ctx_t *ctx,
                                    const mep_ll_combine_args_t *args, void *stream);
/* Waits, in one small kernel on `stream`, for every rank's count signal of
 * the last combine on buffer set `set` (this rank's send of it must come
 * first on `stream`; its receive must not have run): so every peer has
 * received the dispatch that combine combined. Ordered before a dispatch
 * whose send reuses that dispatch's set while that combine's receive is
 * still to run (PROTOCOL.md, section 6). Moves no shadow. */
mep_kstatus_t mep_ll_await_combine(const mep_ll_ctx_t *ctx, int set, void *stream);
/* Both halves in one launch (no deferred receive): one kernel instead of
 * two. Same arguments and results as send followed by recv. */
mep_kstatus_t mep_ll_dispatch(const mep_ll_ctx_t *ctx, const mep_ll_dispatch_args_t *args,
                                void *stream);
mep_kstatus_t mep_ll_combine(const mep_ll_ctx_t *ctx, const mep_ll_combine_args_t *args,
                               void *stream);
/* Loads every kernel mep_ll_combine, mep_ll_combine_send and
 * mep_ll_combine_recv may pick, for every transport and both index widths,
 * on the current device. CUDA loads a kernel at its first launch by
 * default, and that load waits for the device's running work; the
 * launchers pick their kernel by the call's token count, so ranks of one
 * call may launch different kernels, and a rank's first launch of one
 * kernel can come in the middle of a run. Ranks that share a device (one
 * process driving several ranks on one GPU, as the world tests do) call
 * this before any rank launches: otherwise a rank's first launch of one
 * kernel waits for another rank's kernel that spins until this rank
 * sends. */
mep_kstatus_t mep_ll_combine_load(void);

/* The same for the dispatch: every kernel mep_ll_dispatch,
 * mep_ll_dispatch_send and mep_ll_dispatch_recv may pick, for every
 * transport, both row dtypes and both index widths. They pick by this
 * rank's token count (the receive's rows shared between blocks) and the
 * grid (several experts per block), so ranks of one call with different
 * token counts launch different kernels. */
mep_kstatus_t mep_ll_dispatch_load(void);

/* Both of the above, mep_ll_export_layout's and mep_ll_await_combine's
 * kernels: every LL kernel of the library. The runtime calls it (bounded, on a thread of its own) when
 * it creates a group on a communicator of its own, whose creation waits
 * for the whole device anyway (nccl_backend.c). */
mep_kstatus_t mep_ll_load(void);

/* The layout a dispatch receive left in its handle (slot_src [e_local,
 * world * max_tokens] and src_count [e_local, world], max_tokens the
 * context's capacity) in DeepEP's low-latency form, for engines that read
 * DeepEP's handle:
 *   src_info [e_local, world * max_tokens] int32: slot s's source token
 *     (MEP_LL_SLOT_TOKEN), -1 for slots past the expert's received count;
 *   layout_range [e_local, world] int64: begin << 32 | count of source r's
 *     slots, begin = the counts of sources 0..r-1 summed (slots are in
 *     source rank order).
 * Either output may be NULL (not written); with both NULL nothing is
 * launched. One kernel on `stream`, no host sync: capturable. Outputs are
 * the caller's (device memory); slot_src may be NULL when src_info is. */
mep_kstatus_t mep_ll_export_layout(const int32_t *slot_src, const int32_t *src_count,
                                     int32_t e_local, int32_t world, int32_t max_tokens,
                                     int32_t *src_info, int64_t *layout_range, void *stream);

/* Sentence about the last launcher failure on this thread (never NULL). */
const char *mep_kernels_last_error(void);

#ifdef __cplusplus
}
#define MEP_LL_STATIC_ASSERT(cond, why) static_assert(cond, why)
#else
#define MEP_LL_STATIC_ASSERT(cond, why) _Static_assert(cond, why)
#endif

/* Every bit field the wire and handle encodings pack, against the limit of
 * what it must hold (kernels/common/limits.h): raising a limit past a field's
 * width fails here, not as a silently aliased token, rank or count. */
/* slot_src: rank 16 bits, k 5 bits, token 11 bits, round trip at the maxima. */
MEP_LL_STATIC_ASSERT(MEP_LL_SLOT_RANK(MEP_LL_SLOT_PACK(MEP_MAX_RANKS - 1, MEP_MAX_TOKENS_LL - 1,
                                                       MEP_MAX_TOP_K - 1)) == MEP_MAX_RANKS - 1 &&
                         MEP_LL_SLOT_K(MEP_LL_SLOT_PACK(MEP_MAX_RANKS - 1, MEP_MAX_TOKENS_LL - 1,
                                                        MEP_MAX_TOP_K - 1)) == MEP_MAX_TOP_K - 1 &&
                         MEP_LL_SLOT_TOKEN(MEP_LL_SLOT_PACK(MEP_MAX_RANKS - 1,
                                                            MEP_MAX_TOKENS_LL - 1,
                                                            MEP_MAX_TOP_K - 1)) ==
                             MEP_MAX_TOKENS_LL - 1,
                     "slot_src's rank, k or token field is narrower than its limit");
/* src_tokens: the token count stays below the weighted flag bit. */
MEP_LL_STATIC_ASSERT(MEP_MAX_TOKENS_LL < MEP_LL_SRC_WEIGHTED,
                     "src_tokens' count reaches MEP_LL_SRC_WEIGHTED");
/* Slot-list word: local expert + 1 in 16 bits (0 = none there). */
MEP_LL_STATIC_ASSERT(MEP_MAX_LOCAL_EXPERTS + 1 <= 0xffff,
                     "the slot-list word's local expert field is 16 bits");
MEP_LL_STATIC_ASSERT(MEP_LL_NUM_TICKETS * 4 <= MEP_LL_TICKET_BYTES,
                     "a set's block tickets fit before its help words");
/* Expert-list count: the source's tokens in 16 bits; entry: token in 11
 * bits, k in 5. */
MEP_LL_STATIC_ASSERT(MEP_MAX_TOKENS_LL <= 0xffff && MEP_MAX_TOKENS_LL <= 2048 &&
                         MEP_MAX_TOP_K <= 32,
                     "an expert-list field is narrower than its limit");
/* Arrival signals: grid size in 16 bits (bits 32..47) and arrivals in 16
 * (bits 48..63); a launch has at most MEP_LL_SHADOW_SLOTS blocks. */
MEP_LL_STATIC_ASSERT(MEP_LL_SHADOW_SLOTS <= 0xffff,
                     "a grid of MEP_LL_SHADOW_SLOTS blocks overflows the arrival fields");
/* ...and the code below them in 32 bits: the largest dispatch code
 * (mep_ll_disp_code with tokens = max, puts = max + 1, weighted; LSA
 * combine's code is 1). */
MEP_LL_STATIC_ASSERT(1ull + MEP_MAX_TOKENS_LL +
                             (MEP_MAX_TOKENS_LL + 1ull) *
                                 ((MEP_MAX_TOKENS_LL + 1ull) + (MEP_MAX_TOKENS_LL + 2ull)) <
                         (1ull << 32),
                     "a dispatch count signal's code overflows its 32 bits");

#endif /* MEP_LL_H_ */
