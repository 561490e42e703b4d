// ht_link_test.cc: the HT kernel library links into a host binary, its
// launchers reject invalid arguments without a GPU, and its window does not
// grow with the token count.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/common/kernels_error.h"
#include "kernels/common/kernels_types.h"
#include "kernels/common/row_desc.h"
#include "kernels/ht/ht.h"
#include "kernels/ht/ht_layout.h"
#include "tests/kernels/fake_ctx.h"

namespace {

mep_ht_dims_t Dims(int world, int max_tokens) {
  mep_ht_dims_t d = {};
  d.world = world;
  d.local_experts = 128;
  d.max_tokens = max_tokens;
  d.hidden = 7168;
  d.top_k = 8;
  return d;
}

// A context the checks accept up to the launch (pointers never followed).
mep_ht_ctx_t Ctx(const mep_ht_dims_t &d) {
  mep_ht_ctx_t c = {};
  FillFakePointers(&c);
  c.dims = d;
  c.num_sms = 24;
  c.window_bytes = mep_ht_buffer_bytes(&d);
  return c;
}

mep_ht_dispatch_args_t Dispatch() {
  mep_ht_dispatch_args_t a = {};
  a.topk_idx_bytes = 8;
  a.hidden = 7168;
  a.top_k = 8;
  a.num_experts = 256;
  return a;
}

std::string Refusal(mep_kstatus_t st) {
  return st == MEP_KSTATUS_INVALID_ARGUMENT ? mep_kernels_last_error() : "(accepted)";
}

TEST(HtLink, LaunchersRejectNullArguments) {
  mep_ht_dispatch_args_t a = Dispatch();
  mep_ht_combine_args_t c = {};
  EXPECT_EQ(mep_ht_dispatch(nullptr, &a, nullptr), MEP_KSTATUS_INVALID_ARGUMENT);
  EXPECT_EQ(mep_ht_combine(nullptr, &c, nullptr), MEP_KSTATUS_INVALID_ARGUMENT);
  const mep_ht_ctx_t ctx = Ctx(Dims(2, 4096));
  EXPECT_EQ(mep_ht_dispatch(&ctx, nullptr, nullptr), MEP_KSTATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(mep_kernels_last_error()).find("args is NULL"), std::string::npos);
}

TEST(HtLink, DispatchRejectsEachBrokenRule) {
  const mep_ht_ctx_t ctx = Ctx(Dims(2, 4096));
  struct Bad {
    const char *rule;
    void (*breaks)(mep_ht_dispatch_args_t *);
  };
  const Bad bad[] = {
      {"num_tokens is 4097", [](mep_ht_dispatch_args_t *a) { a->num_tokens = 4097; }},
      {"hidden is 7176", [](mep_ht_dispatch_args_t *a) { a->hidden = 7176; }},
      {"top_k is 9", [](mep_ht_dispatch_args_t *a) { a->top_k = 9; }},
      {"num_experts is 257", [](mep_ht_dispatch_args_t *a) { a->num_experts = 257; }},
      {"topk_idx_bytes is 2", [](mep_ht_dispatch_args_t *a) { a->topk_idx_bytes = 2; }},
      {"buffer_set is 2", [](mep_ht_dispatch_args_t *a) { a->buffer_set = 2; }},
      {"per token (got 0)", [](mep_ht_dispatch_args_t *a) { a->fp8 = 1; }},
      // Not the scale mode's words (56 f32, 14 packed or 1 per token at
      // hidden 7168).
      {"per token (got 20)",
       [](mep_ht_dispatch_args_t *a) {
         a->fp8 = 1;
         a->scale_words = 20;
       }},
      {"per token (got 56)",
       [](mep_ht_dispatch_args_t *a) {
         a->fp8 = 1;
         a->scale_mode = MEP_FP8_SCALE_UE8M0_PACKED;
         a->scale_words = 56;
       }},
      {"per token (got 56)",
       [](mep_ht_dispatch_args_t *a) {
         a->fp8 = 1;
         a->scale_mode = MEP_FP8_SCALE_PER_TOKEN;
         a->scale_words = 56;
       }},
      {"scale_mode 0..3 (got 4)",
       [](mep_ht_dispatch_args_t *a) {
         a->fp8 = 1;
         a->scale_mode = 4;
         a->scale_words = 56;
       }},
      {"is NULL with 3 tokens", [](mep_ht_dispatch_args_t *a) { a->num_tokens = 3; }},
      {"num_recv is NULL without pad",
       [](mep_ht_dispatch_args_t *a) { a->recv_count = reinterpret_cast<int32_t *>(0x100); }},
      {"recv_count) is NULL", [](mep_ht_dispatch_args_t *a) { a->recv_capacity = 0; }},
  };
  for (const Bad &b : bad) {
    mep_ht_dispatch_args_t a = Dispatch();
    b.breaks(&a);
    const std::string why = Refusal(mep_ht_dispatch(&ctx, &a, nullptr));
    EXPECT_NE(why.find(b.rule), std::string::npos) << "rule '" << b.rule << "', got: " << why;
  }
}

TEST(HtLink, ContextRules) {
  mep_ht_dispatch_args_t a = Dispatch();
  mep_ht_ctx_t ctx = Ctx(Dims(MEP_HT_MAX_RANKS + 1, 64));
  EXPECT_NE(Refusal(mep_ht_dispatch(&ctx, &a, nullptr)).find("takes 1..16 ranks"),
            std::string::npos);
  ctx = Ctx(Dims(2, 64));
  ctx.window_bytes -= 1;
  EXPECT_NE(Refusal(mep_ht_dispatch(&ctx, &a, nullptr)).find("smaller than the HT buffer"),
            std::string::npos);
  ctx = Ctx(Dims(2, 64));
  ctx.num_sms = 0;
  EXPECT_NE(Refusal(mep_ht_dispatch(&ctx, &a, nullptr)).find("num_sms is 0"), std::string::npos);
}

// A network transport needs a node split that divides the world; NVLink
// alone needs none.
TEST(HtLink, NodeSplitRules) {
  mep_ht_dispatch_args_t a = Dispatch();
  struct Case {
    int transport, node_ranks;
    const char *rule; /* nullptr: accepted up to the arguments */
  };
  const Case cases[] = {
      {MEP_HT_TRANSPORT_GIN_EMULATED, 0, "transport 3 with node_ranks 0 (world 2)"},
      {MEP_HT_TRANSPORT_GIN, 3, "transport 2 with node_ranks 3 (world 2)"},
      {MEP_HT_TRANSPORT_LSA, 1, "transport 1 with node_ranks 1 (world 2)"},
      {MEP_HT_TRANSPORT_GIN_EMULATED, 1, nullptr},
      {MEP_HT_TRANSPORT_GIN, 2, nullptr},
  };
  for (const Case &k : cases) {
    mep_ht_dims_t d = Dims(2, 64);
    d.node_ranks = k.node_ranks;
    mep_ht_ctx_t ctx = Ctx(d);
    ctx.transport = k.transport;
    a.num_tokens = 3; /* past the context checks, refused for its NULL x */
    const std::string why = Refusal(mep_ht_dispatch(&ctx, &a, nullptr));
    if (k.rule != nullptr) {
      EXPECT_NE(why.find(k.rule), std::string::npos) << "rule '" << k.rule << "', got: " << why;
    } else {
      EXPECT_NE(why.find("is NULL with 3 tokens"), std::string::npos)
          << "transport " << k.transport << " node_ranks " << k.node_ranks << ": " << why;
    }
  }
}

// The same rules at the sizes of one 4- and 8-GPU node: any divisor of the
// world is a node size (nodes of 1, 2, 4 GPUs), nothing else is.
TEST(HtLink, NodeSplitRulesAtFourAndEightRanks) {
  mep_ht_dispatch_args_t a = Dispatch();
  a.num_tokens = 3;
  for (int world : {4, 8}) {
    for (int node_ranks = 1; node_ranks <= world + 1; node_ranks++) {
      mep_ht_dims_t d = Dims(world, 64);
      d.node_ranks = node_ranks;
      mep_ht_ctx_t ctx = Ctx(d);
      ctx.transport = MEP_HT_TRANSPORT_GIN_EMULATED;
      const std::string why = Refusal(mep_ht_dispatch(&ctx, &a, nullptr));
      if (world % node_ranks == 0) {
        EXPECT_NE(why.find("is NULL with 3 tokens"), std::string::npos)
            << "world " << world << " node_ranks " << node_ranks << ": " << why;
      } else {
        const std::string rule = "transport 3 with node_ranks " + std::to_string(node_ranks) +
                                 " (world " + std::to_string(world) + ")";
        EXPECT_NE(why.find(rule), std::string::npos) << "rule '" << rule << "', got: " << why;
      }
    }
  }
}

TEST(HtLink, CombineNeedsTheDispatchsChannels) {
  const mep_ht_ctx_t ctx = Ctx(Dims(2, 64));
  mep_ht_combine_args_t c = {};
  c.topk_idx_bytes = 4;
  c.hidden = 7168;
  c.top_k = 8;
  c.num_experts = 256;
  c.channels = 0;
  EXPECT_NE(Refusal(mep_ht_combine(&ctx, &c, nullptr)).find("channels is 0"), std::string::npos);
  c.channels = MEP_HT_MAX_CHANNELS + 1;
  EXPECT_NE(Refusal(mep_ht_combine(&ctx, &c, nullptr)).find("channels is 17"), std::string::npos);
}

// The rings are sized by channels and rows, never by tokens: 8192 tokens
// per rank cost what 64 do.
TEST(HtLayout, WindowIsIndependentOfTokens) {
  const mep_ht_dims_t small = Dims(2, 64), big = Dims(2, 65536);
  EXPECT_EQ(mep_ht_buffer_bytes(&small), mep_ht_buffer_bytes(&big));
  const mep_ht_window_t w = mep_ht_window_layout(&big);
  const uint64_t rings = 2ull * MEP_HT_MAX_CHANNELS * MEP_HT_RING_ROWS;
  // A dispatch row (payload, then K ids and K weights) starts on a
  // 128-byte line: 14400 bytes round up to 14464.
  EXPECT_EQ(w.disp_row, 14464u);
  EXPECT_EQ(w.disp_row % 128u, 0u);
  EXPECT_GE(w.disp_row, 2u * 7168 + 8u * 8);
  EXPECT_EQ(w.comb_row, 2u * 7168);
  EXPECT_EQ(w.bytes, w.disp_ring + rings * (w.disp_row + w.comb_row));
  EXPECT_LT(w.bytes, 128ull << 20);  // EP2, hidden 7168: under 128 MiB
}

// The window grows with the ranks (one ring set per peer and channel) and
// stays modest on one 8-GPU node at hidden 7168: under 512 MiB over NVLink,
// under 1 GiB with the network's staging rings.
TEST(HtLayout, WindowAtFourAndEightRanks) {
  uint64_t prev = 0;
  for (int world : {2, 4, 8}) {
    mep_ht_dims_t d = Dims(world, 8192);
    const uint64_t lsa = mep_ht_buffer_bytes(&d);
    d.node_ranks = world / 2;
    const uint64_t net = mep_ht_buffer_bytes(&d);
    EXPECT_GT(lsa, prev) << "world " << world;
    EXPECT_GT(net, lsa) << "world " << world;
    EXPECT_LT(lsa, 512ull << 20) << "world " << world;
    EXPECT_LT(net, 1ull << 30) << "world " << world;
    prev = lsa;
  }
}

TEST(HtLayout, RegionsDoNotOverlap) {
  for (int world : {1, 2, 4, 7, 8, 16}) {
    const mep_ht_dims_t d = Dims(world, 128);
    const mep_ht_window_t w = mep_ht_window_layout(&d);
    const uint64_t words = (uint64_t)world * MEP_HT_MAX_CHANNELS * 8u;
    EXPECT_EQ(w.disp_tail, w.cnt + 2 * words);
    EXPECT_EQ(w.disp_head, w.disp_tail + words);
    EXPECT_EQ(w.comb_tail, w.disp_head + words);
    EXPECT_EQ(w.comb_head, w.comb_tail + words);
    EXPECT_GE(w.disp_ring, w.comb_head + words);
    EXPECT_EQ(w.disp_ring % 128, 0u);
    const mep_ht_state_t s = mep_ht_state_layout(&d);
    EXPECT_GE(s.send_tail_d, s.abort_flag + 4);
    EXPECT_EQ(s.layout_chan, s.layout_n + 4ull * MEP_NUM_BUFFER_SETS * world * MEP_HT_MAX_CHANNELS);
    EXPECT_EQ(s.bytes, mep_ht_state_bytes(&d));
  }
}

// Network peers add their count words, staged copies, signal words, the
// heads of the rings a relay fills [R][R][C] (with their tails in the
// state) and staging: dispatch's one [C][Q] slot per node (its puts go to
// the relays only), combine's one per rank, or per node when the relays
// sum per node; an NVLink-only group has none.
TEST(HtLayout, NetworkRegions) {
  for (int world : {1, 2, 4, 8, 16}) {
    mep_ht_dims_t d = Dims(world, 128);
    const mep_ht_window_t lsa = mep_ht_window_layout(&d);
    EXPECT_EQ(lsa.disp_stage, lsa.bytes);
    EXPECT_EQ(lsa.comb_stage, lsa.bytes);
    EXPECT_EQ(mep_ht_gin_signals(&d), 0);
    const mep_ht_state_t lsa_state = mep_ht_state_layout(&d);
    EXPECT_EQ(lsa_state.layout_n, lsa_state.fwd_tail);
    d.node_ranks = 1;
    const mep_ht_window_t w = mep_ht_window_layout(&d);
    const uint64_t words = (uint64_t)world * MEP_HT_MAX_CHANNELS * 8u;
    const uint64_t rings = (uint64_t)world * MEP_HT_MAX_CHANNELS * MEP_HT_RING_ROWS;
    EXPECT_EQ(w.cnt_net, w.comb_head + words);
    EXPECT_EQ(w.cnt_stage, w.cnt_net + 4 * words);  /* [2][R][C] 16-byte entries */
    EXPECT_EQ(w.sig, w.cnt_stage + 4 * words);
    EXPECT_EQ(w.fwd_head, w.sig + MEP_HT_SIG_KINDS * words);
    EXPECT_GE(w.disp_ring, w.fwd_head + world * words);
    const mep_ht_state_t st = mep_ht_state_layout(&d);
    EXPECT_EQ(st.fwd_tail, st.recv_head_c + words);
    EXPECT_EQ(st.layout_n, st.fwd_tail + world * words);
    EXPECT_EQ(w.disp_ring % 128, 0u);
    /* Nodes of one rank: every peer is a relay, one slot per rank. */
    EXPECT_EQ(w.disp_stage, w.comb_ring + rings * w.comb_row);
    EXPECT_EQ(w.comb_stage, w.disp_stage + rings * w.disp_row);
    EXPECT_EQ(w.bytes, w.comb_stage + rings * w.comb_row);
    EXPECT_EQ(mep_ht_gin_signals(&d), MEP_HT_SIG_KINDS * world * MEP_HT_MAX_CHANNELS);
    /* The last signal id is the last word of the signal area. */
    EXPECT_EQ(mep_ht_sig(world, MEP_HT_SIG_KINDS - 1, world - 1, MEP_HT_MAX_CHANNELS - 1) + 1u,
              (uint32_t)mep_ht_gin_signals(&d));
    /* Larger nodes shrink only the staging. */
    const uint64_t slot_rows = (uint64_t)MEP_HT_MAX_CHANNELS * MEP_HT_RING_ROWS;
    for (int n = 2; n <= world; n *= 2) {
      for (int sums : {0, 1}) {
        d.node_ranks = n;
        d.sum_by_node = sums;
        const mep_ht_window_t v = mep_ht_window_layout(&d);
        const uint64_t nodes = (uint64_t)(world / n);
        EXPECT_EQ(v.disp_stage, w.disp_stage) << "n " << n;
        EXPECT_EQ(v.comb_stage, v.disp_stage + nodes * slot_rows * v.disp_row) << "n " << n;
        EXPECT_EQ(v.bytes, v.comb_stage + (sums ? nodes : (uint64_t)world) * slot_rows * v.comb_row)
            << "n " << n << " sums " << sums;
        EXPECT_EQ(mep_ht_buffer_bytes(&d), v.bytes);
      }
    }
    d.sum_by_node = 0;
  }
}

TEST(HtLayout, CountWordRoundTrips) {
  const uint32_t desc =
      mep_row_desc(MEP_MAX_HIDDEN, MEP_MAX_TOP_K, 1, MEP_FP8_SCALE_PER_TOKEN);
  EXPECT_EQ(desc >> (MEP_ROW_DESC_BITS - 1), 1u);  // the description's top bit is in use
  for (int worst : {0, 1}) {
    const uint64_t w =
        MEP_HT_CNT_WORD(0xfffffffeu, worst, desc, MEP_HT_MAX_CHANNELS, MEP_MAX_TOKENS_HT);
    EXPECT_EQ(MEP_HT_CNT_TAG(w), mep_ht_cnt_tag(0xfffffffeu));
    EXPECT_EQ(MEP_HT_CNT_WORST(w), worst);
    EXPECT_EQ(MEP_HT_CNT_DESC(w), desc);
    EXPECT_EQ(MEP_HT_CNT_CHAN(w), MEP_HT_MAX_CHANNELS);
    EXPECT_EQ(MEP_HT_CNT_ROWS(w), MEP_MAX_TOKENS_HT);
  }
}

// The folded tag is never 0 (a word never written) and differs between
// the two calls that share a word (epochs two apart), across its wrap and
// the epoch's.
TEST(HtLayout, CountWordTagsOfCallsSharingAWordDiffer) {
  const uint32_t tags[] = {1u, 2u, MEP_HT_CNT_TAG_MAX - 1u, MEP_HT_CNT_TAG_MAX,
                           MEP_HT_CNT_TAG_MAX + 1u, 0xfffffffeu, 0xffffffffu, 0u};
  for (uint32_t t : tags) {
    EXPECT_NE(mep_ht_cnt_tag(t), 0u) << "tag " << t;
    EXPECT_LE(mep_ht_cnt_tag(t), MEP_HT_CNT_TAG_MAX) << "tag " << t;
    EXPECT_NE(mep_ht_cnt_tag(t), mep_ht_cnt_tag(t + 2u)) << "tag " << t;
  }
}

// A row description holds hidden, top_k and the row format exactly (the
// scale format too, where f32 and UE8M0 scales, or at hidden 128 f32,
// packed and per-token ones, have as many words), tells every two such calls apart, and
// gives each the ring payload its rows have.
TEST(HtLayout, RowDescriptionsAreExact) {
  struct Row {
    int hidden, top_k, mode;  // mode -1: bf16
  };
  std::vector<Row> rows;
  for (int h : {8, 128, 2880, 4096, 7168, MEP_MAX_HIDDEN})
    for (int k : {1, 8, MEP_MAX_TOP_K})
      for (int mode = -1; mode <= MEP_FP8_SCALE_PER_TOKEN; ++mode)
        if (mode < 0 || h % 128 == 0) rows.push_back({h, k, mode});
  for (const Row &a : rows) {
    const uint32_t d = mep_row_desc(a.hidden, a.top_k, a.mode >= 0, a.mode);
    EXPECT_LT(d, 1u << MEP_ROW_DESC_BITS);
    EXPECT_EQ(mep_row_desc_hidden(d), a.hidden);
    EXPECT_EQ(mep_row_desc_top_k(d), a.top_k);
    EXPECT_EQ(mep_row_desc_scale_mode(d), a.mode);
    EXPECT_EQ(mep_ht_desc_payload(d),
              mep_ht_payload_bytes(a.hidden, a.mode >= 0, mep_fp8_scale_words(a.hidden, a.mode)))
        << "hidden " << a.hidden << " mode " << a.mode;
    const int64_t n = mep_ht_refused_recv(MEP_HT_MAX_RANKS - 1, d);
    EXPECT_LT(n, -1);
    EXPECT_EQ(mep_ht_refused_source(n), MEP_HT_MAX_RANKS - 1);
    EXPECT_EQ(mep_ht_refused_desc(n), d);
    for (const Row &b : rows) {
      const bool same = a.hidden == b.hidden && a.top_k == b.top_k && a.mode == b.mode;
      EXPECT_EQ(d == mep_row_desc(b.hidden, b.top_k, b.mode >= 0, b.mode), same)
          << a.hidden << "/" << a.top_k << "/" << a.mode << " against " << b.hidden << "/"
          << b.top_k << "/" << b.mode;
    }
  }
  EXPECT_EQ(mep_fp8_scale_words(7168, MEP_FP8_SCALE_F32), 56);
  EXPECT_EQ(mep_fp8_scale_words(7168, MEP_FP8_SCALE_UE8M0), 56);
  EXPECT_EQ(mep_fp8_scale_words(7168, MEP_FP8_SCALE_UE8M0_PACKED), 14);
  EXPECT_EQ(mep_fp8_scale_words(7168, MEP_FP8_SCALE_PER_TOKEN), 1);
  EXPECT_EQ(mep_fp8_scale_words(2048, -1), 0);
  EXPECT_EQ(mep_ht_refused_source(mep_ht_refused_recv(0, 0)), 0);
  EXPECT_EQ(mep_ht_refused_recv(0, 0), -2);
}

}  // namespace
