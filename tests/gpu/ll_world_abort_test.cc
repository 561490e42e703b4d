// ll_world_abort_test.cc: the teardown of a failed group raises its
// kernels' abort flag (mep_ll_raise_abort) so that a kernel still waiting
// for a peer ends at its next check. Two ranks on one GPU
// (one_gpu_world.h): rank 0 dispatches, rank 1 never does, so rank 0's
// receive waits for it under a 20 s bound; the flag, raised from a stream
// of its own while the kernel spins, must end it with no record (an
// aborted wait records nothing; one that ran out its bound would record a
// DISPATCH_RECV timeout). Then the same for the combine's receive, which
// waits for rank 1's combine. LSA and GIN-emulated.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/ll/ll.h"
#include "tests/gpu/cuda_ok.h"
#include "tests/gpu/ll_world_check.h"
#include "tests/gpu/one_gpu_world.h"
#include "tests/oracle/oracle.h"

namespace {

namespace o = moe_ep_oracle;

constexpr int kR = 2, kExperts = 16, kHidden = 2048, kTopK = 8, kTokens = 16;
constexpr int kTimeoutMs = 20000;

// Raises rank 0's flag from a non-blocking stream of its own, while its
// kernel spins on s0, then waits for s0: "" or CUDA's sentence.
std::string RaiseAndWait(const mep_ll_ctx_t &ctx, cudaStream_t s0) {
  cudaStream_t side = nullptr;
  if (cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking) != cudaSuccess)
    return "cudaStreamCreateWithFlags failed";
  if (mep_ll_raise_abort(&ctx, side) != MEP_KSTATUS_OK) return mep_kernels_last_error();
  const cudaError_t e = cudaStreamSynchronize(s0);
  cudaStreamDestroy(side);
  return e == cudaSuccess ? "" : cudaGetErrorString(e);
}

class LlWorldAbort : public ::testing::TestWithParam<int> {};

TEST_P(LlWorldAbort, RaisedFlagEndsAWaitingReceive) {
  const int transport = GetParam();
  o::Problem p;
  p.world = kR;
  p.num_experts = kExperts;
  p.hidden = kHidden;
  p.top_k = kTopK;
  p.max_tokens_per_rank = kTokens;
  p.generator = o::Generator::kUniform;
  const mep_ll_dims_t dims = mep_world::DimsFor(p, transport);
  std::string err;
  auto world = mep_world::World::Create(kR, mep_ll_buffer_bytes(&dims), &err);
  ASSERT_NE(world, nullptr) << err;
  ASSERT_EQ(mep_ll_load(), MEP_KSTATUS_OK) << mep_kernels_last_error();
  mep_world::Dev dev;
  std::vector<mep_world::RankBufs> rb;
  ASSERT_EQ(mep_world::MakeRanks(*world, dims, transport, 8, kTimeoutMs, &dev, &rb), "");
  mep_world::Call c;
  mep_world::MakeCall(p, 41, 0, 1, rb, &dev, &c);
  const cudaStream_t s0 = world->stream(0);
  ASSERT_EQ(world->Settle(), "");
  // The dispatch: rank 0 alone.
  ASSERT_EQ(mep_ll_dispatch(&rb[0].ctx, &c.da[0], s0), MEP_KSTATUS_OK)
      << mep_kernels_last_error();
  ASSERT_EQ(cudaStreamQuery(s0), cudaErrorNotReady) << "rank 0's receive did not wait for rank 1";
  ASSERT_EQ(RaiseAndWait(rb[0].ctx, s0), "");
  EXPECT_EQ(world->Records(), "") << "the dispatch receive ran out its bound: the flag did "
                                     "not end it";
  // Once cleared, the same for a combine receive: rank 1 dispatches, both
  // receive, rank 0 alone combines.
  ASSERT_EQ(mep_ll_clear_abort(&rb[0].ctx, s0), MEP_KSTATUS_OK) << mep_kernels_last_error();
  ASSERT_EQ(world->ZeroWindows(), "");
  mep_world::Call d;
  mep_world::MakeCall(p, 42, 1, 0, rb, &dev, &d);
  ASSERT_EQ(world->Settle(), "");
  ASSERT_EQ(world->LaunchAll([&](int r, cudaStream_t s) {
    return mep_ll_dispatch(&rb[r].ctx, &d.da[r], s);
  }),
            "");
  ASSERT_EQ(world->Sync(), "");
  ASSERT_EQ(world->Records(), "");
  ASSERT_EQ(mep_ll_combine(&rb[0].ctx, &d.ca[0], s0), MEP_KSTATUS_OK)
      << mep_kernels_last_error();
  ASSERT_EQ(cudaStreamQuery(s0), cudaErrorNotReady) << "rank 0's combine did not wait for rank 1";
  ASSERT_EQ(RaiseAndWait(rb[0].ctx, s0), "");
  EXPECT_EQ(world->Records(), "") << "the combine receive ran out its bound: the flag did not "
                                     "end it";
}

INSTANTIATE_TEST_SUITE_P(Transports, LlWorldAbort,
                         ::testing::Values(MEP_LL_TRANSPORT_LSA, MEP_LL_TRANSPORT_GIN_EMULATED),
                         [](const ::testing::TestParamInfo<int> &i) {
                           return std::string(i.param == MEP_LL_TRANSPORT_LSA ? "lsa"
                                                                              : "gin_emulated");
                         });

}  // namespace
