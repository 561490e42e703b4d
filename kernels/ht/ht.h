/* ht.h: host launchers of the high-throughput (HT, prefill) dispatch and
 * combine kernels, their context and the window/state sizing. Plain C: the
 * runtime includes this, never the CUDA C++ behind it. Protocol:
 * kernels/ht/PROTOCOL.md. */
#ifndef MEP_HT_H_
#define MEP_HT_H_

#include <stddef.h>
#include <stdint.h>

#include "kernels/common/kernels_types.h"
#include "kernels/common/limits.h"
#include "kernels/common/error_record.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Ranks an HT group may have: a block's 16 warps give every peer a warp
 * group of its own on both ends of its ring, so no ring ever waits for
 * progress on another (the relays carry a node's rows across nodes, but
 * every rank still has a ring to every other: larger groups need rings
 * shared between peers). */
#define MEP_HT_MAX_RANKS 16
/* Channels (sender/receiver block pairs) the window has rings for: 16
 * pairs are 32 SMs, more than an engine gives communication in prefill
 * (20-24); a larger SM budget still launches 16 pairs. */
#define MEP_HT_MAX_CHANNELS 16
/* Rows per ring, per (source, destination, channel): four 32-token
 * chunks in flight. Measured on 2 x H200 at 4096 tokens x 7168 bf16, 24
 * SMs: 64 rows made combine 400 us, 128 rows 345 us, 256 rows no faster;
 * dispatch was 327 us with all three. */
#define MEP_HT_RING_ROWS 128
/* Tokens per chunk: one warp ballot. */
#define MEP_HT_CHUNK 32
/* Threads per HT block (16 warps). */
#define MEP_HT_THREADS 512

/* Which wait expired or which rule broke (mep_error_record_t.op); HT
 * groups have records of their own, so the numbers only avoid the LL ones
 * for readers of both. */
enum {
  MEP_HT_OP_DISPATCH_COUNTS = 16, /* receive: a source's count word for this call */
  MEP_HT_OP_DISPATCH_SPACE = 17,  /* send: ring space at a destination */
  MEP_HT_OP_DISPATCH_RECV = 18,   /* receive: a source's rows */
  MEP_HT_OP_COMBINE_SPACE = 19,   /* send: ring space at a source */
  MEP_HT_OP_COMBINE_RECV = 20,    /* receive: an expert rank's partial rows */
  /* A count word from a source that split its tokens into a different
   * number of channels (ranks called set_num_sms differently): expected =
   * this rank's channels, seen = the word; fatal. */
  MEP_HT_OP_CHANNELS = 21,
  /* A network source's count signal counted this call on a channel whose
   * count word it did not send with it (it split its tokens into fewer
   * channels): expected = this rank's channels, seen = the stale word;
   * fatal. */
  MEP_HT_OP_CHANNEL_UNSENT = 22,
  /* A relay found a source's node word of this call stale although the
   * source's count words of every channel were this call's (they come in
   * one put): the ranks disagree on the node layout, or a bug; expected =
   * this call's tag, seen = the node word; fatal. */
  MEP_HT_OP_RELAY_WORD = 23,
  /* A source's rows are described otherwise than this rank's call (another
   * hidden, top_k or row format) while some rank's call has worst-case rows,
   * whose refusal no host sync would learn: expected = this call's row
   * description, seen = the source's (kernels/common/row_desc.h); fatal,
   * on every rank alike. Recorded without the abort flag: the rings are
   * still drained. When no rank has worst-case rows the dispatch is
   * refused through N_recv instead (mep_ht_refused_recv). */
  MEP_HT_OP_ROW_DESC = 24,
  /* Not a wait: a dispatch met a topk_idx value outside -1..num_experts-1
   * and sent that slot as -1 (expert = the value, expected = token, seen
   * = k), as MEP_LL_OP_BAD_ROUTING. Written into the notice record;
   * nothing is aborted. */
  MEP_HT_OP_BAD_ROUTING = 25
};

/* Capacities the window and state are sized for. */
typedef struct mep_ht_dims {
  int32_t world;
  int32_t local_experts;
  int32_t max_tokens; /* per rank */
  int32_t hidden;
  int32_t top_k;
  /* Consecutive ranks per node: peers on this rank's node are reached by
   * NVLink stores, the others through the network protocol (GIN puts and
   * signals, PROTOCOL.md "Network peers"), which needs staging rings and
   * signal words in the window. 0: every peer is on this node (LSA only). */
  int32_t node_ranks;
  /* Nonzero: combine sums each token's rows per node first, then across
   * nodes (the config set ranks_per_node), and with nodes of 2 or more
   * ranks among several nodes the relays do the node sums (PROTOCOL.md
   * "Relays"). 0: one ascending sum, rows crossing per rank. */
  int32_t sum_by_node;
} mep_ht_dims_t;

/* The transport of a group's network peers (values of moe_ep_transport_t). */
enum {
  MEP_HT_TRANSPORT_LSA = 1,
  MEP_HT_TRANSPORT_GIN = 2,
  MEP_HT_TRANSPORT_GIN_EMULATED = 3
};

typedef struct mep_ht_ctx {
  const void *dev_comm;  /* struct ncclDevComm, host copy (borrowed) */
  void *window;          /* ncclWindow_t */
  void *window_local;
  uint64_t window_bytes; /* >= mep_ht_buffer_bytes(dims) */
  mep_ht_dims_t dims;
  int32_t rank;
  int32_t num_sms;       /* blocks per launch: 2 per channel */
  int32_t transport;     /* MEP_HT_TRANSPORT_*: how network peers are reached */
  int32_t reserved0;
  uint64_t timeout_cycles;
  void *state;           /* device, mep_ht_state_bytes(dims), zeroed */
  mep_error_record_t *error_dev;  /* fatal record (host-mapped alias) */
  mep_error_record_t *notice_dev; /* notices (may be NULL) */
  uint64_t lsa_base;     /* from mep_ll_lsa_from_desc */
  uint64_t lsa_stride;
  uint64_t lsa_local;
} mep_ht_ctx_t;

typedef struct mep_ht_dispatch_args {
  const void *x;          /* [T, H] bf16, or [T, H] fp8 e4m3 bytes */
  const void *x_scales;   /* fp8: [T, scale_words] 4-byte words; NULL for bf16 */
  int32_t fp8;
  int32_t scale_words;    /* H/128 (f32 storage), ceil(H/512) (packed UE8M0) or 1
                             (one f32 per token), as scale_mode says; 0 for bf16 */
  const void *topk_idx;   /* [T, K] int32 or int64 */
  int32_t topk_idx_bytes;
  int32_t num_tokens;
  int32_t hidden;
  int32_t top_k;
  int32_t num_experts;
  int32_t buffer_set;     /* where combine finds this dispatch's layout */
  const float *topk_weights; /* [T, K] */
  /* outputs, rows packed by source rank then token */
  void *recv_x;           /* [cap, H] bf16 or fp8 */
  void *recv_scales;      /* fp8: [cap, scale_words] */
  int32_t *recv_topk_idx; /* [cap, K] local expert or -1 */
  float *recv_topk_weights; /* [cap, K] */
  int32_t *recv_count;    /* [E_local], zeroed by the launcher */
  int64_t recv_capacity;
  int32_t pad;            /* rows from N_recv to cap get idx -1, weight 0 */
  int32_t scale_mode;     /* fp8: MEP_FP8_SCALE_* of x_scales (told to the peers) */
  /* Device-visible: N_recv, or below -1 a refusal of the call (a source
   * made it with another hidden, top_k or row format: mep_ht_refused_recv).
   * May be NULL only with pad, where a refusal is recorded instead. */
  int64_t *num_recv;
} mep_ht_dispatch_args_t;

typedef struct mep_ht_combine_args {
  const void *y;          /* [N_recv, H] bf16, the dispatch's row order */
  const void *topk_idx;   /* [T, K] as in the dispatch */
  int32_t topk_idx_bytes;
  int32_t num_tokens;
  int32_t hidden;
  int32_t top_k;
  int32_t num_experts;
 int32_t layout_set;     /* the dispatch's buffer_set */
  int32_t channels;       /* the dispatch's mep_ht_channels */
  int32_t reserved0;
  void *out;              /* [T, H] bf16: per token, its ranks' rows summed
                             in f32 from +0 in ascending rank order (with
                             dims.sum_by_node: per node, then the node
                             sums, nodes ascending) */
} mep_ht_combine_args_t;

/* Exact symmetric-window bytes and device-state bytes. */
uint64_t mep_ht_buffer_bytes(const mep_ht_dims_t *dims);
/* GIN signals a group with network peers uses (ncclDevComm's
 * ginSignalCount); 0 when dims->node_ranks is 0. */
int32_t mep_ht_gin_signals(const mep_ht_dims_t *dims);
uint64_t mep_ht_state_bytes(const mep_ht_dims_t *dims);
/* Raises the abort flag in ctx->state (queued on stream, a copy engine's
 * work): every wait of a kernel in flight gives up at its next check. For
 * the teardown of a failed group. */
mep_kstatus_t mep_ht_raise_abort(const mep_ht_ctx_t *ctx, void *stream);
/* Channels a launch with ctx->num_sms uses (what every rank must agree on). */
int32_t mep_ht_channels(const mep_ht_ctx_t *ctx);

/* Fused kernels (send and receive in one cooperative launch); validate,
 * launch on `stream`, return at once. */
mep_kstatus_t mep_ht_dispatch(const mep_ht_ctx_t *ctx, const mep_ht_dispatch_args_t *args,
                              void *stream);
mep_kstatus_t mep_ht_combine(const mep_ht_ctx_t *ctx, const mep_ht_combine_args_t *args,
                             void *stream);
/* Loads both kernels for every transport on the current device before
 * their first launch, whose load would wait for the device's running work
 * (kernels/ll/ll.h, mep_ll_load). */
mep_kstatus_t mep_ht_load(void);

#ifdef __cplusplus
}
#endif

#endif /* MEP_HT_H_ */
