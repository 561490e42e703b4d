/* ht_layout.h: where the HT protocol's words and rings live in the
 * symmetric window, and its per-rank device state. Plain C, computed alike
 * by every rank from the same dims (the runtime sizes the window with it). */
#ifndef MEP_HT_LAYOUT_H_
#define MEP_HT_LAYOUT_H_

#include <stdint.h>

#include "kernels/common/row_desc.h"
#include "kernels/ht/ht.h"

/* Device code computes the same offsets. */
#ifdef __CUDACC__
#define MEP_HT_HD __host__ __device__
#else
#define MEP_HT_HD
#endif

#ifdef __cplusplus
extern "C" {
#endif

static inline MEP_HT_HD uint64_t mep_ht_align(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

/* A dispatch ring row: the payload (bf16 [2H], or fp8 [H] then the scales'
 * words, 16-aligned), then K local expert ids (int32) and K weights (f32). */
static inline MEP_HT_HD uint64_t mep_ht_payload_bytes(int32_t hidden, int32_t fp8, int32_t scale_words) {
  return fp8 ? mep_ht_align((uint64_t)hidden + 4u * (uint64_t)scale_words, 16)
             : 2u * (uint64_t)hidden;
}
/* The largest row the dims allow: bf16 (an fp8 row with its scales is
 * never larger: H + H/32 < 2H). */
static inline MEP_HT_HD uint64_t mep_ht_disp_row_bytes(const mep_ht_dims_t *d) {
  return mep_ht_align(2u * (uint64_t)d->hidden + 8u * (uint64_t)d->top_k, 128);
}
static inline MEP_HT_HD uint64_t mep_ht_comb_row_bytes(const mep_ht_dims_t *d) {
  return mep_ht_align(2u * (uint64_t)d->hidden, 16);
}

/* Window offsets. Every counter is a u64 indexed [peer][channel]:
 *   cnt       [2][R][C]  count words from each source, by call parity
 *   disp_tail [R][C]     rows source r has written into our ring (r, c)
 *   disp_head [R][C]     rows destination r has drained from its ring (us, c)
 *   comb_tail, comb_head the same for combine's rings
 * then the rings, [R][C][MEP_HT_RING_ROWS] rows each. A group with network
 * peers (node_ranks > 0) also has, for those peers (PROTOCOL.md "Network
 * peers"): their count words, 16 bytes apart (a put moves whole 16-byte
 * vectors) [2][R][C], the staged copies of ours [2][R][C], the signal
 * words GIN-emulated keeps in the window [MEP_HT_SIG_KINDS][R][C], the
 * heads of the rings this rank fills as a relay [R origin][R dest][C]
 * (PROTOCOL.md "Relays"), and staging rings, where a row is written
 * before the put that reads it (a NIC reads only registered memory): one
 * [C][Q] ring per node or per rank (mep_ht_disp_stage_slots,
 * mep_ht_comb_stage_slots). */
typedef struct mep_ht_window {
  uint64_t cnt, disp_tail, disp_head, comb_tail, comb_head;
  uint64_t cnt_net, cnt_stage, sig, fwd_head;
  uint64_t disp_ring, comb_ring, disp_stage, comb_stage;
  uint64_t disp_row, comb_row;
  uint64_t bytes;
} mep_ht_window_t;

/* Signal kinds of network peers, each [R][C]: the count puts a source has
 * made (one per call), the rows it has put into our ring, the rows a
 * destination has drained from its ring of ours, and combine's pair. */
enum {
  MEP_HT_SIG_CNT = 0,
  MEP_HT_SIG_DISP_TAIL = 1,
  MEP_HT_SIG_DISP_HEAD = 2,
  MEP_HT_SIG_COMB_TAIL = 3,
  MEP_HT_SIG_COMB_HEAD = 4,
  MEP_HT_SIG_KINDS = 5
};
static inline MEP_HT_HD uint32_t mep_ht_sig(int32_t world, int kind, int peer, int c) {
  return ((uint32_t)kind * (uint32_t)world + (uint32_t)peer) * MEP_HT_MAX_CHANNELS + (uint32_t)c;
}

/* Staging of the network puts, in slots of [C][Q] rows (network groups
 * only). Dispatch puts only to the relay at this rank's index on each
 * other node: one slot per node (slot d / node_ranks). Combine with node
 * sums puts only from a relay to the sources at its index on the other
 * nodes: one slot per node too; without, to every rank of another node
 * (slot s). */
static inline MEP_HT_HD uint64_t mep_ht_disp_stage_slots(const mep_ht_dims_t *d) {
  return d->node_ranks > 0 ? (uint64_t)(d->world / d->node_ranks) : 0u;
}
static inline MEP_HT_HD uint64_t mep_ht_comb_stage_slots(const mep_ht_dims_t *d) {
  if (d->node_ranks <= 0) return 0u;
  return d->sum_by_node ? (uint64_t)(d->world / d->node_ranks) : (uint64_t)d->world;
}

static inline MEP_HT_HD mep_ht_window_t mep_ht_window_layout(const mep_ht_dims_t *d) {
  mep_ht_window_t w;
  const uint64_t words = (uint64_t)d->world * MEP_HT_MAX_CHANNELS * 8u;
  const int net = d->node_ranks > 0;
  w.cnt = 0;
  w.disp_tail = w.cnt + 2u * words;
  w.disp_head = w.disp_tail + words;
  w.comb_tail = w.disp_head + words;
  w.comb_head = w.comb_tail + words;
  w.cnt_net = w.comb_head + words;
  w.cnt_stage = w.cnt_net + (net ? 4u * words : 0u);
  w.sig = w.cnt_stage + (net ? 4u * words : 0u);
  w.fwd_head = w.sig + (net ? MEP_HT_SIG_KINDS * words : 0u);
  w.disp_row = mep_ht_disp_row_bytes(d);
  w.comb_row = mep_ht_comb_row_bytes(d);
  const uint64_t rings = (uint64_t)d->world * MEP_HT_MAX_CHANNELS * MEP_HT_RING_ROWS;
  w.disp_ring = mep_ht_align(w.fwd_head + (net ? (uint64_t)d->world * words : 0u), 128);
  w.comb_ring = w.disp_ring + rings * w.disp_row;
  const uint64_t slot_rows = (uint64_t)MEP_HT_MAX_CHANNELS * MEP_HT_RING_ROWS;
  w.disp_stage = w.comb_ring + rings * w.comb_row;
  w.comb_stage = w.disp_stage + mep_ht_disp_stage_slots(d) * slot_rows * w.disp_row;
  w.bytes = w.comb_stage + mep_ht_comb_stage_slots(d) * slot_rows * w.comb_row;
  return w;
}

/* Device state (ordinary memory, zeroed once). The ring positions each
 * side keeps for itself, [R][C] u64 each, and with network peers the
 * tails of the rings this rank fills as a relay, [R origin][R dest][C];
 * per buffer set, the layout a
 * dispatch received (rows from each (source, channel) and its channel
 * count), which that set's combine sends back along; the call counter
 * (epoch) and the block ticket that advances it; the abort flag. */
typedef struct mep_ht_state {
  uint64_t epoch, ticket_dispatch, ticket_combine, abort_flag; /* u32 each */
  uint64_t send_tail_d, recv_head_d, send_tail_c, recv_head_c, fwd_tail;
  uint64_t layout_n;    /* int32 [MEP_NUM_BUFFER_SETS][R][C] */
  uint64_t layout_chan; /* int32 [MEP_NUM_BUFFER_SETS] */
  /* A relay's record of its network rings, per buffer set, for the
   * combine that reduces along them (network groups only): rows per
   * (source, channel), int32 [sets][R][C], and each row's local ranks,
   * u16 [sets][R][max_tokens] (channels in order). */
  uint64_t relay_n, relay_mask;
  uint64_t bytes;
} mep_ht_state_t;

static inline MEP_HT_HD mep_ht_state_t mep_ht_state_layout(const mep_ht_dims_t *d) {
  mep_ht_state_t s;
  const uint64_t words = (uint64_t)d->world * MEP_HT_MAX_CHANNELS * 8u;
  s.epoch = 0;
  s.ticket_dispatch = 4;
  s.ticket_combine = 8;
  s.abort_flag = 12;
  s.send_tail_d = 64;
  s.recv_head_d = s.send_tail_d + words;
  s.send_tail_c = s.recv_head_d + words;
  s.recv_head_c = s.send_tail_c + words;
  s.fwd_tail = s.recv_head_c + words;
  s.layout_n = s.fwd_tail + (d->node_ranks > 0 ? (uint64_t)d->world * words : 0u);
  s.layout_chan = s.layout_n + (uint64_t)MEP_NUM_BUFFER_SETS * d->world * MEP_HT_MAX_CHANNELS * 4u;
  const int net = d->node_ranks > 0;
  s.relay_n = mep_ht_align(s.layout_chan + MEP_NUM_BUFFER_SETS * 4u, 64);
  s.relay_mask = s.relay_n +
                 (net ? (uint64_t)MEP_NUM_BUFFER_SETS * d->world * MEP_HT_MAX_CHANNELS * 4u : 0u);
  s.bytes = mep_ht_align(
      s.relay_mask + (net ? (uint64_t)MEP_NUM_BUFFER_SETS * d->world * d->max_tokens * 2u : 0u),
      64);
  return s;
}

/* The ring row payload of a source whose call `desc` describes. */
static inline MEP_HT_HD uint64_t mep_ht_desc_payload(uint32_t desc) {
  const int32_t h = mep_row_desc_hidden(desc), mode = mep_row_desc_scale_mode(desc);
  return mep_ht_payload_bytes(h, mode >= 0, mep_fp8_scale_words(h, mode));
}

/* Count word: tag (21) | worst case (1) | row description (20) | channels
 * (5) | rows (17). The tag is the call's epoch tag (epoch + 1) folded into
 * 1..2^21 - 1 (mep_ht_cnt_tag): never 0, which a word never written holds,
 * and different for the two calls two epochs apart that share a word. The
 * worst-case bit says the source's call has worst-case rows (no host sync
 * would learn of a refusal); the row description (row_desc.h) how its rows
 * are laid out. */
#define MEP_HT_CNT_TAG_MAX 0x1fffffu
static inline MEP_HT_HD uint32_t mep_ht_cnt_tag(uint32_t tag) {
  return (tag - 1u) % MEP_HT_CNT_TAG_MAX + 1u;
}
#define MEP_HT_CNT_WORD(tag, worst, desc, chan, rows)                                 \
  (((uint64_t)mep_ht_cnt_tag(tag) << 43) | ((uint64_t)((worst) ? 1u : 0u) << 42) |    \
   ((uint64_t)(desc) << 22) | ((uint64_t)(chan) << 17) | (uint64_t)(rows))
#define MEP_HT_CNT_TAG(w) ((uint32_t)((w) >> 43))
#define MEP_HT_CNT_WORST(w) ((int)(((w) >> 42) & 1u))
#define MEP_HT_CNT_DESC(w) ((uint32_t)(((w) >> 22) & 0xfffffu))
#define MEP_HT_CNT_CHAN(w) ((int32_t)(((w) >> 17) & 0x1fu))
#define MEP_HT_CNT_ROWS(w) ((int32_t)((w) & 0x1ffffu))

/* A dispatch's N_recv (mep_ht_dispatch_args_t.num_recv) when it refused
 * the call because source s's rows are described by `desc`, not by this
 * rank's call: below -1 (-1 is the host's value before the kernel). */
static inline MEP_HT_HD int64_t mep_ht_refused_recv(int32_t s, uint32_t desc) {
  return -2 - (((int64_t)s << MEP_ROW_DESC_BITS) | (int64_t)desc);
}
static inline MEP_HT_HD int32_t mep_ht_refused_source(int64_t n) {
  return (int32_t)((-2 - n) >> MEP_ROW_DESC_BITS);
}
static inline MEP_HT_HD uint32_t mep_ht_refused_desc(int64_t n) {
  return (uint32_t)((-2 - n) & ((1 << MEP_ROW_DESC_BITS) - 1));
}

#ifdef __cplusplus
}
#define MEP_HT_STATIC_ASSERT(cond, why) static_assert(cond, why)
#else
#define MEP_HT_STATIC_ASSERT(cond, why) _Static_assert(cond, why)
#endif

MEP_HT_STATIC_ASSERT(MEP_MAX_TOKENS_HT < (1 << 17), "an HT count word's rows field is 17 bits");
MEP_HT_STATIC_ASSERT(MEP_HT_MAX_CHANNELS < 32, "an HT count word's channel field is 5 bits");
MEP_HT_STATIC_ASSERT(MEP_ROW_DESC_BITS == 20, "an HT count word's row description is 20 bits");
MEP_HT_STATIC_ASSERT(MEP_HT_RING_ROWS >= 2 * MEP_HT_CHUNK,
                     "an HT ring holds two chunks (one written while one drains)");

#endif /* MEP_HT_LAYOUT_H_ */
