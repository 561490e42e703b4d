// ll_world_order_test.cc: ranks that combine two pending dispatches in
// different orders. Two ranks on one GPU (one_gpu_world.h) dispatch A on
// set 0 and B on set 1, as the runtime gives them sets (operations 0 and
// 1), combined at operations 2 (set 0) and 3 (set 1). In the same order on
// both ranks, both combines match the oracle bit for bit. Then A' and B'
// (operations 4 and 5), and rank 0 combines A' on set 0 while rank 1
// combines B' there: each rank must record that the peer's combine answers
// another dispatch (MEP_LL_OP_COMBINE_OTHER_DISPATCH, naming the peer and
// both dispatches: their list tag and set) and leave its output
// unwritten rather than sum the other call's rows. LSA with flagged
// partials (16 tokens) and line partials (32), and GIN-emulated (staged
// count signals); weights at dispatch, and at combine (over LSA pushed to
// the expert ranks, whose send half waits for them: the mismatch must be
// found there too, not after timeouts.kernel_ms); fused and separate
// halves.
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
using mep_world::Call;
using mep_world::CheckCombine;
using mep_world::CheckReceiveMakeY;
using mep_world::Dev;
using mep_world::Download;
using mep_world::MakeCall;
using mep_world::RankBufs;

constexpr int kR = 2, kExperts = 16, kHidden = 2048, kTopK = 8;
constexpr int kTimeoutMs = 20000;
// What the crossed combines' outputs hold before: no combine writes it.
constexpr uint16_t kUnwritten = 0x7fc1;  // a bf16 NaN no sum produces

struct OrderCase {
  int transport;
  int tokens;  // per rank (uniform routing): 16 flagged over LSA, 32 lines
  bool weights_at_dispatch;
  bool split;  // send halves, then receive halves, as separate kernels
};

class LlWorldOrder : public ::testing::TestWithParam<OrderCase> {
 protected:
  void SetUp() override {
    p_.world = kR;
    p_.num_experts = kExperts;
    p_.hidden = kHidden;
    p_.top_k = kTopK;
    p_.max_tokens_per_rank = GetParam().tokens;
    p_.generator = o::Generator::kUniform;
    p_.dispatch_dtype = o::DispatchDtype::kBf16;
    const int transport = GetParam().transport;
    const mep_ll_dims_t dims = mep_world::DimsFor(p_, transport);
    std::string err;
    world_ = mep_world::World::Create(kR, mep_ll_buffer_bytes(&dims), &err);
    ASSERT_NE(world_, nullptr) << err;
    int device = 0, sms = 0;
    CUDA_OK(cudaGetDevice(&device));
    CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    ASSERT_EQ(mep_ll_load(), MEP_KSTATUS_OK) << mep_kernels_last_error();
    ASSERT_EQ(mep_world::MakeRanks(*world_, dims, transport,
                                   std::max(1, std::min(32, sms / kR)), kTimeoutMs,
                                   &dev_, &rb_a_),
              "");
    // B's handle storage and buffers beside A's, on the same contexts.
    rb_b_ = rb_a_;
    for (int r = 0; r < kR; ++r)
      ASSERT_TRUE(mep_world::AllocCallBuffers(dims, &dev_, &rb_b_[r])) << "rank " << r;
  }

  // Every rank dispatches c (fused), then checks its receive and makes y.
  void Dispatch(Call *c, const std::vector<RankBufs> &rb, uint64_t seed) {
    ASSERT_EQ(world_->Settle(), "");
    ASSERT_EQ(world_->LaunchAll([&](int r, cudaStream_t s) {
      return mep_ll_dispatch(&rb[r].ctx, &c->da[r], s);
    }),
              "");
    ASSERT_EQ(world_->Sync(), "");
    ASSERT_EQ(world_->Records(), "") << "dispatch, seed " << seed;
    for (int r = 0; r < kR; ++r) {
      CheckReceiveMakeY(p_, c->all, r, rb[r],
                        "rank " + std::to_string(r) + ", seed " + std::to_string(seed) + ": ",
                        &c->y[r], &c->y_of_slot);
      if (HasFatalFailure()) return;
    }
  }

  // Every rank's combine of args(r) on ctx(r): fused, or (split) every
  // send half, then every receive half. "" or the first refusal.
  template <typename Ctx, typename Args>
  std::string Combine(Ctx ctx, Args args) {
    if (!GetParam().split)
      return world_->LaunchAll(
          [&](int r, cudaStream_t s) { return mep_ll_combine(ctx(r), args(r), s); });
    const std::string sent = world_->LaunchAll(
        [&](int r, cudaStream_t s) { return mep_ll_combine_send(ctx(r), args(r), s); });
    if (!sent.empty()) return sent;
    return world_->LaunchAll(
        [&](int r, cudaStream_t s) { return mep_ll_combine_recv(ctx(r), args(r), s); });
  }

  o::Problem p_;
  std::unique_ptr<mep_world::World> world_;
  Dev dev_;
  std::vector<RankBufs> rb_a_, rb_b_;
};

TEST_P(LlWorldOrder, CombinesOfAnotherDispatchAreRefused) {
  const uint64_t seed_a = 31, seed_b = 32, seed_a2 = 33, seed_b2 = 34;
  // Round 1: same order on both ranks.
  Call a, b;
  const bool at_dispatch = GetParam().weights_at_dispatch;
  MakeCall(p_, seed_a, 0, 0, rb_a_, &dev_, &a, at_dispatch);
  MakeCall(p_, seed_b, 1, 1, rb_b_, &dev_, &b, at_dispatch);
  Dispatch(&a, rb_a_, seed_a);
  if (HasFatalFailure()) return;
  Dispatch(&b, rb_b_, seed_b);
  if (HasFatalFailure()) return;
  for (Call *c : {&a, &b}) {
    const std::vector<RankBufs> &rb = c == &a ? rb_a_ : rb_b_;
    ASSERT_EQ(world_->Settle(), "");  // y's uploads
    ASSERT_EQ(Combine([&](int r) { return &rb[r].ctx; }, [&](int r) { return &c->ca[r]; }), "");
    ASSERT_EQ(world_->Sync(), "");
    ASSERT_EQ(world_->Records(), "") << "combine in the same order";
    CheckCombine(p_, *c, rb, c == &a ? seed_a : seed_b);
  }

  // Round 2: rank 0 combines A' first, rank 1 B'.
  Call a2, b2;
  MakeCall(p_, seed_a2, 0, 0, rb_a_, &dev_, &a2, at_dispatch);
  MakeCall(p_, seed_b2, 1, 0, rb_b_, &dev_, &b2, at_dispatch);
  Dispatch(&a2, rb_a_, seed_a2);
  if (HasFatalFailure()) return;
  Dispatch(&b2, rb_b_, seed_b2);
  if (HasFatalFailure()) return;
  const std::vector<const Call *> first = {&a2, &b2};
  const std::vector<const std::vector<RankBufs> *> first_rb = {&rb_a_, &rb_b_};
  const size_t out_elems = static_cast<size_t>(GetParam().tokens) * kHidden;
  const std::vector<uint16_t> unwritten(out_elems, kUnwritten);
  for (int r = 0; r < kR; ++r)
    CUDA_OK(cudaMemcpy((*first_rb[r])[r].out, unwritten.data(), out_elems * 2,
                       cudaMemcpyHostToDevice));
  ASSERT_EQ(world_->Settle(), "");
  ASSERT_EQ(Combine([&](int r) { return &(*first_rb[r])[r].ctx; },
                    [&](int r) { return &first[r]->ca[r]; }),
            "");
  ASSERT_EQ(world_->Sync(), "") << "the crossed combines must end on their own";
  // Each set's second dispatch (list tag 2): A' on set 0, B' on set 1.
  const uint32_t tags[kR] = {mep_ll_disp_ident(2, 0), mep_ll_disp_ident(2, 1)};
  for (int r = 0; r < kR; ++r) {
    const mep_error_record_t &rec = world_->records(r)[0];
    const int peer = 1 - r;
    EXPECT_EQ(rec.flag, 2) << "rank " << r << ": no record; " << world_->Records();
    EXPECT_EQ(rec.op, MEP_LL_OP_COMBINE_OTHER_DISPATCH) << "rank " << r << ": "
                                                        << world_->Records();
    EXPECT_EQ(rec.peer, peer) << "rank " << r;
    EXPECT_EQ(rec.expected, tags[r]) << "rank " << r;
    EXPECT_EQ(rec.seen, tags[peer]) << "rank " << r;
    const auto got = Download<uint16_t>((*first_rb[r])[r].out, out_elems);
    for (size_t i = 0; i < out_elems; ++i) {
      if (got[i] != kUnwritten) {
        ADD_FAILURE() << "rank " << r << ": combine output written at " << i << ": expected "
                      << kUnwritten << " (untouched), got " << got[i];
        break;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Transports, LlWorldOrder,
    ::testing::Values(OrderCase{MEP_LL_TRANSPORT_LSA, 16, true, false},
                      OrderCase{MEP_LL_TRANSPORT_LSA, 32, true, false},
                      OrderCase{MEP_LL_TRANSPORT_GIN_EMULATED, 16, true, false},
                      OrderCase{MEP_LL_TRANSPORT_LSA, 16, false, false},
                      OrderCase{MEP_LL_TRANSPORT_LSA, 32, false, true},
                      OrderCase{MEP_LL_TRANSPORT_LSA, 16, true, true},
                      OrderCase{MEP_LL_TRANSPORT_GIN_EMULATED, 16, false, true}),
    [](const ::testing::TestParamInfo<OrderCase> &i) {
      return std::string(i.param.transport == MEP_LL_TRANSPORT_LSA ? "lsa" : "gin_emulated") +
             "_" + std::to_string(i.param.tokens) + "_tokens" +
             (i.param.weights_at_dispatch ? "" : "_weights_at_combine") +
             (i.param.split ? "_split" : "");
    });

}  // namespace
