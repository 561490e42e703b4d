// ht_world_shape_test.cc: HT ranks that make one layer call with rows laid
// out differently (another hidden, top_k or row format) on one GPU
// (one_gpu_world.h). Without worst-case rows every rank's dispatch refuses
// the call through its N_recv, naming a rank that differs and that rank's
// row description, writes no row and records nothing, and the group's next
// call matches the oracle bit for bit (the rings stayed consistent). Over
// NVLink, and over GIN-emulated with nodes of two, where relays forward a
// differing source's rows as that source laid them out. With worst-case
// rows every rank records the mismatch (fatal) and marks every row empty.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/ht/ht.h"
#include "kernels/ht/ht_layout.h"
#include "tests/gpu/ht_world.h"
#include "tests/gpu/one_gpu_world.h"

namespace {

namespace o = moe_ep_oracle;
using ht_world::CallData;
using ht_world::Case;
using ht_world::HtGroup;
using ht_world::kEmu;
using ht_world::kLsa;
using mep_world::Dev;

constexpr int kTimeoutMs = 20000;

enum class Differs { kHidden, kTopK, kFp8 };

struct ShapeCase {
  const char *name;
  int world, node_ranks;
  Differs differs;
  int odd;  // the rank whose call differs
  bool pad;
};

std::ostream &operator<<(std::ostream &os, const ShapeCase &s) { return os << s.name; }

class HtWorldShape : public ::testing::TestWithParam<ShapeCase> {
 protected:
  void SetUp() override {
    const ShapeCase &s = GetParam();
    c_ = {s.name, s.world, s.node_ranks, s.node_ranks == 0 ? kLsa : kEmu, 16 * s.world, 2048,
          8, 48, o::Generator::kUniform, false, o::ScaleFormat::kF32, 8, s.pad};
    ASSERT_EQ(MakeGroup(c_, kTimeoutMs, &grp_), "");
    p_ = ProblemOf(c_);
  }

  // Rank r's dispatch of call d, made differently on the odd rank.
  mep_ht_dispatch_args_t Args(const CallData &d, int r, bool differ, Dev *dev) {
    mep_ht_dispatch_args_t a = DispatchArgs(c_, p_, d, r, grp_.io[r], dev);
    if (!differ || r != GetParam().odd) return a;
    switch (GetParam().differs) {
      case Differs::kHidden:
        a.hidden = c_.hidden / 2;
        break;
      case Differs::kTopK:  // topk_idx read at another stride: ids stay valid
        a.top_k = c_.top_k - 2;
        break;
      case Differs::kFp8:
        a.fp8 = 1;
        a.scale_words = c_.hidden / 128;
        a.x_scales = dev->upload(std::vector<float>(
            static_cast<size_t>(a.num_tokens > 0 ? a.num_tokens : 1) * a.scale_words, 1.0f));
        break;
    }
    return a;
  }

  std::string Dispatch(const std::vector<mep_ht_dispatch_args_t> &da) {
    std::string err = grp_.world->Settle();
    if (err.empty())
      err = grp_.world->LaunchAll([&](int r, cudaStream_t s) {
        return mep_ht_dispatch(&grp_.io[r].ctx, &da[r], s);
      });
    if (err.empty()) err = grp_.world->Sync();
    return err;
  }

  Case c_;
  o::Problem p_;
  HtGroup grp_;
};

TEST_P(HtWorldShape, DifferingCallIsRefusedByEveryRank) {
  const ShapeCase &s = GetParam();
  const int R = c_.world;
  const CallData d = MakeCall(c_, p_, 0);
  Dev call_dev;
  std::vector<mep_ht_dispatch_args_t> da(R);
  for (int r = 0; r < R; ++r) da[r] = Args(d, r, true, &call_dev);
  ASSERT_EQ(Dispatch(da), "");
  for (int r = 0; r < R; ++r) {
    const uint32_t mine = mep_ht_row_desc(da[r].hidden, da[r].top_k, da[r].fp8, da[r].scale_words);
    const int64_t n = mep_world::Download<int64_t>(grp_.io[r].num_recv, 1)[0];
    const std::vector<int32_t> count =
        mep_world::Download<int32_t>(grp_.io[r].recv_count, c_.experts / R);
    for (size_t e = 0; e < count.size(); ++e)
      EXPECT_EQ(count[e], 0) << "rank " << r << " counted rows of local expert " << e;
    if (s.pad) {
      const mep_error_record_t &rec = grp_.world->records(r)[0];
      ASSERT_EQ(rec.flag, 2) << "rank " << r << " has no record: " << grp_.world->Records();
      EXPECT_EQ(rec.op, MEP_HT_OP_ROW_DESC) << grp_.world->Records();
      EXPECT_EQ(rec.expected, mine) << "rank " << r;
      EXPECT_NE(rec.seen, mine) << "rank " << r;
      EXPECT_EQ(rec.peer == s.odd, r != s.odd) << "rank " << r << " named rank " << rec.peer;
      const std::vector<int32_t> idx = mep_world::Download<int32_t>(
          grp_.io[r].recv_idx, static_cast<size_t>(da[r].recv_capacity) * da[r].top_k);
      for (size_t i = 0; i < idx.size(); ++i)
        ASSERT_EQ(idx[i], -1) << "rank " << r << ": recv_topk_idx[" << i << "] not marked empty";
      continue;
    }
    ASSERT_LT(n, -1) << "rank " << r << " took the call (N_recv " << n << ")";
    const int named = mep_ht_refused_source(n);
    EXPECT_EQ(named == s.odd, r != s.odd) << "rank " << r << " named rank " << named;
    ASSERT_GE(named, 0);
    ASSERT_LT(named, R);
    EXPECT_EQ(mep_ht_refused_desc(n),
              mep_ht_row_desc(da[named].hidden, da[named].top_k, da[named].fp8,
                              da[named].scale_words))
        << "rank " << r << " described rank " << named << "'s call wrongly";
  }
  if (s.pad) return;  // the group failed
  ASSERT_EQ(grp_.world->Records(), "");

  // Every rank skips that call's combine; the next call runs as usual.
  const CallData next = MakeCall(c_, p_, 1);
  for (int r = 0; r < R; ++r) da[r] = Args(next, r, false, &call_dev);
  ASSERT_EQ(Dispatch(da), "");
  ASSERT_EQ(grp_.world->Records(), "") << "seed " << next.seed;
  for (int r = 0; r < R; ++r)
    EXPECT_EQ(CheckDispatch(c_, next, r, grp_.io[r]), "") << "rank " << r << ", seed " << next.seed;
  if (HasFailure()) return;
  std::vector<mep_ht_combine_args_t> ca(R);
  for (int r = 0; r < R; ++r) ca[r] = CombineArgs(c_, next, r, da[r], grp_.io[r], &call_dev);
  ASSERT_EQ(grp_.world->Settle(), "");
  ASSERT_EQ(grp_.world->LaunchAll([&](int r, cudaStream_t st) {
    return mep_ht_combine(&grp_.io[r].ctx, &ca[r], st);
  }),
            "");
  ASSERT_EQ(grp_.world->Sync(), "");
  ASSERT_EQ(grp_.world->Records(), "") << "seed " << next.seed;
  int64_t order_matters = 0;
  for (int r = 0; r < R; ++r)
    EXPECT_EQ(CheckCombine(c_, p_, next, r, grp_.io[r], &order_matters), "")
        << "rank " << r << ", seed " << next.seed;
}

const ShapeCase kShapes[] = {
    {"ep2_lsa_hidden", 2, 0, Differs::kHidden, 1, false},
    {"ep3_lsa_top_k", 3, 0, Differs::kTopK, 0, false},
    {"ep4_lsa_fp8", 4, 0, Differs::kFp8, 2, false},
    // Rank 3 is the relay of rank 1's rows on the node {2, 3}, and rank 0
    // of rank 3's on {0, 1}: both forward rows of another layout.
    {"ep4_emu_nodes2_hidden", 4, 2, Differs::kHidden, 3, false},
    {"ep4_emu_nodes2_fp8", 4, 2, Differs::kFp8, 0, false},
    {"ep4_emu_nodes1_top_k", 4, 1, Differs::kTopK, 1, false},
    {"ep2_lsa_hidden_worst_case", 2, 0, Differs::kHidden, 0, true},
    {"ep4_emu_nodes2_fp8_worst_case", 4, 2, Differs::kFp8, 1, true},
};

INSTANTIATE_TEST_SUITE_P(Calls, HtWorldShape, ::testing::ValuesIn(kShapes),
                         [](const ::testing::TestParamInfo<ShapeCase> &i) {
                           return std::string(i.param.name);
                         });

}  // namespace
