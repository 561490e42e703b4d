// ht_world_overlap_test.cc: the HT kernels on one GPU (one_gpu_world.h) with
// calls free-running across ranks, as separate processes run them: every
// rank enqueues all of its dispatches and combines at once, each call
// behind a host-side delay that differs by rank and call, so one rank
// starts its next dispatch while others are still in the previous
// dispatch or combine, and a relay receives one call's combine rows while
// it still forwards another's. Each call writes outputs of its own;
// every rank's dispatch outputs and combined rows of every call are
// compared bit for bit with the oracle at the end, and the rows put over
// the network are counted as in ht_world_test.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
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

// Two rounds over both buffer sets and both count-word parities.
constexpr int kCalls = 4;
constexpr int kTimeoutMs = 20000;

// A stream-ordered pause of the host callback's milliseconds: the rank's
// next kernel starts only after it.
void CUDART_CB SleepMs(void *ms) {
  std::this_thread::sleep_for(
      std::chrono::milliseconds(reinterpret_cast<intptr_t>(ms)));
}

// Rank r's delay before call k: a different order of ranks each call.
intptr_t DelayMs(int r, int k, int world) {
  return static_cast<intptr_t>((3 * r + 5 * k) % (2 * world));
}

class HtWorldOverlap : public ::testing::TestWithParam<Case> {};

TEST_P(HtWorldOverlap, FreeRunningCallsMatchOracle) {
  const Case &c = GetParam();
  const o::Problem p = ProblemOf(c);
  const int R = c.world;
  HtGroup grp;
  ASSERT_EQ(MakeGroup(c, kTimeoutMs, &grp), "");
  const auto &world = grp.world;

  Dev dev;
  std::vector<CallData> calls;
  std::vector<std::vector<RankIo>> io(kCalls, std::vector<RankIo>(R));
  std::vector<std::vector<mep_ht_dispatch_args_t>> da(
      kCalls, std::vector<mep_ht_dispatch_args_t>(R));
  std::vector<std::vector<mep_ht_combine_args_t>> ca(
      kCalls, std::vector<mep_ht_combine_args_t>(R));
  for (int k = 0; k < kCalls; ++k) {
    calls.push_back(MakeCall(c, p, k));
    for (int r = 0; r < R; ++r) {
      io[k][r].ctx = grp.io[r].ctx;
      ASSERT_EQ(AllocOutputs(c, &dev, &io[k][r]), "") << "call " << k;
      da[k][r] = DispatchArgs(c, p, calls[k], r, io[k][r], &dev);
      ca[k][r] = CombineArgs(c, calls[k], r, da[k][r], io[k][r], &dev);
    }
  }
  ASSERT_EQ(world->Settle(), "");
  for (int k = 0; k < kCalls; ++k) {
    for (int r = 0; r < R; ++r) {
      const cudaError_t e = cudaLaunchHostFunc(
          world->stream(r), SleepMs, reinterpret_cast<void *>(DelayMs(r, k, R)));
      ASSERT_EQ(e, cudaSuccess) << "cudaLaunchHostFunc: " << cudaGetErrorString(e);
    }
    ASSERT_EQ(world->LaunchAll([&](int r, cudaStream_t s) {
      return mep_ht_dispatch(&grp.io[r].ctx, &da[k][r], s);
    }),
              "")
        << "dispatch, call " << k;
    ASSERT_EQ(world->LaunchAll([&](int r, cudaStream_t s) {
      return mep_ht_combine(&grp.io[r].ctx, &ca[k][r], s);
    }),
              "")
        << "combine, call " << k;
  }
  ASSERT_EQ(world->Sync(), "");
  ASSERT_EQ(world->Records(), "");

  std::vector<int64_t> network_rows(static_cast<size_t>(R) * R, 0);
  int64_t order_matters = 0;
  for (int k = 0; k < kCalls; ++k) {
    for (int r = 0; r < R; ++r) {
      const std::string where = "rank " + std::to_string(r) + ", call " +
                                std::to_string(k) + ", seed " +
                                std::to_string(calls[k].seed);
      EXPECT_EQ(CheckDispatch(c, calls[k], r, io[k][r]), "") << where;
      EXPECT_EQ(CheckCombine(c, p, calls[k], r, io[k][r], &order_matters), "")
          << where;
    }
    if (c.transport == kEmu) AddNetworkRows(c, p, calls[k].all, &network_rows);
  }
  if (c.transport == kEmu) {
    EXPECT_EQ(CheckNetworkRows(c, grp, network_rows), "");
    if (p.node_ranks > 1 && p.node_ranks < R) {
      EXPECT_EQ(CheckRelayedCombineRows(c, grp, network_rows), "");
    }
  }
}

using G = o::Generator;
using S = o::ScaleFormat;
const Case kCases[] = {
    // name, world, node_ranks, transport, experts, hidden, top_k, tokens,
    // generator, fp8, scales, num_sms, pad[, sum_nodes]
    {"ep4_lsa_bf16_t300", 4, 0, kLsa, 256, 2048, 8, 300, G::kUniform, false,
     S::kF32, 16, false},
    {"ep3_lsa_bf16_t50_masked_pad", 3, 0, kLsa, 48, 2048, 4, 50, G::kMasked,
     false, S::kF32, 16, true},
    {"ep4_emu_nodes2_bf16_t200_sums", 4, 2, kEmu, 256, 2048, 8, 200,
     G::kUniform, false, S::kF32, 16, false, true},
    {"ep8_emu_nodes2_fp8_t100_skewed_sums", 8, 2, kEmu, 256, 7168, 8, 100,
     G::kSkewed, true, S::kF32, 8, false, true},
    // Nodes without node sums: combine rows go straight to each token's rank.
    {"ep8_emu_nodes4_bf16_t64_empty_pad", 8, 4, kEmu, 256, 2048, 8, 64,
     G::kEmptyRanks, false, S::kF32, 8, true},
};

INSTANTIATE_TEST_SUITE_P(Cases, HtWorldOverlap, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case> &i) {
                           return std::string(i.param.name);
                         });

}  // namespace
