// ht_world_shape_test.cc: HT ranks that make one layer call with rows laid
// out differently (another hidden, top_k, or row format down to the fp8
// scale format) on one GPU (one_gpu_world.h). When no rank's call has
// worst-case rows, every rank's dispatch refuses the call through its
// N_recv, naming a rank that differs and that rank's row description,
// writes no row and records nothing, and the group's next two calls match
// the oracle bit for bit: the rings, which the refused call wraps several
// times, were drained and stay consistent. Over NVLink, and over
// GIN-emulated with nodes of one and two, where relays forward a differing
// source's rows as that source laid them out. When some rank's call has
// worst-case rows, every rank records the difference (fatal) and the
// worst-case ranks mark every row empty; all kernels end without waiting
// out their bound.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/common/row_desc.h"
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
constexpr int kAllRanks = -2, kNoRank = -1;

enum class Differs { kHidden, kTopK, kFp8, kScaleFormat, kPerToken };

struct ShapeCase {
  const char *name;
  int world, node_ranks;
  Differs differs;
  int odd;    // the rank whose call differs
  int worst;  // the rank whose call has worst-case rows, kAllRanks or kNoRank
};

std::ostream &operator<<(std::ostream &os, const ShapeCase &s) { return os << s.name; }

class HtWorldShape : public ::testing::TestWithParam<ShapeCase> {
 protected:
  void SetUp() override {
    const ShapeCase &s = GetParam();
    // Two channels of 320 tokens: every ring carries about 300 rows a call,
    // more than twice its 128.
    c_ = {s.name, s.world, s.node_ranks, s.node_ranks == 0 ? kLsa : kEmu, 16 * s.world, 2048,
          8, 640, o::Generator::kUniform, false, o::ScaleFormat::kF32, 4, false};
    ASSERT_EQ(MakeGroup(c_, kTimeoutMs, &grp_), "");
    p_ = ProblemOf(c_);
  }

  bool Worst(int r) const {
    const int w = GetParam().worst;
    return w == kAllRanks || w == r;
  }

  // Rank r's dispatch of call d, made differently on the odd rank.
  mep_ht_dispatch_args_t Args(const CallData &d, int r, bool differ, Dev *dev) {
    mep_ht_dispatch_args_t a = DispatchArgs(c_, p_, d, r, grp_.io[r], dev);
    if (!differ) return a;
    a.pad = Worst(r);
    const auto make_fp8 = [&](int mode) {
      a.fp8 = 1;
      a.scale_mode = mode;
      a.scale_words = mep_fp8_scale_words(a.hidden, mode);
      a.x_scales = dev->upload(std::vector<float>(
          static_cast<size_t>(a.num_tokens > 0 ? a.num_tokens : 1) * a.scale_words, 1.0f));
    };
    if (GetParam().differs == Differs::kScaleFormat)
      make_fp8(r == GetParam().odd ? MEP_FP8_SCALE_UE8M0 : MEP_FP8_SCALE_F32);
    if (GetParam().differs == Differs::kPerToken)
      make_fp8(r == GetParam().odd ? MEP_FP8_SCALE_PER_TOKEN : MEP_FP8_SCALE_F32);
    if (r != GetParam().odd) return a;
    switch (GetParam().differs) {
      case Differs::kHidden:
        a.hidden = c_.hidden / 2;
        break;
      case Differs::kTopK:  // topk_idx read at another stride: ids stay valid
        a.top_k = c_.top_k - 2;
        break;
      case Differs::kFp8:
        make_fp8(MEP_FP8_SCALE_UE8M0_PACKED);
        break;
      case Differs::kScaleFormat:
      case Differs::kPerToken:
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

  // One call of matching shapes on every rank, dispatch and combine, both
  // against the oracle.
  void RunMatchingCall(int call, Dev *dev) {
    const int R = c_.world;
    const CallData d = MakeCall(c_, p_, call);
    std::vector<mep_ht_dispatch_args_t> da(R);
    for (int r = 0; r < R; ++r) da[r] = Args(d, r, false, dev);
    ASSERT_EQ(Dispatch(da), "");
    ASSERT_EQ(grp_.world->Records(), "") << "call " << call << ", seed " << d.seed;
    for (int r = 0; r < R; ++r)
      EXPECT_EQ(CheckDispatch(c_, d, r, grp_.io[r]), "")
          << "rank " << r << ", call " << call << ", seed " << d.seed;
    if (HasFailure()) return;
    std::vector<mep_ht_combine_args_t> ca(R);
    for (int r = 0; r < R; ++r) ca[r] = CombineArgs(c_, d, r, da[r], grp_.io[r], dev);
    ASSERT_EQ(grp_.world->Settle(), "");
    ASSERT_EQ(grp_.world->LaunchAll([&](int r, cudaStream_t st) {
      return mep_ht_combine(&grp_.io[r].ctx, &ca[r], st);
    }),
              "");
    ASSERT_EQ(grp_.world->Sync(), "");
    ASSERT_EQ(grp_.world->Records(), "") << "call " << call << ", seed " << d.seed;
    int64_t order_matters = 0;
    for (int r = 0; r < R; ++r)
      EXPECT_EQ(CheckCombine(c_, p_, d, r, grp_.io[r], &order_matters), "")
          << "rank " << r << ", call " << call << ", seed " << d.seed;
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
  const auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(Dispatch(da), "");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
            kTimeoutMs / 2000.0)
      << "a dispatch waited instead of draining: " << grp_.world->Records();
  const bool fatal = s.worst != kNoRank;
  for (int r = 0; r < R; ++r) {
    const uint32_t mine = mep_row_desc(da[r].hidden, da[r].top_k, da[r].fp8, da[r].scale_mode);
    const int64_t n = mep_world::Download<int64_t>(grp_.io[r].num_recv, 1)[0];
    const std::vector<int32_t> count =
        mep_world::Download<int32_t>(grp_.io[r].recv_count, c_.experts / R);
    for (size_t e = 0; e < count.size(); ++e)
      EXPECT_EQ(count[e], 0) << "rank " << r << " counted rows of local expert " << e;
    ASSERT_LT(n, -1) << "rank " << r << " took the call (N_recv " << n << ")";
    const int named = mep_ht_refused_source(n);
    EXPECT_EQ(named == s.odd, r != s.odd) << "rank " << r << " named rank " << named;
    ASSERT_GE(named, 0);
    ASSERT_LT(named, R);
    const uint32_t theirs =
        mep_row_desc(da[named].hidden, da[named].top_k, da[named].fp8, da[named].scale_mode);
    EXPECT_EQ(mep_ht_refused_desc(n), theirs)
        << "rank " << r << " described rank " << named << "'s call wrongly";
    if (!fatal) continue;
    const mep_error_record_t &rec = grp_.world->records(r)[0];
    ASSERT_EQ(rec.flag, 2) << "rank " << r << " has no record: " << grp_.world->Records();
    EXPECT_EQ(rec.op, MEP_HT_OP_ROW_DESC) << grp_.world->Records();
    EXPECT_EQ(rec.peer, named) << "rank " << r;
    EXPECT_EQ(rec.expected, mine) << "rank " << r;
    EXPECT_EQ(rec.seen, theirs) << "rank " << r;
    if (!Worst(r)) continue;
    const std::vector<int32_t> idx = mep_world::Download<int32_t>(
        grp_.io[r].recv_idx, static_cast<size_t>(da[r].recv_capacity) * da[r].top_k);
    for (size_t i = 0; i < idx.size(); ++i)
      ASSERT_EQ(idx[i], -1) << "rank " << r << ": recv_topk_idx[" << i << "] not marked empty";
  }
  if (fatal) return;  // the group failed
  ASSERT_EQ(grp_.world->Records(), "");
  // Every rank skips that call's combine; the next calls run as usual.
  for (int call = 1; call <= 2 && !HasFailure(); ++call) RunMatchingCall(call, &call_dev);
}

const ShapeCase kShapes[] = {
    {"ep2_lsa_hidden", 2, 0, Differs::kHidden, 1, kNoRank},
    {"ep3_lsa_top_k", 3, 0, Differs::kTopK, 0, kNoRank},
    {"ep4_lsa_fp8", 4, 0, Differs::kFp8, 2, kNoRank},
    {"ep2_lsa_scale_format", 2, 0, Differs::kScaleFormat, 0, kNoRank},
    // Per-token scales against 128-channel ones: another row stride.
    {"ep3_lsa_per_token", 3, 0, Differs::kPerToken, 1, kNoRank},
    {"ep4_emu_nodes2_per_token", 4, 2, Differs::kPerToken, 2, kNoRank},
    // Rank 3's rows reach node {0, 1} through rank 1 and rank 0's reach
    // {2, 3} through rank 2: both relays forward rows of another layout.
    {"ep4_emu_nodes2_hidden", 4, 2, Differs::kHidden, 3, kNoRank},
    {"ep4_emu_nodes2_fp8", 4, 2, Differs::kFp8, 0, kNoRank},
    {"ep4_emu_nodes2_top_k", 4, 2, Differs::kTopK, 1, kNoRank},
    {"ep4_emu_nodes1_top_k", 4, 1, Differs::kTopK, 1, kNoRank},
    {"ep2_lsa_hidden_worst_case", 2, 0, Differs::kHidden, 0, kAllRanks},
    {"ep4_emu_nodes2_fp8_worst_case", 4, 2, Differs::kFp8, 1, kAllRanks},
    // One rank's call with worst-case rows makes the difference fatal on
    // every rank, and its peers still drain to the end.
    {"ep4_lsa_top_k_one_worst_case", 4, 0, Differs::kTopK, 2, 3},
};

INSTANTIATE_TEST_SUITE_P(Calls, HtWorldShape, ::testing::ValuesIn(kShapes),
                         [](const ::testing::TestParamInfo<ShapeCase> &i) {
                           return std::string(i.param.name);
                         });

}  // namespace
