// ll_layout_test.cc: properties of the LL buffer layout (ll_layout.h) over
// many shapes, on the CPU: every region 16-byte aligned, inside its set and
// disjoint from the others; staging big enough for either use; flagged
// rows tiling their halves; signal ids unique and in range; the dispatch
// signal code decodes back to its (tokens, puts); device state regions
// disjoint. Every rank computes these offsets independently, so a slip
// here corrupts a peer's memory.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kernels/ll/ll_layout.h"

namespace {

std::string Dims(const mep_ll_dims_t& d) {
  return "E_local=" + std::to_string(d.local_experts) + " R=" + std::to_string(d.world) +
         " M=" + std::to_string(d.max_tokens) + " H=" + std::to_string(d.hidden) +
         " K=" + std::to_string(d.top_k) + " fp8=" + std::to_string(d.fp8);
}

std::vector<mep_ll_dims_t> Shapes() {
  std::vector<mep_ll_dims_t> out;
  for (int el : {1, 3, 128, 1024})
    for (int r : {1, 2, 8, 64})
      for (int m : {1, 7, 128, 1024})
        for (int h : {128, 384, 7168, 32768})
          for (int k : {1, 8, 9, 32})
            for (int fp8 : {0, 1}) out.push_back({el, r, m, h, k, fp8, 2, 0});
  return out;
}

TEST(LlLayout, RegionsAlignedDisjointAndInsideTheSet) {
  for (const mep_ll_dims_t& d : Shapes()) {
    const mep_ll_set_layout_t l = mep_ll_set_layout(&d);
    const uint64_t R = d.world, M = d.max_tokens, K = d.top_k;
    const uint64_t row_d = mep_ll_dispatch_row_bytes(d.hidden, d.fp8);
    const uint64_t row_c = 2ull * d.hidden;
    const uint64_t row_l = mep_ll_line_row_bytes(d.hidden);  // line partials
    const uint64_t list = mep_ll_align16(M * K * 8);  // (local expert, weight) per slot
    // [start, end) of each region; staging holds the larger of its two uses.
    std::vector<std::pair<uint64_t, uint64_t>> r = {
        {0, l.num_signals * 8},
        {l.disp_recv, l.disp_recv + R * M * row_d},
        {l.disp_list, l.disp_list + R * list},
        {l.disp_elist, l.disp_elist + (uint64_t)d.local_experts * R * mep_ll_align16((M + 1) * 8)},
        {mep_ll_comb_recv_off(&l, 0), mep_ll_comb_recv_off(&l, 0) + M * K * row_l},
        {mep_ll_comb_recv_off(&l, 1), mep_ll_comb_recv_off(&l, 1) + M * K * row_l},
        {l.comb_weights, l.comb_weights + R * M * K * 8},
        {mep_ll_comb_flag_off(&l, 0),
         mep_ll_comb_flag_off(&l, 0) + R * (uint64_t)mep_ll_flag_tokens(&d) * d.hidden * 4},
        {mep_ll_comb_flag_off(&l, 1),
         mep_ll_comb_flag_off(&l, 1) + R * (uint64_t)mep_ll_flag_tokens(&d) * d.hidden * 4},
        {l.stage, l.stage + M * row_d},
        {l.stage_list, l.stage_list + R * list},
    };
    // Combine staging: per-slot rows, then partials (both in one combine).
    const uint64_t comb_slot_end = l.stage + (uint64_t)d.local_experts * R * M * row_c;
    ASSERT_EQ(l.stage_partial, comb_slot_end) << Dims(d) << ": partial staging starts after the slots";
    ASSERT_LE(l.stage_partial + R * M * row_c, l.set_bytes) << Dims(d) << ": partial staging";
    for (size_t i = 0; i < r.size(); ++i) {
      ASSERT_EQ(r[i].first % 16, 0u) << Dims(d) << " region " << i;
      ASSERT_LE(r[i].second, l.set_bytes) << Dims(d) << " region " << i;
      for (size_t j = i + 1; j < r.size(); ++j)
        ASSERT_TRUE(r[i].second <= r[j].first || r[j].second <= r[i].first)
            << Dims(d) << ": regions " << i << " and " << j << " overlap";
    }
    ASSERT_EQ(l.set_bytes % 16, 0u) << Dims(d);
  }
}

// Flagged rows (mep_ll_flag_row_off, which the writer, the flagged sum and
// the wrap's zeroing share): in each half, (sending rank, token) rows in
// rank-major order tile comb_flag's half exactly, one hidden / 2 words
// each, every row 16-byte aligned (the 16-byte volatile stores and the
// wrap's uint4 stores).
TEST(LlLayout, FlaggedRowsTileEachHalf) {
  for (const mep_ll_dims_t& d : Shapes()) {
    const mep_ll_set_layout_t l = mep_ll_set_layout(&d);
    const int F = mep_ll_flag_tokens(&d);
    ASSERT_EQ(l.flag_tokens, (uint64_t)F) << Dims(d);
    const uint64_t row = (uint64_t)d.hidden * 4;
    for (int half = 0; half < 2; ++half) {
      uint64_t at = mep_ll_comb_flag_off(&l, half);
      for (int src = 0; src < d.world; ++src)
        for (int t = 0; t < F; ++t) {
          const uint64_t off = mep_ll_flag_row_off(&l, &d, half, src, t);
          ASSERT_EQ(off, at) << Dims(d) << " half " << half << " src " << src << " t " << t;
          ASSERT_EQ(off % 16, 0u) << Dims(d) << " half " << half << " src " << src << " t " << t;
          at += row;
        }
      ASSERT_EQ(at, mep_ll_comb_flag_off(&l, half) + l.comb_flag_half) << Dims(d) << " half " << half;
    }
  }
}

// Line-partial rows (mep_ll_line_row_off, which the writer, the lines sum
// and the wrap's zeroing share): whole 512-byte warp steps of 4 lines, 60
// channels a line, enough for the set's hidden and each at least a bf16
// row (staged transports' rows use comb_recv too), tiling each half in
// row order from a 128-byte boundary in every set; 14336 bf16 bytes of
// hidden 7168 take 15360.
TEST(LlLayout, LineRowsTileEachHalf) {
  for (const mep_ll_dims_t& d : Shapes()) {
    const mep_ll_set_layout_t l = mep_ll_set_layout(&d);
    const uint64_t row = mep_ll_line_row_bytes(d.hidden);
    ASSERT_EQ(row % 512, 0u) << Dims(d);
    ASSERT_GE(row / 512 * MEP_LL_LINE_STEP, (uint64_t)d.hidden) << Dims(d);
    ASSERT_LT((row / 512 - 1) * MEP_LL_LINE_STEP, (uint64_t)d.hidden) << Dims(d);
    ASSERT_GE(row, 2ull * d.hidden) << Dims(d);
    const uint64_t rows = (uint64_t)d.max_tokens * d.top_k;
    ASSERT_EQ(l.comb_recv_half, rows * row) << Dims(d);
    // every line on a 128-byte boundary in every set: comb_recv and the
    // set size (set s starts at s * set_bytes) are multiples of 128
    ASSERT_EQ(l.comb_recv % 128, 0u) << Dims(d);
    ASSERT_EQ(l.set_bytes % 128, 0u) << Dims(d);
    for (int half = 0; half < 2; ++half)
      for (uint64_t j : {(uint64_t)0, rows / 2, rows - 1})
        ASSERT_EQ(mep_ll_line_row_off(&l, &d, half, j), mep_ll_comb_recv_off(&l, half) + j * row)
            << Dims(d) << " half " << half << " row " << j;
  }
  mep_ll_dims_t d = {1, 2, 1, 7168, 8, 0, 2, 0};
  EXPECT_EQ(mep_ll_line_row_bytes(d.hidden), 15360u);
}

// The flagged-partials limit: 24 rows into one source from its R - 1
// peers (24 / (R - 1) tokens), at most 16 and at least 1, and never above
// the set's maximum.
TEST(LlLayout, FlagTokensFallWithThePeers) {
  const struct {
    int world, max_tokens, want;
  } cases[] = {{1, 128, 16}, {2, 128, 16}, {3, 128, 12}, {4, 128, 8},   {5, 128, 6},
               {7, 128, 4},  {8, 128, 3},  {9, 128, 3},  {13, 128, 2},  {24, 128, 1},
               {25, 128, 1}, {1024, 128, 1}, {2, 7, 7},  {4, 3, 3},     {8, 1, 1}};
  for (const auto& c : cases) {
    mep_ll_dims_t d = {};
    d.world = c.world;
    d.max_tokens = c.max_tokens;
    EXPECT_EQ(mep_ll_flag_tokens(&d), c.want) << "world " << c.world << " max_tokens " << c.max_tokens;
  }
}

// lsa_only drops the staging and nothing else: every other region keeps its
// offset, the set ends where staging began, and the saving is at least the
// per-slot combine staging (E_local * R * max_tokens bf16 rows).
TEST(LlLayout, LsaOnlyLeavesOutStagingAndKeepsEveryOtherOffset) {
  for (const mep_ll_dims_t& full : Shapes()) {
    mep_ll_dims_t lsa = full;
    lsa.lsa_only = 1;
    const mep_ll_set_layout_t a = mep_ll_set_layout(&full), b = mep_ll_set_layout(&lsa);
    ASSERT_EQ(a.num_signals, b.num_signals) << Dims(full);
    ASSERT_EQ(a.disp_recv, b.disp_recv) << Dims(full);
    ASSERT_EQ(a.disp_list, b.disp_list) << Dims(full);
    ASSERT_EQ(a.disp_elist, b.disp_elist) << Dims(full);
    ASSERT_EQ(a.comb_recv, b.comb_recv) << Dims(full);
    ASSERT_EQ(a.comb_weights, b.comb_weights) << Dims(full);
    ASSERT_EQ(a.comb_flag, b.comb_flag) << Dims(full);
    ASSERT_EQ(a.stage, b.stage) << Dims(full);
    ASSERT_EQ(b.set_bytes, b.stage) << Dims(full) << ": the LSA set ends where staging began";
    ASSERT_EQ(b.set_bytes % 16, 0u) << Dims(full);
    const uint64_t slot_rows = (uint64_t)full.local_experts * full.world * full.max_tokens *
                               2ull * full.hidden;
    ASSERT_GE(a.set_bytes - b.set_bytes, slot_rows) << Dims(full);
  }
  // A DeepSeek-style decode group (EP8, 32 local experts, 128 tokens,
  // hidden 7168, top-8, fp8): the staging is over 90% of the full set.
  mep_ll_dims_t d = {32, 8, 128, 7168, 8, 1, 2, 0};
  const uint64_t full = mep_ll_set_layout(&d).set_bytes;
  d.lsa_only = 1;
  const uint64_t lsa = mep_ll_set_layout(&d).set_bytes;
  EXPECT_LT(lsa * 10, full) << "full " << full << " lsa " << lsa;
  EXPECT_LT(lsa, 44ull << 20) << "lsa " << lsa;
}

TEST(LlLayout, SignalIdsUniqueAndInRange) {
  for (int r : {1, 2, 8, 1024}) {
    mep_ll_dims_t d = {4, r, 8, 128, 8, 0, 2, 0};
    const uint64_t n = mep_ll_set_layout(&d).num_signals;
    std::set<uint32_t> seen;
    for (int src = 0; src < r; ++src) {
      for (uint32_t s : {mep_ll_sig_disp_cnt(&d, src), mep_ll_sig_disp_row(&d, src),
                         mep_ll_sig_comb_cnt(&d, 0, src), mep_ll_sig_comb_row(&d, 0, src),
                         mep_ll_sig_comb_cnt(&d, 1, src), mep_ll_sig_comb_row(&d, 1, src)}) {
        ASSERT_LT(s, n) << "R=" << r << " src=" << src;
        ASSERT_TRUE(seen.insert(s).second) << "R=" << r << " src=" << src << " id " << s;
      }
    }
    ASSERT_EQ(seen.size(), n) << "R=" << r;
  }
}

TEST(LlLayout, DispatchSignalCodeDecodes) {
  for (int m : {1, 2, 128, 1024}) {
    for (int tokens = 0; tokens <= m; tokens += (m > 16 ? m / 8 : 1)) {
      for (int puts : {0, 1, tokens, tokens + 1}) {
        for (int weighted : {0, 1}) {
          const uint64_t code = mep_ll_disp_code(tokens, puts, weighted, m) - 1;  // seen - base - 1
          int t = -1, q = -1, w = -1;
          ASSERT_EQ(mep_ll_disp_decode(code, m, &t, &q, &w), 1) << "M=" << m;
          ASSERT_EQ(t, tokens) << "M=" << m << " puts=" << puts << " weighted=" << weighted;
          ASSERT_EQ(q, puts) << "M=" << m << " tokens=" << tokens << " weighted=" << weighted;
          ASSERT_EQ(w, weighted) << "M=" << m << " tokens=" << tokens << " puts=" << puts;
        }
      }
    }
  }
  // Past the largest code a sender makes: refused, nothing to read.
  int t, q, w;
  const uint64_t too_big = mep_ll_disp_code(128, 129, 1, 128);  // = largest code + 1
  EXPECT_EQ(mep_ll_disp_decode(too_big + 200000, 128, &t, &q, &w), 0);
  EXPECT_EQ(t + q + w, 0);
  // A weighted part of 2^32 would wrap to 0 in 32 bits: refused as well.
  const uint64_t m1 = 129;
  EXPECT_EQ(mep_ll_disp_decode(m1 * (m1 + 1) * (1ull << 32) + 5, 128, &t, &q, &w), 0);
}

// LSA count signals: the arrivals of every block, in any order, complete
// exactly when the last one lands, and give back block 0's code; one more
// arrival (a partly piled-up signal) is refused.
TEST(LlLayout, ArrivalsCompleteOnlyWithEveryBlock) {
  const uint64_t code = mep_ll_disp_code(1024, 0, 1, 1024);  // the largest LSA code
  ASSERT_LT(code, 1ull << 32);
  for (uint32_t grid : {1u, 2u, 7u, 132u, 1024u}) {
    for (uint32_t block0_at : {0u, grid / 2, grid - 1}) {  // when block 0's add lands
      uint64_t v = 0xfffffffffffff000ull;  // the shadow: any value, wrapping included
      const uint64_t base = v;
      uint32_t added = 0;
      for (uint32_t i = 0; i < grid; ++i) {
        // block 0 lands i-th at block0_at; the others in index order
        const uint32_t b = i == block0_at ? 0u : (i < block0_at ? i + 1 : i);
        uint64_t got = 0;
        ASSERT_EQ(mep_ll_arrival_state(v - base, &got), 0)
            << "grid=" << grid << " block 0 at " << block0_at << " after " << added;
        v += mep_ll_arrival_add(code, b, grid);
        ++added;
      }
      uint64_t got = 0;
      ASSERT_EQ(mep_ll_arrival_state(v - base, &got), 1) << "grid=" << grid;
      EXPECT_EQ(got, code) << "grid=" << grid;
      EXPECT_EQ(mep_ll_arrival_state(v - base + mep_ll_arrival_add(0, 1, grid), &got), -1)
          << "grid=" << grid;
    }
  }
}

// Slot-list words and heads carry their fields and tag intact at the
// limits; tags cycle through 1..65535 and never take 0 (zeroed memory).
TEST(LlLayout, ListWordsAndTagsRoundTrip) {
  for (int le : {-1, 0, 1, 1023}) {
    for (uint32_t wb : {0u, 0x3f800000u, 0xffffffffu}) {
      for (uint32_t tag : {1u, 2u, 0x8000u, 0xffffu}) {
        const uint64_t w = mep_ll_list_word(le, wb, tag);
        EXPECT_EQ(mep_ll_list_expert(w), le) << "le=" << le << " tag=" << tag;
        EXPECT_EQ(mep_ll_list_weight_bits(w), wb) << "le=" << le << " tag=" << tag;
        EXPECT_EQ(mep_ll_list_tag(w), tag) << "le=" << le << " w=" << wb;
      }
    }
  }
  const uint32_t widest = (1u << MEP_ROW_DESC_BITS) - 1u;
  for (int tokens : {0, 1, MEP_MAX_TOKENS_LL}) {
    for (int weighted : {0, 1}) {
      for (uint32_t desc : {0u, widest}) {
        const uint64_t h = mep_ll_list_head(tokens, weighted, desc, 0xffffu);
        EXPECT_EQ(mep_ll_head_tokens(h), tokens);
        EXPECT_EQ(mep_ll_head_weighted(h), weighted);
        EXPECT_EQ(mep_ll_head_desc(h), desc);
        EXPECT_EQ(mep_ll_list_tag(h), 0xffffu);
      }
    }
  }

  uint32_t tag = 0, prev = 0;  // zeroed state: the first call's tag is 1
  for (int i = 0; i < 3 * 65535; ++i) {
    tag = mep_ll_next_tag(tag);
    ASSERT_GE(tag, 1u) << "call " << i;
    ASSERT_LE(tag, 0xffffu) << "call " << i;
    ASSERT_NE(tag, prev) << "call " << i;  // a word one call old never matches
    prev = tag;
  }
  EXPECT_EQ(mep_ll_next_tag(0), 1u);
  EXPECT_EQ(mep_ll_next_tag(0xffffu), 1u);
  mep_ll_dims_t d = {8, 2, 128, 7168, 8, 1, 2, 0};
  EXPECT_EQ(mep_ll_list_bytes(&d), MEP_LL_LIST_HEAD_BYTES + 128u * 8u * 8u);
}

// Expert-list words carry their fields and tag intact at the limits; a
// written word is never zero (the tag is at least 1), so zero means unread.
TEST(LlLayout, ExpertListWordsRoundTrip) {
  for (uint32_t hits : {0u, 1u, 1024u, 32768u, 0xffffffffu}) {
    for (int tokens : {0, 1, 1024}) {
      for (uint32_t tag : {1u, 0x8000u, 0xffffu}) {
        const uint64_t c = mep_ll_elist_count(hits, tokens, tag);
        EXPECT_EQ(mep_ll_elist_hits(c), hits) << "tokens=" << tokens << " tag=" << tag;
        EXPECT_EQ(mep_ll_elist_tokens(c), tokens) << "hits=" << hits << " tag=" << tag;
        EXPECT_EQ(mep_ll_list_tag(c), tag) << "hits=" << hits << " tokens=" << tokens;
        EXPECT_NE(c, 0u);
      }
    }
  }
  for (int token : {0, 1, 1023, 2047}) {
    for (int k : {0, 7, 31}) {
      for (uint32_t tag : {1u, 0xffffu}) {
        const uint64_t e = mep_ll_elist_entry(token, k, tag);
        EXPECT_EQ(mep_ll_elist_token(e), token) << "k=" << k << " tag=" << tag;
        EXPECT_EQ(mep_ll_elist_k(e), k) << "token=" << token << " tag=" << tag;
        EXPECT_EQ(mep_ll_list_tag(e), tag) << "token=" << token << " k=" << k;
        EXPECT_NE(e, 0u);
      }
    }
  }
  mep_ll_dims_t d = {8, 2, 128, 7168, 8, 1, 2, 0};
  EXPECT_EQ(mep_ll_elist_bytes(&d), 129u * 8u + 8u);  // 16-aligned
}

TEST(LlLayout, OneBufferSetIsHalfTheWindowOfTwo) {
  mep_ll_dims_t one = {128, 2, 128, 7168, 8, 1, 1, 0}, two = one;
  two.num_sets = 2;
  EXPECT_EQ(mep_ll_num_sets(&one), 1);
  EXPECT_EQ(mep_ll_num_sets(&two), 2);
  mep_ll_dims_t legacy = one;
  legacy.num_sets = 0;  // zero-initialised dims mean two sets
  EXPECT_EQ(mep_ll_num_sets(&legacy), 2);
}

TEST(LlLayout, StateRegionsDisjoint) {
  for (int r : {1, 2, 8, 1024}) {
    mep_ll_dims_t d = {16, r, 8, 128, 8, 0, 2, 0};
    const mep_ll_state_layout_t s = mep_ll_state_layout(&d);
    const uint64_t nsig = mep_ll_set_layout(&d).num_signals;
    // every receive block's copy of every signal's shadow, in both sets
    EXPECT_LE(s.shadows + 2 * MEP_LL_SHADOW_SLOTS * nsig * 8, s.tags) << "R=" << r;
    // every block's copy of the tag words (mep_ll_tag_words: R + 2), both sets
    EXPECT_LE(s.tags + 2ull * MEP_LL_SHADOW_SLOTS * mep_ll_tag_words(r) * 4, s.puts) << "R=" << r;
    EXPECT_LE(s.puts + 2ull * r * 4, s.comb_puts) << "R=" << r;
    EXPECT_LE(s.comb_puts + 2ull * r * 4, s.tickets) << "R=" << r;
    // each set: its tickets, then one 8-byte help word per local expert,
    // 8-byte aligned for the receive's atomic adds
    EXPECT_LE(MEP_LL_NUM_TICKETS * 4, MEP_LL_TICKET_BYTES);
    EXPECT_EQ(mep_ll_set_counter_bytes(&d), MEP_LL_TICKET_BYTES + 16u * 8u) << "R=" << r;
    EXPECT_EQ(s.tickets % 16, 0u) << "R=" << r;
    EXPECT_EQ(mep_ll_set_counter_bytes(&d) % 8, 0u) << "R=" << r;
    EXPECT_LE(s.tickets + 2ull * mep_ll_set_counter_bytes(&d), s.abort_flag) << "R=" << r;
    EXPECT_LE(s.abort_flag + 4, s.bytes) << "R=" << r;
    // clear_abort zeroes [puts, abort_flag + 4), the help words with it:
    // the shadows and tags stay.
    EXPECT_LT(s.shadows, s.puts);
    EXPECT_LT(s.tags, s.puts);
  }
}

}  // namespace
