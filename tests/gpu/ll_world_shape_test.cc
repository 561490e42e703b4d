// ll_world_shape_test.cc: two LL ranks on one GPU (one_gpu_world.h) that
// make one dispatch with rows laid out differently: another hidden, top_k,
// bf16 against fp8, or another fp8 scale format. Every receive reads its
// sources' rows and slot words with its own call's layout, so each rank
// must record the difference (MEP_LL_OP_ROW_DESC naming the peer, with
// both calls' row descriptions) before it reads any of them, and end at
// once rather than after timeouts.kernel_ms. Over LSA (list heads read
// while the rows are in flight) and GIN-emulated (heads read after the
// count signal), fused and as separate send and receive kernels.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "kernels/common/kernels_types.h"
#include "kernels/ll/ll.h"
#include "kernels/ll/ll_layout.h"
#include "tests/gpu/cuda_ok.h"
#include "tests/gpu/ll_world_check.h"
#include "tests/gpu/one_gpu_world.h"
#include "tests/oracle/oracle.h"

namespace {

namespace o = moe_ep_oracle;
using mep_world::Call;
using mep_world::Dev;
using mep_world::MakeCall;
using mep_world::RankBufs;

constexpr int kR = 2, kExperts = 16, kHidden = 2048, kTopK = 8, kTokens = 16;
// Far beyond what a recorded difference takes: a receive that waited
// instead would show in the elapsed time and in its record's op.
constexpr int kTimeoutMs = 20000;

enum class Differs { kHidden, kTopK, kFp8, kScaleFormat };

struct ShapeCase {
  const char *name;
  int transport;
  Differs differs;
  bool split;  // send halves, then receive halves, as separate kernels
};

class LlWorldShape : public ::testing::TestWithParam<ShapeCase> {};

TEST_P(LlWorldShape, DifferingRowsAreRecordedByBothRanks) {
  const ShapeCase &sc = GetParam();
  o::Problem p;
  p.world = kR;
  p.num_experts = kExperts;
  p.hidden = kHidden;
  p.top_k = kTopK;
  p.max_tokens_per_rank = kTokens;
  p.generator = o::Generator::kUniform;
  p.dispatch_dtype = o::DispatchDtype::kBf16;
  const mep_ll_dims_t dims = mep_world::DimsFor(p, sc.transport);
  std::string err;
  auto world = mep_world::World::Create(kR, mep_ll_buffer_bytes(&dims), &err);
  ASSERT_NE(world, nullptr) << err;
  int device = 0, sms = 0;
  CUDA_OK(cudaGetDevice(&device));
  CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  ASSERT_EQ(mep_ll_load(), MEP_KSTATUS_OK) << mep_kernels_last_error();
  Dev dev;
  std::vector<RankBufs> rb;
  ASSERT_EQ(mep_world::MakeRanks(*world, dims, sc.transport, std::max(1, std::min(32, sms / kR)),
                                 kTimeoutMs, &dev, &rb),
            "");
  Call c;
  MakeCall(p, 41, 0, 0, rb, &dev, &c);
  mep_ll_dispatch_args_t &odd = c.da[1];
  switch (sc.differs) {
    case Differs::kHidden:
      odd.hidden = kHidden / 2;
      break;
    case Differs::kTopK:  // topk_idx read at another stride: ids stay valid
      odd.top_k = kTopK - 2;
      break;
    case Differs::kFp8:
      odd.fp8 = 1;
      odd.scale_mode = MEP_FP8_SCALE_F32;
      break;
    case Differs::kScaleFormat:
      c.da[0].fp8 = odd.fp8 = 1;
      c.da[0].scale_mode = MEP_FP8_SCALE_UE8M0;
      odd.scale_mode = MEP_FP8_SCALE_UE8M0_PACKED;
      break;
  }
  ASSERT_EQ(world->Settle(), "");
  const auto start = std::chrono::steady_clock::now();
  if (sc.split) {
    ASSERT_EQ(world->LaunchAll([&](int r, cudaStream_t s) {
      return mep_ll_dispatch_send(&rb[r].ctx, &c.da[r], s);
    }),
              "");
    ASSERT_EQ(world->LaunchAll([&](int r, cudaStream_t s) {
      return mep_ll_dispatch_recv(&rb[r].ctx, &c.da[r], s);
    }),
              "");
  } else {
    ASSERT_EQ(world->LaunchAll([&](int r, cudaStream_t s) {
      return mep_ll_dispatch(&rb[r].ctx, &c.da[r], s);
    }),
              "");
  }
  ASSERT_EQ(world->Sync(), "");
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(secs, kTimeoutMs / 2000.0) << "the receives waited instead of refusing";
  for (int r = 0; r < kR; ++r) {
    const mep_ll_dispatch_args_t &a = c.da[r], &b = c.da[1 - r];
    const mep_error_record_t &rec = world->records(r)[0];
    ASSERT_EQ(rec.flag, 2) << "rank " << r << ": no record; " << world->Records();
    EXPECT_EQ(rec.op, MEP_LL_OP_ROW_DESC) << "rank " << r << ": " << world->Records();
    EXPECT_EQ(rec.peer, 1 - r) << "rank " << r;
    EXPECT_EQ(rec.expected, mep_row_desc(a.hidden, a.top_k, a.fp8, a.scale_mode))
        << "rank " << r << ": its own call's description";
    EXPECT_EQ(rec.seen, mep_row_desc(b.hidden, b.top_k, b.fp8, b.scale_mode))
        << "rank " << r << ": the peer's description";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Calls, LlWorldShape,
    ::testing::Values(ShapeCase{"lsa_hidden", MEP_LL_TRANSPORT_LSA, Differs::kHidden, false},
                      ShapeCase{"lsa_top_k_split", MEP_LL_TRANSPORT_LSA, Differs::kTopK, true},
                      ShapeCase{"lsa_fp8", MEP_LL_TRANSPORT_LSA, Differs::kFp8, false},
                      ShapeCase{"lsa_scale_format_split", MEP_LL_TRANSPORT_LSA,
                                Differs::kScaleFormat, true},
                      ShapeCase{"gin_emulated_hidden", MEP_LL_TRANSPORT_GIN_EMULATED,
                                Differs::kHidden, false},
                      ShapeCase{"gin_emulated_fp8_split", MEP_LL_TRANSPORT_GIN_EMULATED,
                                Differs::kFp8, true},
                      ShapeCase{"gin_emulated_top_k", MEP_LL_TRANSPORT_GIN_EMULATED,
                                Differs::kTopK, false}),
    [](const ::testing::TestParamInfo<ShapeCase> &i) { return std::string(i.param.name); });

}  // namespace
