// ht_world_test.cc: the HT kernels at 3..16 ranks on one GPU (one_gpu_world.h),
// against the oracle: LSA, and GIN-emulated with nodes of 1, 2, 3, 4 and 8
// ranks and one node of the whole group (relays forward each token to the
// ranks of their node; the rows put over the network are counted), bf16
// and pre-quantised fp8, several calls
// per group (ring positions and the count words' epochs carry across
// calls), worst-case padding. Every rank's dispatch outputs and combined
// rows are compared bit for bit.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/ht/ht.h"
#include "tests/gpu/ht_world.h"
#include "tests/gpu/one_gpu_world.h"

namespace {

namespace o = moe_ep_oracle;
using ht_world::CallData;
using ht_world::Case;
using ht_world::HtGroup;
using ht_world::kEmu;
using ht_world::kLsa;
using ht_world::RankIo;
using mep_world::Dev;

constexpr int kCalls = 3;  // per group: epochs 0..2 (both count-word parities)
constexpr int kCallsAlternating = 5;  // later_sms: channels up, down, up, down
constexpr int kTimeoutMs = 20000;

class HtWorld : public ::testing::TestWithParam<Case> {};

TEST_P(HtWorld, MatchesOracle) {
  const Case &c = GetParam();
  const o::Problem p = ProblemOf(c);
  const int R = c.world;

  HtGroup grp;
  ASSERT_EQ(MakeGroup(c, kTimeoutMs, &grp), "");
  const auto &world = grp.world;
  std::vector<RankIo> &io = grp.io;
  std::vector<int64_t> network_rows(static_cast<size_t>(R) * R, 0);
  // Combined values where the per-node order differs from one ascending
  // sum: the check can only tell the orders apart where there are some.
  int64_t order_matters = 0;
  const int calls = c.later_sms != 0 ? kCallsAlternating : kCalls;
  for (int call = 0; call < calls; ++call) {
    for (int r = 0; r < R; ++r)
      io[r].ctx.num_sms = call % 2 && c.later_sms ? c.later_sms : c.num_sms;
    const CallData d = MakeCall(c, p, call);
    Dev call_dev;
    std::vector<mep_ht_dispatch_args_t> da(R);
    for (int r = 0; r < R; ++r) da[r] = DispatchArgs(c, p, d, r, io[r], &call_dev);
    ASSERT_EQ(world->Settle(), "");
    ASSERT_EQ(world->LaunchAll([&](int r, cudaStream_t s) {
      return mep_ht_dispatch(&io[r].ctx, &da[r], s);
    }),
              "")
        << "call " << call;
    ASSERT_EQ(world->Sync(), "") << "dispatch, call " << call;
    ASSERT_EQ(world->Records(), "")
        << "dispatch, call " << call << ", seed " << d.seed;
    for (int r = 0; r < R; ++r)
      EXPECT_EQ(CheckDispatch(c, d, r, io[r]), "")
          << "rank " << r << ", call " << call << ", seed " << d.seed;
    if (HasFailure()) return;
    if (c.transport == kEmu) {
      AddNetworkRows(c, p, d.all, &network_rows);
      ASSERT_EQ(CheckNetworkRows(c, grp, network_rows), "")
          << "call " << call << ", seed " << d.seed;
    }

    // Combine: each rank's partials of the rows it received.
    std::vector<mep_ht_combine_args_t> ca(R);
    for (int r = 0; r < R; ++r) ca[r] = CombineArgs(c, d, r, da[r], io[r], &call_dev);
    ASSERT_EQ(world->Settle(), "");
    ASSERT_EQ(world->LaunchAll([&](int r, cudaStream_t s) {
      return mep_ht_combine(&io[r].ctx, &ca[r], s);
    }),
              "")
        << "call " << call;
    ASSERT_EQ(world->Sync(), "") << "combine, call " << call;
    ASSERT_EQ(world->Records(), "")
        << "combine, call " << call << ", seed " << d.seed;
    for (int r = 0; r < R; ++r)
      EXPECT_EQ(CheckCombine(c, p, d, r, io[r], &order_matters), "")
          << "rank " << r << ", call " << call << ", seed " << d.seed;
    if (HasFailure()) return;
    if (p.node_ranks > 1 && p.node_ranks < R) {
      ASSERT_EQ(CheckRelayedCombineRows(c, grp, network_rows), "")
          << "call " << call << ", seed " << d.seed;
    }
  }
  // (Routing every token to one rank, or top-1, leaves one row per token:
  // no order.)
  if (p.node_ranks > 1 && p.node_ranks < R && c.gen != o::Generator::kAllToOneRank &&
      c.top_k > 1) {
    EXPECT_GT(order_matters, 0)
        << "no combined value depends on summing per node: the case cannot "
           "tell the orders apart";
  }
}

// A rank that never launches: every other rank's dispatch gives up within
// the timeout with a fatal record naming that rank (and itself), instead
// of hanging; the kernels end and the streams drain. Over NVLink, and over
// GIN-emulated as two nodes of two, where the absent rank is the relay of
// rank 0 and a direct peer of rank 3.
class HtWorldFailure : public ::testing::TestWithParam<int> {
 protected:
  static constexpr int kAbsent = 2;
  // The case's group (waits bounded by timeout_ms) with every rank but
  // kAbsent's dispatch launched.
  void LaunchWithoutOne(int timeout_ms) {
    const int node_ranks = GetParam();
    c_ = {"ep4_absent",
          4,
          node_ranks,
          node_ranks == 0 ? kLsa : kEmu,
          64,
          2048,
          8,
          16,
          o::Generator::kUniform,
          false,
          o::ScaleFormat::kF32,
          8,
          false};
    ASSERT_EQ(MakeGroup(c_, timeout_ms, &grp_), "");
    const o::Problem p = ProblemOf(c_);
    const std::vector<o::RankInputs> all = o::make_all_inputs(p, 7);
    std::vector<mep_ht_dispatch_args_t> da(c_.world);
    for (int r = 0; r < c_.world; ++r) {
      mep_ht_dispatch_args_t &a = da[r];
      a = {};
      a.x = call_dev_.upload(all[r].x);
      a.topk_idx = call_dev_.upload(all[r].topk_idx);
      a.topk_idx_bytes = 8;
      a.num_tokens = all[r].num_tokens;
      a.hidden = c_.hidden;
      a.top_k = c_.top_k;
      a.num_experts = c_.experts;
      a.topk_weights = call_dev_.upload(all[r].topk_weights);
      a.recv_x = grp_.io[r].recv_x;
      a.recv_topk_idx = static_cast<int32_t *>(grp_.io[r].recv_idx);
      a.recv_topk_weights = static_cast<float *>(grp_.io[r].recv_w);
      a.recv_count = grp_.io[r].recv_count;
      a.recv_capacity = static_cast<int64_t>(c_.world) * c_.max_tokens;
      a.num_recv = grp_.io[r].num_recv;
    }
    ASSERT_EQ(grp_.world->Settle(), "");
    ASSERT_EQ(grp_.world->LaunchAll(
                  [&](int r, cudaStream_t s) {
                    return mep_ht_dispatch(&grp_.io[r].ctx, &da[r], s);
                  },
                  kAbsent),
              "");
  }

  Case c_;
  HtGroup grp_;
  Dev call_dev_;
};

TEST_P(HtWorldFailure, AbsentRankIsNamedByEveryWaitingRank) {
  LaunchWithoutOne(300);
  if (HasFatalFailure()) return;
  ASSERT_EQ(grp_.world->Sync(), "");
  for (int r = 0; r < c_.world; ++r) {
    const mep_error_record_t &rec = grp_.world->records(r)[0];
    if (r == kAbsent) {
      EXPECT_EQ(rec.flag, 0) << "rank " << r << " never ran but has a record";
      continue;
    }
    ASSERT_EQ(rec.flag, 2) << "rank " << r << " has no timeout record: "
                           << grp_.world->Records();
    EXPECT_EQ(rec.rank, r) << grp_.world->Records();
    EXPECT_EQ(rec.peer, kAbsent)
        << "rank " << r << ": " << grp_.world->Records();
    EXPECT_EQ(rec.op, MEP_HT_OP_DISPATCH_COUNTS)
        << "rank " << r << ": " << grp_.world->Records();
  }
}

// The abort flag a failed group's teardown raises (mep_ht_raise_abort,
// from a stream of its own while the kernels spin): every waiting rank's
// dispatch ends at its next check, with no record (a wait that ran out its
// 20 s bound would leave one).
TEST_P(HtWorldFailure, RaisedAbortFlagEndsEveryWaitingRank) {
  LaunchWithoutOne(20000);
  if (HasFatalFailure()) return;
  cudaStream_t side = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), cudaSuccess);
  for (int r = 0; r < c_.world; ++r) {
    if (r == kAbsent) continue;
    ASSERT_EQ(cudaStreamQuery(grp_.world->stream(r)), cudaErrorNotReady)
        << "rank " << r << "'s dispatch did not wait for rank " << kAbsent;
    ASSERT_EQ(mep_ht_raise_abort(&grp_.io[r].ctx, side), MEP_KSTATUS_OK)
        << mep_kernels_last_error();
  }
  ASSERT_EQ(grp_.world->Sync(), "");
  cudaStreamDestroy(side);
  EXPECT_EQ(grp_.world->Records(), "") << "a dispatch ran out its bound: the flag did not end it";
}

INSTANTIATE_TEST_SUITE_P(LsaAndNodesOfTwo, HtWorldFailure,
                         ::testing::Values(0, 2),
                         [](const ::testing::TestParamInfo<int> &i) {
                           return i.param == 0 ? std::string("lsa")
                                               : std::string("emu_nodes2");
                         });

// Ranks that split their tokens into different numbers of channels
// (set_num_sms called with different values): every rank's dispatch ends
// at once with a record of the mismatch naming a rank of the other count,
// none waits for its timeout. Over NVLink, and over GIN-emulated with a
// node per rank, where a source's count signal counts each call on every
// channel but its count word comes only on the channels it used.
class HtWorldChannels : public ::testing::TestWithParam<int> {};

TEST_P(HtWorldChannels, DifferentChannelCountsAreAMismatch) {
  const int node_ranks = GetParam();
  const Case c = {"ep4_channels",        4,     node_ranks, node_ranks == 0 ? kLsa : kEmu,
                  64,                    2048,  8,          64,
                  o::Generator::kUniform, false, o::ScaleFormat::kF32,
                  16,                    false};
  constexpr int kFewer = 4;  // num_sms of ranks 2 and 3
  HtGroup grp;
  ASSERT_EQ(MakeGroup(c, kTimeoutMs, &grp), "");
  const o::Problem p = ProblemOf(c);
  for (int r = 2; r < c.world; ++r) grp.io[r].ctx.num_sms = kFewer;
  const CallData d = MakeCall(c, p, 0);
  Dev call_dev;
  std::vector<mep_ht_dispatch_args_t> da(c.world);
  for (int r = 0; r < c.world; ++r) da[r] = DispatchArgs(c, p, d, r, grp.io[r], &call_dev);
  ASSERT_EQ(grp.world->Settle(), "");
  ASSERT_EQ(grp.world->LaunchAll([&](int r, cudaStream_t s) {
    return mep_ht_dispatch(&grp.io[r].ctx, &da[r], s);
  }),
            "");
  ASSERT_EQ(grp.world->Sync(), "");
  for (int r = 0; r < c.world; ++r) {
    const mep_error_record_t &rec = grp.world->records(r)[0];
    ASSERT_EQ(rec.flag, 2) << "rank " << r << " has no record: " << grp.world->Records();
    EXPECT_EQ(rec.rank, r) << grp.world->Records();
    EXPECT_TRUE(rec.op == MEP_HT_OP_CHANNELS || rec.op == MEP_HT_OP_CHANNEL_UNSENT)
        << "rank " << r << " recorded op " << rec.op << ", not a channel mismatch: "
        << grp.world->Records();
    EXPECT_NE(rec.peer < 2, r < 2)
        << "rank " << r << " named rank " << rec.peer << ", which uses its channel count: "
        << grp.world->Records();
  }
}

INSTANTIATE_TEST_SUITE_P(LsaAndNodesOfOne, HtWorldChannels, ::testing::Values(0, 1),
                         [](const ::testing::TestParamInfo<int> &i) {
                           return i.param == 0 ? std::string("lsa")
                                               : std::string("emu_nodes1");
                         });

using G = o::Generator;
using S = o::ScaleFormat;
const Case kCases[] = {
    // name, world, node_ranks, transport, experts, hidden, top_k, tokens,
    // generator,
    // fp8, scales, num_sms, pad[, sum_nodes[, later_sms]]
    {"ep4_lsa_bf16_t512", 4, 0, kLsa, 256, 2048, 8, 512, G::kUniform, false, S::kF32, 16, false},
    {"ep4_lsa_fp8_t512_skewed", 4, 0, kLsa, 256, 7168, 8, 512, G::kSkewed, true, S::kF32, 16,
     false},
    {"ep4_lsa_bf16_h2880_k32_empty", 4, 0, kLsa, 128, 2880, 32, 300, G::kEmptyRanks, false, S::kF32,
     8, true},
    {"ep4_lsa_bf16_t1_k1", 4, 0, kLsa, 64, 2048, 1, 1, G::kUniform, false, S::kF32, 16, false},
    {"ep4_emu_nodes1_fp8packed_t512", 4, 1, kEmu, 256, 7168, 8, 512, G::kUniform, true,
     S::kUe8m0Packed, 16, false},
    {"ep4_emu_nodes2_bf16_t7_hot", 4, 2, kEmu, 256, 2048, 6, 7, G::kAllToOneRank, false, S::kF32,
     16, false},
    {"ep4_emu_nodes2_bf16_t700_masked", 4, 2, kEmu, 256, 4096, 8, 700, G::kMasked, false, S::kF32,
     12, true, true},
    {"ep8_lsa_bf16_t512", 8, 0, kLsa, 256, 2048, 8, 512, G::kUniform, false, S::kF32, 8, false},
    {"ep8_lsa_fp8ue8m0_t256_empty", 8, 0, kLsa, 256, 7168, 8, 256, G::kEmptyRanks, true, S::kUe8m0,
     8, false},
    {"ep8_emu_nodes4_bf16_t300", 8, 4, kEmu, 256, 2048, 8, 300, G::kUniform, false, S::kF32, 8,
     false, true},
    {"ep8_emu_nodes2_fp8_t64_skewed", 8, 2, kEmu, 256, 7168, 8, 64, G::kSkewed, true, S::kF32, 8,
     false, true},
    {"ep8_emu_nodes1_bf16_t33_k1", 8, 1, kEmu, 64, 2048, 1, 33, G::kUniform, false, S::kF32, 4,
     false, true},
    // MEP_HT_MAX_RANKS: one warp per peer at both ends of every ring.
    {"ep16_lsa_bf16_t64", 16, 0, kLsa, 256, 2048, 8, 64, G::kUniform, false, S::kF32, 4, false},
    {"ep16_emu_nodes4_fp8_t40_empty", 16, 4, kEmu, 256, 2048, 8, 40, G::kEmptyRanks, true, S::kF32,
     4, true, true},
    // Two nodes of 8: each relay fans a token out to up to 7 other ranks.
    {"ep16_emu_nodes8_bf16_t200", 16, 8, kEmu, 256, 2048, 8, 200, G::kUniform, false, S::kF32, 4,
     false, true},
    // Every token to one rank: one relay forwards everything to it.
    {"ep8_emu_nodes4_fp8_t600_hot", 8, 4, kEmu, 256, 2048, 8, 600, G::kAllToOneRank, true,
     S::kUe8m0, 8, false, true},
    {"ep3_lsa_bf16_t100", 3, 0, kLsa, 48, 2048, 8, 100, G::kUniform, false, S::kF32, 16, false},
    // Node counts that are not powers of two, nodes of 3, top-k 32 and
    // hidden 2880 through relays, top-1 with nodes of 2, one node holding
    // the whole group under the network transport (every route direct),
    // and nodes where some ranks send nothing.
    {"ep6_emu_nodes3_bf16_h2880_k32", 6, 3, kEmu, 96, 2880, 32, 100, G::kUniform, false, S::kF32, 8,
     false, true},
    {"ep6_emu_nodes2_fp8packed_t200_k1", 6, 2, kEmu, 96, 2048, 1, 200, G::kUniform, true,
     S::kUe8m0Packed, 8, false, true},
    {"ep12_emu_nodes4_bf16_t64_empty", 12, 4, kEmu, 192, 2048, 8, 64, G::kEmptyRanks, false,
     S::kF32, 4, true, true},
    {"ep4_emu_one_node_bf16_t128", 4, 4, kEmu, 64, 2048, 8, 128, G::kUniform, false, S::kF32, 16,
     false, true},
    // The channel count changing between calls (set_num_sms): 4 and 16
    // channels over the network, then 12 and 2 through relays.
    {"ep4_emu_nodes1_bf16_t300_sms8_32", 4, 1, kEmu, 256, 2048, 8, 300, G::kUniform, false, S::kF32,
     8, false, false, 32},
    {"ep4_emu_nodes2_fp8_t200_sms24_4", 4, 2, kEmu, 256, 7168, 8, 200, G::kSkewed, true, S::kF32,
     24, false, true, 4},
    // One f32 scale per row: a 7172-byte payload padded to 7184 on the
    // rings, direct and through relays (worst-case rows there).
    {"ep4_lsa_fp8pertoken_t300", 4, 0, kLsa, 256, 7168, 8, 300, G::kUniform, true, S::kPerToken,
     16, false},
    {"ep6_emu_nodes2_fp8pertoken_t100_skewed", 6, 2, kEmu, 96, 2048, 8, 100, G::kSkewed, true,
     S::kPerToken, 8, true, true},
};

INSTANTIATE_TEST_SUITE_P(Cases, HtWorld, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case> &i) {
                           return std::string(i.param.name);
                         });


// Out-of-range topk_idx entries (above num_experts - 1 on one rank, below
// -1 on another, past int32 on a third) are sent as -1 and noted in the
// rank's notice record (MEP_HT_OP_BAD_ROUTING: the value clamped to int32,
// token and slot), nothing aborted: every
// rank's outputs match the oracle's for those entries as -1, bit for bit,
// and the calls before and after leave no record. Over NVLink and over
// GIN-emulated with a node per rank.
class HtWorldRouting : public ::testing::TestWithParam<int> {};

struct BadEntry {
  int rank;
  int64_t value;
  bool last;  // the last routed slot of the rank's call, else the first
  int64_t t = -1, k = -1;
};

TEST_P(HtWorldRouting, OutOfRangeIdsGoAsMinusOneAndAreNoted) {
  const int node_ranks = GetParam();
  const Case c{"routing", 3, node_ranks, node_ranks == 0 ? kLsa : kEmu, 48, 1024, 4, 16,
               o::Generator::kUniform, false, o::ScaleFormat::kF32, 8, false};
  const o::Problem p = ProblemOf(c);
  HtGroup grp;
  ASSERT_EQ(MakeGroup(c, kTimeoutMs, &grp), "");
  for (int call = 0; call < 3; ++call) {
    CallData d = MakeCall(c, p, call);
    std::vector<BadEntry> bad;
    if (call == 1)
      bad = {{0, (int64_t{1} << 32) + 3, false}, {1, c.experts + 5, false}, {2, -7, true}};
    for (BadEntry &b : bad) {
      const std::vector<int64_t> &ids = d.all[b.rank].topk_idx;
      for (size_t i = 0; i < ids.size(); ++i) {
        const size_t at = b.last ? ids.size() - 1 - i : i;
        if (ids[at] >= 0) {
          b.t = static_cast<int64_t>(at) / c.top_k;
          b.k = static_cast<int64_t>(at) % c.top_k;
          break;
        }
      }
      ASSERT_GE(b.t, 0) << "rank " << b.rank << " routes nothing in call " << call;
      d.all[b.rank].topk_idx[b.t * c.top_k + b.k] = -1;  // what the kernels must make of it
    }
    for (int r = 0; r < c.world && !bad.empty(); ++r) {
      d.want[r] = o::ht_dispatch_expected(p, d.all, r);
      d.ys[r] = o::ht_wide_partials(d.want[r].num_recv, c.hidden, d.seed * 31 + r);
    }
    Dev call_dev;
    std::vector<mep_ht_dispatch_args_t> da(c.world);
    for (int r = 0; r < c.world; ++r) da[r] = DispatchArgs(c, p, d, r, grp.io[r], &call_dev);
    for (const BadEntry &b : bad) {
      int64_t *slot = static_cast<int64_t *>(const_cast<void *>(da[b.rank].topk_idx)) +
                      b.t * c.top_k + b.k;
      ASSERT_EQ(cudaMemcpy(slot, &b.value, sizeof(b.value), cudaMemcpyHostToDevice), cudaSuccess);
    }
    ASSERT_EQ(grp.world->Settle(), "");
    ASSERT_EQ(grp.world->LaunchAll([&](int r, cudaStream_t s) {
      return mep_ht_dispatch(&grp.io[r].ctx, &da[r], s);
    }),
              "");
    ASSERT_EQ(grp.world->Sync(), "") << "dispatch, call " << call;
    for (int r = 0; r < c.world; ++r) {
      const mep_error_record_t &fatal = grp.world->records(r)[0];
      EXPECT_EQ(fatal.flag, 0) << "rank " << r << ", call " << call << ": "
                               << grp.world->Records();
      mep_error_record_t &notice = grp.world->records(r)[1];
      const BadEntry *want = nullptr;
      for (const BadEntry &b : bad)
        if (b.rank == r) want = &b;
      if (want == nullptr) {
        EXPECT_EQ(notice.flag, 0) << "rank " << r << ", call " << call << ": "
                                  << grp.world->Records();
        continue;
      }
      ASSERT_EQ(notice.flag, 2) << "rank " << r << " noted nothing for topk_idx[" << want->t
                                << "][" << want->k << "] = " << want->value;
      EXPECT_EQ(notice.op, MEP_HT_OP_BAD_ROUTING);
      EXPECT_EQ(notice.rank, r);
      EXPECT_EQ(notice.expert, want->value > INT32_MAX ? INT32_MAX : static_cast<int>(want->value));
      EXPECT_EQ(notice.expected, static_cast<uint64_t>(want->t));
      EXPECT_EQ(notice.seen, static_cast<uint64_t>(want->k));
      notice.flag = 0;  // as the runtime's report clears it
    }
    for (int r = 0; r < c.world; ++r)
      EXPECT_EQ(CheckDispatch(c, d, r, grp.io[r]), "")
          << "rank " << r << ", call " << call << ", seed " << d.seed;
    if (HasFailure()) return;
    std::vector<mep_ht_combine_args_t> ca(c.world);
    for (int r = 0; r < c.world; ++r) ca[r] = CombineArgs(c, d, r, da[r], grp.io[r], &call_dev);
    ASSERT_EQ(grp.world->Settle(), "");
    ASSERT_EQ(grp.world->LaunchAll([&](int r, cudaStream_t s) {
      return mep_ht_combine(&grp.io[r].ctx, &ca[r], s);
    }),
              "");
    ASSERT_EQ(grp.world->Sync(), "") << "combine, call " << call;
    ASSERT_EQ(grp.world->Records(), "") << "combine, call " << call;
    int64_t order_matters = 0;
    for (int r = 0; r < c.world; ++r)
      EXPECT_EQ(CheckCombine(c, p, d, r, grp.io[r], &order_matters), "")
          << "rank " << r << ", call " << call << ", seed " << d.seed;
    if (HasFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(LsaAndNodesOfOne, HtWorldRouting, ::testing::Values(0, 1),
                         [](const ::testing::TestParamInfo<int> &i) {
                           return std::string(i.param == 0 ? "lsa" : "emu_nodes1");
                         });

}  // namespace
