// ll_world_test.cc: the LL kernels at 3, 4, 8 and 16 ranks on one GPU
// (one_gpu_world.h), against the oracle: LSA and GIN-emulated, bf16 and fp8
// (f32, UE8M0 and packed UE8M0 scales), weights at combine and at dispatch,
// fused kernels and split send/receive halves, both buffer sets, several
// calls per group. Each rank's received rows, scales, counts and slot
// sources are checked; y is computed from the rows each rank actually
// received, and every combined row must equal the oracle's sum bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/ll/ll.h"
#include "tests/gpu/cuda_ok.h"
#include "tests/gpu/ll_world_check.h"
#include "tests/gpu/one_gpu_world.h"
#include "tests/gpu/scale_mode.h"
#include "tests/oracle/oracle.h"

namespace {

namespace o = moe_ep_oracle;
using mep_world::CheckReceiveMakeY;
using mep_world::Dev;
using mep_world::Download;
using mep_world::RankBufs;

struct Case {
  const char *name;
  int world, transport;
  int experts, hidden, top_k, max_tokens;
  o::Generator gen;
  bool fp8;
  o::ScaleFormat scales;
  bool weighted;  // weights at dispatch (partials), else at combine
  bool split;     // send and receive halves as separate launches
  int idx_bytes;
};

std::ostream &operator<<(std::ostream &os, const Case &c) {
  return os << c.name;
}

constexpr int kLsa = MEP_LL_TRANSPORT_LSA, kEmu = MEP_LL_TRANSPORT_GIN_EMULATED;
constexpr int kCalls = 3;
constexpr int kTimeoutMs = 20000;

class LlWorld : public ::testing::TestWithParam<Case> {};

TEST_P(LlWorld, MatchesOracle) {
  const Case &c = GetParam();
  o::Problem p;
  p.world = c.world;
  p.num_experts = c.experts;
  p.hidden = c.hidden;
  p.top_k = c.top_k;
  p.max_tokens_per_rank = c.max_tokens;
  p.generator = c.gen;
  p.dispatch_dtype = c.fp8 ? o::DispatchDtype::kFp8 : o::DispatchDtype::kBf16;
  p.scale_format = c.scales;
  const int R = c.world, H = c.hidden, K = c.top_k;
  const mep_ll_dims_t dims = mep_world::DimsFor(p, c.transport);
  std::string err;
  auto world = mep_world::World::Create(R, mep_ll_buffer_bytes(&dims), &err);
  ASSERT_NE(world, nullptr) << err;
  int device = 0, sms = 0;
  CUDA_OK(cudaGetDevice(&device));
  CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  /* the ranks share this device, and in one call they may launch
   * different dispatch and combine kernels (ll.h, mep_ll_combine_load) */
  ASSERT_EQ(mep_ll_dispatch_load(), MEP_KSTATUS_OK) << mep_kernels_last_error();
  ASSERT_EQ(mep_ll_combine_load(), MEP_KSTATUS_OK) << mep_kernels_last_error();

  Dev dev;
  std::vector<RankBufs> rb;
  // Every rank's grid resident at once: the fused kernels wait for peers.
  ASSERT_EQ(mep_world::MakeRanks(*world, dims, c.transport,
                                 std::max(1, std::min(32, sms / R)), kTimeoutMs,
                                 &dev, &rb),
            "");

  for (int call = 0; call < kCalls; ++call) {
    const uint64_t seed = 100 * (call + 1) + R;
    const int set = call % 2;
    const std::vector<o::RankInputs> all = o::make_all_inputs(p, seed);
    Dev call_dev;
    std::vector<mep_ll_dispatch_args_t> da(R);
    std::vector<mep_ll_combine_args_t> ca(R);
    for (int r = 0; r < R; ++r) {
      const o::RankInputs &in = all[r];
      const void *topk = nullptr;
      if (c.idx_bytes == 8) {
        topk = call_dev.upload(in.topk_idx);
      } else {
        topk = call_dev.upload(
            std::vector<int32_t>(in.topk_idx.begin(), in.topk_idx.end()));
      }
      const float *w = call_dev.upload(in.topk_weights);
      mep_ll_dispatch_args_t &a = da[r];
      a = {};
      a.x = call_dev.upload(in.x);
      a.topk_idx = topk;
      a.topk_idx_bytes = c.idx_bytes;
      a.num_tokens = in.num_tokens;
      a.hidden = H;
      a.top_k = K;
      a.num_experts = c.experts;
      a.fp8 = c.fp8;
      a.scale_mode = c.fp8 ? mep_world::ScaleMode(c.scales) : 0;
      a.buffer_set = set;
      mep_world::UseBuffers(rb[r], &a);
      a.weighted = c.weighted;
      a.topk_weights = c.weighted ? w : nullptr;
      mep_ll_combine_args_t &b = ca[r];
      b = {};
      mep_world::UseBuffers(rb[r], &b);
      b.topk_idx = topk;
      b.topk_idx_bytes = c.idx_bytes;
      b.topk_weights = c.weighted ? nullptr : w;
      b.num_tokens = in.num_tokens;
      b.hidden = H;
      b.top_k = K;
      b.num_experts = c.experts;
      b.buffer_set = set;
      b.dispatch_set = set;
      b.partials = c.weighted;
    }
    ASSERT_EQ(world->Settle(), "");
    ASSERT_EQ(world->LaunchAll([&](int r, cudaStream_t s) {
      return c.split ? mep_ll_dispatch_send(&rb[r].ctx, &da[r], s)
                     : mep_ll_dispatch(&rb[r].ctx, &da[r], s);
    }),
              "");
    if (c.split) {
      ASSERT_EQ(world->LaunchAll([&](int r, cudaStream_t s) {
        return mep_ll_dispatch_recv(&rb[r].ctx, &da[r], s);
      }),
                "");
    }
    ASSERT_EQ(world->Sync(), "") << "dispatch, call " << call;
    ASSERT_EQ(world->Records(), "")
        << "dispatch, call " << call << ", seed " << seed;

    // Per rank: the receive against the oracle, then y from the rows as
    // received, indexed for the combine oracle by (source, token, k).
    std::vector<std::vector<uint16_t>> y(R);
    std::vector<std::vector<const uint16_t *>> y_of_slot(
        R);  // [source][t * K + k]
    for (int s = 0; s < R; ++s)
      y_of_slot[s].assign(static_cast<size_t>(all[s].num_tokens) * K, nullptr);
    for (int r = 0; r < R; ++r) {
      CheckReceiveMakeY(p, all, r, rb[r],
                        "rank " + std::to_string(r) + ", call " +
                            std::to_string(call) + ", seed " +
                            std::to_string(seed) + ": ",
                        &y[r], &y_of_slot);
      if (HasFatalFailure()) return;
    }

    ASSERT_EQ(world->Settle(), "");
    ASSERT_EQ(world->LaunchAll([&](int r, cudaStream_t s) {
      return c.split ? mep_ll_combine_send(&rb[r].ctx, &ca[r], s)
                     : mep_ll_combine(&rb[r].ctx, &ca[r], s);
    }),
              "");
    if (c.split) {
      ASSERT_EQ(world->LaunchAll([&](int r, cudaStream_t s) {
        return mep_ll_combine_recv(&rb[r].ctx, &ca[r], s);
      }),
                "");
    }
    ASSERT_EQ(world->Sync(), "") << "combine, call " << call;
    ASSERT_EQ(world->Records(), "")
        << "combine, call " << call << ", seed " << seed;
    for (int s = 0; s < R; ++s) {
      const auto &slot_y = y_of_slot[s];
      const std::vector<uint16_t> want = o::ll_combine_reduce(
          p, all[s],
          [&](int t, int k) { return slot_y[static_cast<size_t>(t) * K + k]; });
      const auto got = Download<uint16_t>(rb[s].out, want.size());
      EXPECT_EQ(o::compare_exact_bf16("combine out", got.data(), want.data(),
                                      want.size(), H),
                "")
          << "rank " << s << ", call " << call << ", seed " << seed;
    }
    if (HasFailure()) return;
  }
}

using G = o::Generator;
using S = o::ScaleFormat;
const Case kCases[] = {
    // name, world, transport, experts, hidden, top_k, max_tokens, generator,
    // fp8, scales,
    // weighted, split, idx_bytes
    {"ep4_lsa_fp8_t128", 4, kLsa, 256, 7168, 8, 128, G::kUniform, true, S::kF32,
     false, false, 8},
    {"ep4_lsa_fp8_t128_weighted", 4, kLsa, 256, 7168, 8, 128, G::kUniform, true,
     S::kF32, true, false, 8},
    {"ep4_lsa_bf16_t33_split_masked", 4, kLsa, 64, 2048, 6, 33, G::kMasked,
     false, S::kF32, false, true, 4},
    {"ep4_emu_fp8packed_t64_split_weighted", 4, kEmu, 256, 2048, 8, 64,
     G::kSkewed, true, S::kUe8m0Packed, true, true, 8},
    {"ep4_emu_bf16_t1", 4, kEmu, 32, 2880, 4, 1, G::kUniform, false, S::kF32,
     false, false, 8},
    {"ep8_lsa_fp8ue8m0_t128_empty", 8, kLsa, 256, 7168, 8, 128, G::kEmptyRanks,
     true, S::kUe8m0, false, false, 8},
    {"ep8_lsa_bf16_t64_hot_weighted", 8, kLsa, 256, 4096, 8, 64,
     G::kAllToOneRank, false, S::kF32, true, false, 8},
    {"ep8_emu_fp8_t32_split", 8, kEmu, 256, 7168, 8, 32, G::kUniform, true,
     S::kF32, false, true, 8},
    {"ep8_emu_bf16_t16_k32_weighted", 8, kEmu, 256, 2048, 32, 16, G::kMasked,
     false, S::kF32, true, false, 4},
    {"ep16_lsa_fp8_t32", 16, kLsa, 256, 7168, 8, 32, G::kUniform, true, S::kF32,
     false, false, 8},
    {"ep16_emu_bf16_t8_split_weighted", 16, kEmu, 128, 2048, 8, 8, G::kSkewed,
     false, S::kF32, true, true, 8},
    {"ep3_lsa_bf16_t17", 3, kLsa, 48, 2048, 8, 17, G::kUniform, false, S::kF32,
     false, false, 8},
    // Half the ranks send nothing, the others 1..64 tokens: ranks of one
    // call launch different dispatch kernels (mep_ll_dispatch_load).
    {"ep6_lsa_bf16_t64_uneven", 6, kLsa, 96, 2048, 8, 64, G::kEmptyRanks, false,
     S::kF32, false, false, 8},
};

INSTANTIATE_TEST_SUITE_P(Cases, LlWorld, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case> &i) {
                           return std::string(i.param.name);
                         });

}  // namespace
