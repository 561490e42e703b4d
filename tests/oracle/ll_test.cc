// ll_test.cc: the LL slot table on the hand case, layout invariants on
// generated routings, and combine: with an identity expert, and end to end
// through the dispatch table (as a conformance test would); the summation
// order by hand is ll_combine_test's.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <tuple>

#include <gtest/gtest.h>

#include "tests/oracle/hand_case.h"
#include "tests/oracle/oracle.h"

namespace moe_ep_oracle {
namespace {

std::vector<std::tuple<int, int, int>> slots_of(const LlDispatchExpected& d, int e) {
  std::vector<std::tuple<int, int, int>> v;
  for (int i = 0; i < d.recv_count[e]; ++i) {
    const LlSlot& s = d.slots[d.row(e, i)];
    v.emplace_back(s.src_rank, s.src_token, s.k);
  }
  return v;
}

using Slots = std::vector<std::tuple<int, int, int>>;

TEST(LlDispatch, HandCaseSlotTable) {
  Problem p = hand_problem();
  std::vector<RankInputs> all = hand_inputs();
  LlDispatchExpected d0 = ll_dispatch_expected(p, all, 0);
  EXPECT_EQ(d0.recv_count, (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(d0.slots_per_expert, 6);
  EXPECT_EQ(slots_of(d0, 0), (Slots{{0, 2, 0}, {1, 0, 1}}));             // expert 0
  EXPECT_EQ(slots_of(d0, 1), (Slots{{0, 0, 0}, {0, 2, 1}, {1, 2, 0}}));  // expert 1
  LlDispatchExpected d1 = ll_dispatch_expected(p, all, 1);
  EXPECT_EQ(d1.recv_count, (std::vector<int32_t>{2, 2}));
  EXPECT_EQ(slots_of(d1, 0), (Slots{{0, 0, 1}, {1, 0, 0}}));             // expert 2
  EXPECT_EQ(slots_of(d1, 1), (Slots{{0, 1, 0}, {1, 2, 1}}));             // expert 3
  EXPECT_EQ(d0.full_row(1, 2), 8);
  // Rows are the source rows exactly (bf16).
  for (const LlDispatchExpected* d : {&d0, &d1})
    for (int64_t r = 0; r < d->rows(); ++r)
      for (int i = 0; i < 128; ++i)
        ASSERT_EQ(d->x_bf16[r * 128 + i],
                  float_to_bf16(hand_x(d->slots[r].src_rank, d->slots[r].src_token, i)));
}

// DeepEP's (src_info, layout_range) of the hand case, worked out by hand.
TEST(LlDispatch, HandCaseHandleLayout) {
  Problem p = hand_problem();
  std::vector<RankInputs> all = hand_inputs();
  const int64_t one = int64_t{1} << 32;
  LlHandleLayout l0 = ll_handle_layout(p, ll_dispatch_expected(p, all, 0));
  EXPECT_EQ(l0.src_info, (std::vector<int32_t>{2, 0, -1, -1, -1, -1, 0, 2, 2, -1, -1, -1}));
  EXPECT_EQ(l0.layout_range, (std::vector<int64_t>{1, one | 1, 2, 2 * one | 1}));
  LlHandleLayout l1 = ll_handle_layout(p, ll_dispatch_expected(p, all, 1));
  EXPECT_EQ(l1.src_info, (std::vector<int32_t>{0, 0, -1, -1, -1, -1, 1, 2, -1, -1, -1, -1}));
  EXPECT_EQ(l1.layout_range, (std::vector<int64_t>{1, one | 1, 1, one | 1}));
}

// On generated routings: the ranges tile [0, recv_count) in source order and
// src_info names, in each range, that source's tokens ascending.
TEST(LlDispatch, HandleLayoutRangesTileTheSlots) {
  Problem p;
  p.world = 4; p.num_experts = 16; p.hidden = 128; p.top_k = 3; p.max_tokens_per_rank = 20;
  p.generator = Generator::kSkewed;
  std::vector<RankInputs> all = make_all_inputs(p, 17);
  for (int r = 0; r < p.world; ++r) {
    LlDispatchExpected d = ll_dispatch_expected(p, all, r);
    LlHandleLayout l = ll_handle_layout(p, d);
    for (int e = 0; e < p.local_experts(); ++e) {
      int64_t next = 0;
      for (int s = 0; s < p.world; ++s) {
        int64_t v = l.layout_range[e * p.world + s], begin = v >> 32, count = v & 0xffffffff;
        ASSERT_EQ(begin, next) << "rank " << r << " expert " << e << " source " << s;
        const int32_t* info = &l.src_info[static_cast<size_t>(e) * d.slots_per_expert];
        for (int64_t i = begin; i < begin + count; ++i) {
          const LlSlot& sl = d.slots[d.row(e, static_cast<int>(i))];
          ASSERT_EQ(sl.src_rank, s);
          ASSERT_EQ(info[i], sl.src_token);
          if (i > begin) {
            ASSERT_LT(info[i - 1], info[i]);
          }
        }
        next = begin + count;
      }
      ASSERT_EQ(next, d.recv_count[e]);
      for (int64_t i = next; i < d.slots_per_expert; ++i) ASSERT_EQ(l.src_info[e * d.slots_per_expert + i], -1);
    }
  }
}

TEST(LlCombine, IdentityExpertGivesWeightedSumOfX) {
  Problem p;
  p.world = 2; p.num_experts = 8; p.hidden = 256; p.top_k = 4; p.max_tokens_per_rank = 16;
  p.generator = Generator::kMasked;
  RankInputs in = make_inputs(p, 1, 3);
  std::vector<uint16_t> out = ll_combine_reduce(p, in, [&](int t, int) { return &in.x[t * 256]; });
  for (int t = 0; t < in.num_tokens; ++t) {
    for (int i = 0; i < 256; ++i) {
      double want = 0;
      for (int k = 0; k < 4; ++k)
        if (in.topk_idx[t * 4 + k] != -1) want += in.topk_weights[t * 4 + k] * bf16_to_float(in.x[t * 256 + i]);
      // A double sum, so the two differ by their roundings (f32, one bf16):
      // within one bf16 ulp (2^-7 relative), or 2^-7 absolute near 0.
      const float got = bf16_to_float(out[t * 256 + i]);
      ASSERT_LE(std::fabs(got - want), std::ldexp(1.0, -7) * std::fmax(1.0, std::fabs(want)))
          << "t " << t << " i " << i << " got " << bf16_to_float(out[t * 256 + i]) << " want " << want;
    }
  }
}

struct Case {
  Generator g;
  DispatchDtype dtype;
  ScaleFormat fmt;
  int hidden = 640;  // any multiple of 8 for bf16 (2880: gpt-oss)
};

class LlGenerated : public ::testing::TestWithParam<Case> {};

TEST_P(LlGenerated, InvariantsAndEndToEndCombine) {
  Problem p;
  p.world = 4; p.num_experts = 16; p.hidden = GetParam().hidden; p.top_k = 6; p.max_tokens_per_rank = 24;
  p.generator = GetParam().g;
  p.dispatch_dtype = GetParam().dtype;
  p.scale_format = GetParam().fmt;
  const int H = p.hidden, K = p.top_k, L = p.local_experts(), G = p.scale_groups();
  const uint64_t seed = 17;
  std::vector<RankInputs> all = make_all_inputs(p, seed);

  int64_t slots = 0;
  for (const RankInputs& in : all)
    slots += std::count_if(in.topk_idx.begin(), in.topk_idx.end(), [](int64_t e) { return e != -1; });

  // Each rank "runs" its experts on the rows it received, as a test does on
  // the plugin's output; then each source's combine is rebuilt from them.
  std::vector<LlDispatchExpected> d(p.world);
  std::vector<std::vector<uint16_t>> y(p.world);
  int64_t received = 0;
  for (int r = 0; r < p.world; ++r) {
    d[r] = ll_dispatch_expected(p, all, r);
    ASSERT_EQ(static_cast<int>(d[r].recv_count.size()), L);
    for (int e = 0; e < L; ++e) {
      received += d[r].recv_count[e];
      ASSERT_LE(d[r].recv_count[e], d[r].slots_per_expert);
      for (int i = 0; i < d[r].recv_count[e]; ++i) {
        const LlSlot& s = d[r].slots[d[r].row(e, i)];
        ASSERT_EQ(all[s.src_rank].topk_idx[s.src_token * K + s.k], r * L + e);
        if (i > 0) {
          const LlSlot& prev = d[r].slots[d[r].row(e, i - 1)];
          ASSERT_LT(std::make_pair(prev.src_rank, prev.src_token), std::make_pair(s.src_rank, s.src_token));
        }
      }
    }
    y[r].resize(d[r].rows() * H);
    std::vector<float> xr(H), ref(H);
    for (int e = 0; e < L; ++e)
      for (int i = 0; i < d[r].recv_count[e]; ++i) {
        int64_t row = d[r].row(e, i);
        ll_received_row(p, d[r], row, xr.data());
        const LlSlot& s = d[r].slots[row];
        transported_row(p, &all[s.src_rank].x[s.src_token * H], ref.data());
        ASSERT_EQ(xr, ref);
        expert_fn_row(r * L + e, xr.data(), H, &y[r][row * H]);
      }
    if (p.dispatch_dtype == DispatchDtype::kFp8) {
      for (int64_t row = 0; row < d[r].rows(); ++row) {
        for (int g = 0; g < G; ++g) {
          float sc = d[r].scales[row * G + g];
          if (p.scale_format != ScaleFormat::kF32) {
            ASSERT_EQ(sc, round_scale_pow2(sc));
          }
        }
        if (p.scale_format == ScaleFormat::kUe8m0Packed) {
          std::vector<float> back(G);
          unpack_ue8m0(&d[r].scales_packed[row * p.packed_scale_words()], G, back.data());
          ASSERT_EQ(0, std::memcmp(back.data(), &d[r].scales[row * G], G * sizeof(float)));
        }
      }
    }
  }
  EXPECT_EQ(received, slots);

  for (int s = 0; s < p.world; ++s) {
    const int T = all[s].num_tokens;
    std::vector<const uint16_t*> where(static_cast<size_t>(T) * K, nullptr);
    for (int r = 0; r < p.world; ++r)
      for (int64_t row = 0; row < d[r].rows(); ++row) {
        const LlSlot& sl = d[r].slots[row];
        if (sl.src_rank == s) where[sl.src_token * K + sl.k] = &y[r][row * H];
      }
    std::vector<uint16_t> got =
        ll_combine_reduce(p, all[s], [&](int t, int k) { return where[t * K + k]; });
    std::vector<uint16_t> want = ll_combine_expected(p, all[s]);
    EXPECT_EQ(compare_exact_u16("combine", got.data(), want.data(), want.size(), H), "")
        << "rank " << s;
  }
}

INSTANTIATE_TEST_SUITE_P(
    All, LlGenerated,
    ::testing::Values(Case{Generator::kUniform, DispatchDtype::kBf16, ScaleFormat::kF32},
                      Case{Generator::kSkewed, DispatchDtype::kBf16, ScaleFormat::kF32},
                      Case{Generator::kAllToOneRank, DispatchDtype::kBf16, ScaleFormat::kF32},
                      Case{Generator::kEmptyRanks, DispatchDtype::kBf16, ScaleFormat::kF32},
                      Case{Generator::kMasked, DispatchDtype::kBf16, ScaleFormat::kF32},
                      Case{Generator::kUniform, DispatchDtype::kFp8, ScaleFormat::kF32},
                      Case{Generator::kMasked, DispatchDtype::kFp8, ScaleFormat::kUe8m0},
                      Case{Generator::kSkewed, DispatchDtype::kFp8, ScaleFormat::kUe8m0Packed},
                      Case{Generator::kEmptyRanks, DispatchDtype::kFp8, ScaleFormat::kUe8m0Packed},
                      Case{Generator::kUniform, DispatchDtype::kBf16, ScaleFormat::kF32, 2880},
                      Case{Generator::kMasked, DispatchDtype::kBf16, ScaleFormat::kF32, 1032},
                      Case{Generator::kEmptyRanks, DispatchDtype::kBf16, ScaleFormat::kF32, 2056}));

// Conformance-suite size: one rank's expected dispatch and combine for
// 8 ranks x 128 tokens x 7168 hidden must stay cheap (linear work).
TEST(LlScale, EightRanksDeepSeekShape) {
  Problem p;
  p.world = 8; p.num_experts = 256; p.hidden = 7168; p.top_k = 8; p.max_tokens_per_rank = 128;
  p.dispatch_dtype = DispatchDtype::kFp8;
  p.scale_format = ScaleFormat::kUe8m0Packed;
  auto t0 = std::chrono::steady_clock::now();
  std::vector<RankInputs> all = make_all_inputs(p, 1);
  auto t1 = std::chrono::steady_clock::now();
  LlDispatchExpected d = ll_dispatch_expected(p, all, 3);
  auto t2 = std::chrono::steady_clock::now();
  std::vector<uint16_t> out = ll_combine_expected(p, all[3]);
  auto t3 = std::chrono::steady_clock::now();
  auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  std::printf("inputs %.0f ms, dispatch (%lld rows) %.0f ms, combine %.0f ms\n", ms(t0, t1),
              static_cast<long long>(d.rows()), ms(t1, t2), ms(t2, t3));
  EXPECT_EQ(out.size(), 128u * 7168);
  EXPECT_GT(d.rows(), 0);
}

}  // namespace
}  // namespace moe_ep_oracle
