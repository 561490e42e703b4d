// ll_world_reuse_test.cc: a dispatch that reuses its buffer set while this
// rank's receive of the combine of the set's last dispatch is still to run
// (two-batch overlap's order: dispatch A, combine A, dispatch B, then
// combine A's hook), with a peer that still has to receive dispatch A.
// Two ranks on one GPU (one_gpu_world.h), weights at dispatch (nothing is
// pushed, so no combine wait orders the ranks), LSA and GIN-emulated.
// Rank 0 receives A, sends combine A, then launches
// mep_ll_await_combine and dispatch B's send: they must not end while rank
// 1 has not started combine A, and rank 1's receive of A, made only then,
// must be A's rows bit for bit; then both combines and dispatch B against
// the oracle. In the second order rank 0's receive of combine A runs on
// another stream before the wait starts (its stream held meanwhile), so
// the wait finds the shadows already past combine A and must end all the
// same.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "kernels/ll/ll.h"
#include "tests/gpu/cuda_ok.h"
#include "tests/gpu/ll_world_check.h"
#include "tests/gpu/one_gpu_world.h"
#include "tests/oracle/oracle.h"

namespace {

namespace o = moe_ep_oracle;
using mep_world::Call;
using mep_world::CheckCombine;
using mep_world::CheckReceiveMakeY;
using mep_world::Dev;
using mep_world::MakeCall;
using mep_world::Download;
using mep_world::RankBufs;

constexpr int kR = 2, kExperts = 16, kHidden = 2048, kTopK = 8, kMaxTokens = 16;
constexpr int kTimeoutMs = 20000;
// How long rank 0's dispatch B is given to finish on its own while rank 1
// holds back: it must not (it waits for rank 1's combine A, which has not
// been launched), whatever the machine's load.
constexpr int kHoldMs = 300;

std::string Where(int r, const char *what, uint64_t seed) {
  return "rank " + std::to_string(r) + ", " + what + ", seed " +
         std::to_string(seed) + ": ";
}

struct ReuseCase {
  int transport;
  // Rank 0's receive of combine A, on a stream of its own, runs (and
  // moves the shadows) before the wait starts: the engine ran the hook on
  // another stream while dispatch B's stream was busy.
  bool received_first;
};

// Holds a stream until *release is set (a host function on it).
void CUDART_CB HoldUntil(void *release) {
  while (!__atomic_load_n(static_cast<int *>(release), __ATOMIC_ACQUIRE))
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

class LlWorldReuse : public ::testing::TestWithParam<ReuseCase> {};

TEST_P(LlWorldReuse, DispatchWaitsForThePeersCombineOfTheSetsLastDispatch) {
  const int transport = GetParam().transport;
  const bool received_first = GetParam().received_first;
  o::Problem p;
  p.world = kR;
  p.num_experts = kExperts;
  p.hidden = kHidden;
  p.top_k = kTopK;
  p.max_tokens_per_rank = kMaxTokens;
  p.generator = o::Generator::kUniform;
  p.dispatch_dtype = o::DispatchDtype::kBf16;
  const mep_ll_dims_t dims = mep_world::DimsFor(p, transport);
  std::string err;
  auto world = mep_world::World::Create(kR, mep_ll_buffer_bytes(&dims), &err);
  ASSERT_NE(world, nullptr) << err;
  int device = 0, sms = 0;
  CUDA_OK(cudaGetDevice(&device));
  CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  // Loaded before any launch: a kernel's first load waits for the device,
  // here for rank 0's spinning wait (ll.h, mep_ll_load).
  ASSERT_EQ(mep_ll_load(), MEP_KSTATUS_OK) << mep_kernels_last_error();
  Dev dev;
  std::vector<RankBufs> rb;
  // Room beside both ranks' grids for the wait's block.
  ASSERT_EQ(mep_world::MakeRanks(*world, dims, transport,
                                 std::max(1, std::min(32, sms / (kR + 1))),
                                 kTimeoutMs, &dev, &rb),
            "");
  const uint64_t seed_a = 11, seed_b = 12;
  Call a, b;
  MakeCall(p, seed_a, 0, 1, rb, &dev, &a);
  MakeCall(p, seed_b, 0, 1, rb, &dev, &b);
  const cudaStream_t s0 = world->stream(0), s1 = world->stream(1);

  // Dispatch A's send on both ranks; rank 0 receives it, rank 1 not yet.
  ASSERT_EQ(world->Settle(), "");
  ASSERT_EQ(world->LaunchAll([&](int r, cudaStream_t s) {
    return mep_ll_dispatch_send(&rb[r].ctx, &a.da[r], s);
  }),
            "");
  ASSERT_EQ(mep_ll_dispatch_recv(&rb[0].ctx, &a.da[0], s0), MEP_KSTATUS_OK)
      << mep_kernels_last_error();
  CUDA_OK(cudaStreamSynchronize(s0));
  CheckReceiveMakeY(p, a.all, 0, rb[0], Where(0, "dispatch A", seed_a), &a.y[0],
                    &a.y_of_slot);
  if (HasFatalFailure()) return;
  ASSERT_EQ(world->Settle(), "");  // y's upload before the combine reads it

  // Rank 0: combine A's send, then dispatch B on A's set behind the wait
  // (behind a hold, when its receive of combine A is to come first).
  ASSERT_EQ(mep_ll_combine_send(&rb[0].ctx, &a.ca[0], s0), MEP_KSTATUS_OK)
      << mep_kernels_last_error();
  cudaStream_t s2 = nullptr;
  cudaEvent_t sent_a = nullptr;
  int release = 0;
  if (received_first) {
    CUDA_OK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    CUDA_OK(cudaEventCreateWithFlags(&sent_a, cudaEventDisableTiming));
    CUDA_OK(cudaEventRecord(sent_a, s0));
    CUDA_OK(cudaStreamWaitEvent(s2, sent_a, 0));
    CUDA_OK(cudaLaunchHostFunc(s0, HoldUntil, &release));
  }
  ASSERT_EQ(mep_ll_await_combine(&rb[0].ctx, 1, s0), MEP_KSTATUS_OK)
      << mep_kernels_last_error();
  ASSERT_EQ(mep_ll_dispatch_send(&rb[0].ctx, &b.da[0], s0), MEP_KSTATUS_OK)
      << mep_kernels_last_error();
  std::this_thread::sleep_for(std::chrono::milliseconds(kHoldMs));
  EXPECT_EQ(cudaStreamQuery(s0), cudaErrorNotReady)
      << "rank 0's dispatch B ended before rank 1 started combine A: it did "
         "not wait for rank 1 to receive dispatch A, whose rows it overwrites";

  // Rank 1 receives A only now: A's rows, not B's.
  ASSERT_EQ(mep_ll_dispatch_recv(&rb[1].ctx, &a.da[1], s1), MEP_KSTATUS_OK)
      << mep_kernels_last_error();
  CUDA_OK(cudaStreamSynchronize(s1));
  ASSERT_EQ(world->Records(), "");
  CheckReceiveMakeY(p, a.all, 1, rb[1],
                    Where(1, "dispatch A, received late", seed_a), &a.y[1],
                    &a.y_of_slot);
  if (HasFatalFailure()) return;
  // The upload is on the legacy stream; rank 0's stream is still held or
  // spinning, so not the whole device.
  CUDA_OK(cudaStreamSynchronize(cudaStreamLegacy));
  ASSERT_EQ(mep_ll_combine_send(&rb[1].ctx, &a.ca[1], s1), MEP_KSTATUS_OK)
      << mep_kernels_last_error();
  if (received_first) {
    // Rank 0's receive of combine A ends before its wait starts; the wait
    // then finds the shadows moved past combine A and must end on the
    // receive's epoch word, not wait for a signal no rank sends.
    ASSERT_EQ(mep_ll_combine_recv(&rb[0].ctx, &a.ca[0], s2), MEP_KSTATUS_OK)
        << mep_kernels_last_error();
    CUDA_OK(cudaStreamSynchronize(s2));
    __atomic_store_n(&release, 1, __ATOMIC_RELEASE);
  }
  ASSERT_EQ(world->Sync(), "")
      << "rank 0's wait and dispatch B, rank 1's combine A";
  ASSERT_EQ(world->Records(), "");
  if (received_first) {
    CUDA_OK(cudaEventDestroy(sent_a));
    CUDA_OK(cudaStreamDestroy(s2));
  }

  // Both receive combine A (rank 0 did already when it came first), then
  // rank 1 sends dispatch B (its combine A was received: nothing to wait
  // for) and both receive it.
  ASSERT_EQ(world->LaunchAll(
                [&](int r, cudaStream_t s) {
                  return mep_ll_combine_recv(&rb[r].ctx, &a.ca[r], s);
                },
                received_first ? 0 : -1),
            "");
  ASSERT_EQ(world->Sync(), "");
  ASSERT_EQ(world->Records(), "");
  CheckCombine(p, a, rb, seed_a);
  ASSERT_EQ(mep_ll_dispatch_send(&rb[1].ctx, &b.da[1], s1), MEP_KSTATUS_OK)
      << mep_kernels_last_error();
  ASSERT_EQ(world->LaunchAll([&](int r, cudaStream_t s) {
    return mep_ll_dispatch_recv(&rb[r].ctx, &b.da[r], s);
  }),
            "");
  ASSERT_EQ(world->Sync(), "");
  ASSERT_EQ(world->Records(), "");
  for (int r = 0; r < kR; ++r) {
    CheckReceiveMakeY(p, b.all, r, rb[r], Where(r, "dispatch B", seed_b),
                      &b.y[r], &b.y_of_slot);
    if (HasFatalFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Orders, LlWorldReuse,
    ::testing::Values(ReuseCase{MEP_LL_TRANSPORT_LSA, false},
                      ReuseCase{MEP_LL_TRANSPORT_GIN_EMULATED, false},
                      ReuseCase{MEP_LL_TRANSPORT_LSA, true},
                      ReuseCase{MEP_LL_TRANSPORT_GIN_EMULATED, true}),
    [](const ::testing::TestParamInfo<ReuseCase> &i) {
      return std::string(i.param.transport == MEP_LL_TRANSPORT_LSA
                             ? "lsa"
                             : "gin_emulated") +
             (i.param.received_first ? "_combine_received_first" : "");
    });

}  // namespace
