// prepare_layout_gpu_test.cc: the GPU layout kernel behind the nccl backend's
// prepare (mep_prepare_layout), one process on one GPU (no NCCL), against
// the oracle's prepare_expected: oracle routings with int32 and int64 ids,
// top-k that does and does not divide a warp, more experts than one shared
// pass holds, 1024 ranks, zero tokens, each output alone, out-of-range and
// repeated ids, an unaligned is_token_in_rank, and a CUDA graph replay.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <climits>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/common/kernels_error.h"
#include "kernels/common/prepare_layout.h"
#include "tests/gpu/cuda_ok.h"
#include "tests/oracle/compare.h"
#include "tests/oracle/inputs.h"
#include "tests/oracle/prepare.h"

namespace {

using namespace moe_ep_oracle;

enum : unsigned { kPerRank = 1, kPerExpert = 2, kInRank = 4, kAll = 7 };
constexpr size_t kGuard = 64;  // poisoned bytes after each output: an overrun lands there
constexpr uint8_t kPoison = 0xEE;

// One call's device buffers; is_token_in_rank starts `offset` bytes into its
// allocation so the kernel's aligned stores meet an unaligned start.
struct Call {
  const Problem& p;
  int T, idx_bytes;
  unsigned outputs;
  size_t offset;
  void *topk = nullptr, *rank = nullptr, *expert = nullptr, *in_rank = nullptr;
  size_t rank_bytes, expert_bytes, in_rank_bytes;

  Call(const Problem& prob, int tokens, int bytes, unsigned outs, size_t off)
      : p(prob), T(tokens), idx_bytes(bytes), outputs(outs), offset(off),
        rank_bytes(prob.world * 4u), expert_bytes(prob.num_experts * 4u),
        in_rank_bytes(static_cast<size_t>(tokens) * prob.world) {}
  ~Call() {
    for (void* b : {topk, rank, expert, in_rank}) cudaFree(b);
  }
  void alloc() {
    if (T > 0) CUDA_OK(cudaMalloc(&topk, static_cast<size_t>(T) * p.top_k * idx_bytes));
    CUDA_OK(cudaMalloc(&rank, rank_bytes + kGuard));
    CUDA_OK(cudaMalloc(&expert, expert_bytes + kGuard));
    CUDA_OK(cudaMalloc(&in_rank, offset + in_rank_bytes + kGuard));
  }
  void upload(const std::vector<int64_t>& ids) {
    if (T == 0) return;
    if (idx_bytes == 8) {
      CUDA_OK(cudaMemcpy(topk, ids.data(), ids.size() * 8, cudaMemcpyHostToDevice));
    } else {
      std::vector<int32_t> v(ids.begin(), ids.end());  // out-of-range int64 values wrap
      CUDA_OK(cudaMemcpy(topk, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
    }
  }
  void poison() {
    CUDA_OK(cudaMemset(rank, kPoison, rank_bytes + kGuard));
    CUDA_OK(cudaMemset(expert, kPoison, expert_bytes + kGuard));
    CUDA_OK(cudaMemset(in_rank, kPoison, offset + in_rank_bytes + kGuard));
  }
  mep_prepare_layout_args_t args() const {
    mep_prepare_layout_args_t a = {};
    a.topk_idx = topk;
    a.topk_idx_bytes = idx_bytes;
    a.num_tokens = T;
    a.top_k = p.top_k;
    a.num_experts = p.num_experts;
    a.world = p.world;
    a.num_tokens_per_rank = (outputs & kPerRank) ? static_cast<int32_t*>(rank) : nullptr;
    a.num_tokens_per_expert = (outputs & kPerExpert) ? static_cast<int32_t*>(expert) : nullptr;
    a.is_token_in_rank =
        (outputs & kInRank) ? static_cast<uint8_t*>(in_rank) + offset : nullptr;
    return a;
  }
};

std::vector<uint8_t> download(const void* d, size_t n) {
  std::vector<uint8_t> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), d, n, cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

// "" when every byte of [b, e) is the poison (nothing was written there).
std::string untouched(const std::vector<uint8_t>& h, size_t b, size_t e, const char* what) {
  for (size_t i = b; i < e; ++i) {
    if (h[i] != kPoison) {
      return std::string(what) + ": byte " + std::to_string(i) + " outside the output was written";
    }
  }
  return "";
}

// The outputs of a finished call against the oracle; ids outside -1..E-1
// count as -1 (dispatch drops them).
void expect_matches(const Call& c, const std::vector<int64_t>& ids, const std::string& what) {
  RankInputs in;
  in.num_tokens = c.T;
  in.topk_idx = ids;
  for (int64_t& e : in.topk_idx) {
    if (c.idx_bytes == 4) e = static_cast<int32_t>(e);  // what the kernel read
    if (e < -1 || e >= c.p.num_experts) e = -1;
  }
  PrepareExpected want = prepare_expected(c.p, in);
  std::vector<uint8_t> rank = download(c.rank, c.rank_bytes + kGuard);
  std::vector<uint8_t> expert = download(c.expert, c.expert_bytes + kGuard);
  std::vector<uint8_t> in_rank = download(c.in_rank, c.offset + c.in_rank_bytes + kGuard);
  const int R = c.p.world, E = c.p.num_experts;
  if (c.outputs & kPerRank) {
    std::vector<int32_t> got(R);
    std::memcpy(got.data(), rank.data(), c.rank_bytes);
    EXPECT_EQ(compare_exact_i32("num_tokens_per_rank", got.data(), want.num_tokens_per_rank.data(),
                                R, R), "") << what;
    EXPECT_EQ(untouched(rank, c.rank_bytes, rank.size(), "num_tokens_per_rank"), "") << what;
  } else {
    EXPECT_EQ(untouched(rank, 0, rank.size(), "num_tokens_per_rank (NULL)"), "") << what;
  }
  if (c.outputs & kPerExpert) {
    std::vector<int32_t> got(E);
    std::memcpy(got.data(), expert.data(), c.expert_bytes);
    EXPECT_EQ(compare_exact_i32("num_tokens_per_expert", got.data(),
                                want.num_tokens_per_expert.data(), E, E), "") << what;
    EXPECT_EQ(untouched(expert, c.expert_bytes, expert.size(), "num_tokens_per_expert"), "")
        << what;
  } else {
    EXPECT_EQ(untouched(expert, 0, expert.size(), "num_tokens_per_expert (NULL)"), "") << what;
  }
  if (c.outputs & kInRank) {
    EXPECT_EQ(compare_exact_u8("is_token_in_rank", in_rank.data() + c.offset,
                               want.is_token_in_rank.data(), c.in_rank_bytes, R), "") << what;
    EXPECT_EQ(untouched(in_rank, 0, c.offset, "is_token_in_rank (before)"), "") << what;
    EXPECT_EQ(untouched(in_rank, c.offset + c.in_rank_bytes, in_rank.size(),
                        "is_token_in_rank (after)"), "") << what;
  } else {
    EXPECT_EQ(untouched(in_rank, 0, in_rank.size(), "is_token_in_rank (NULL)"), "") << what;
  }
}

// One eager call: upload, poison, launch on the default stream, compare.
void run(const Problem& p, const std::vector<int64_t>& ids, int T, int idx_bytes,
         unsigned outputs, size_t offset, const std::string& what) {
  Call c(p, T, idx_bytes, outputs, offset);
  c.alloc();
  c.upload(ids);
  c.poison();
  mep_prepare_layout_args_t a = c.args();
  ASSERT_EQ(mep_prepare_layout(&a, nullptr), MEP_KSTATUS_OK) << what << ": " << mep_kernels_last_error();
  CUDA_OK(cudaDeviceSynchronize());
  expect_matches(c, ids, what);
}

Problem problem(int world, int experts, int top_k, int max_tokens, Generator g) {
  Problem p;
  p.world = world;
  p.num_experts = experts;
  p.hidden = 128;
  p.top_k = top_k;
  p.max_tokens_per_rank = max_tokens;
  p.generator = g;
  return p;
}

class PrepareLayoutGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    ASSERT_EQ(cudaGetDeviceCount(&n), cudaSuccess) << "this suite needs a CUDA device";
    ASSERT_GT(n, 0) << "this suite needs a CUDA device";
  }
};

TEST_F(PrepareLayoutGpu, OracleRoutings) {
  struct Shape { int world, experts, top_k, max_tokens; };
  // top-k 8 (4 tokens per warp step), 9 and 5 (lanes left over), 1, 32 (one
  // token per step); up to 1024 tokens (an LL maximum).
  const Shape shapes[] = {{1, 8, 2, 64},    {2, 256, 8, 128}, {8, 64, 9, 100},
                          {4, 16, 1, 1024}, {64, 256, 32, 33}, {3, 96, 5, 1024}};
  const Generator gens[] = {Generator::kUniform, Generator::kSkewed, Generator::kAllToOneRank,
                            Generator::kEmptyRanks, Generator::kMasked};
  for (const Shape& s : shapes) {
    for (Generator g : gens) {
      Problem p = problem(s.world, s.experts, s.top_k, s.max_tokens, g);
      for (uint64_t seed = 1; seed <= 2; ++seed) {
        const int rank = static_cast<int>(seed % s.world);
        RankInputs in = make_inputs(p, rank, seed);
        const int bytes = seed % 2 == 1 ? 4 : 8;
        const std::string what = "world " + std::to_string(s.world) + " experts " +
                                 std::to_string(s.experts) + " top_k " + std::to_string(s.top_k) +
                                 " " + generator_name(g) + " rank " + std::to_string(rank) +
                                 " seed " + std::to_string(seed) + " int" +
                                 std::to_string(bytes * 8);
        run(p, in.topk_idx, in.num_tokens, bytes, kAll, seed % 16, what);
      }
    }
  }
}

TEST_F(PrepareLayoutGpu, ZeroTokensZeroTheCounts) {
  Problem p = problem(4, 32, 4, 8, Generator::kUniform);
  for (int bytes : {4, 8}) run(p, {}, 0, bytes, kAll, 0, "zero tokens");
}

TEST_F(PrepareLayoutGpu, EachOutputAloneOrNone) {
  Problem p = problem(4, 64, 6, 50, Generator::kMasked);
  RankInputs in = make_inputs(p, 1, 7);
  for (unsigned outs = 0; outs <= kAll; ++outs) {
    run(p, in.topk_idx, in.num_tokens, 8, outs, 3, "outputs mask " + std::to_string(outs));
  }
}

TEST_F(PrepareLayoutGpu, OutOfRangeIdsCountAsNone) {
  Problem p = problem(2, 8, 3, 4, Generator::kUniform);
  // experts 0..3 on rank 0, 4..7 on rank 1
  const std::vector<int64_t> ids = {1, 13, 5,  /**/ -7, -1, 2,  /**/ 8, 6, -2,
                                    /**/ INT64_MAX, INT64_MIN, 0x100000003ll};
  run(p, ids, 4, 8, kAll, 0, "int64 out of range");
  run(p, ids, 4, 4, kAll, 0, "int32 out of range (0x100000003 reads as 3)");
}

TEST_F(PrepareLayoutGpu, RepeatedExpertCountsEverySlotButOneRank) {
  // The host backend refuses a repeat at prepare; the GPU cannot look without
  // a sync, so it counts like the oracle: every (token, k) slot per expert,
  // each rank once per token.
  Problem p = problem(2, 8, 4, 2, Generator::kUniform);
  const std::vector<int64_t> ids = {5, 5, 4, -1, /**/ 0, 0, 0, 7};
  run(p, ids, 2, 8, kAll, 0, "repeated experts");
}

TEST_F(PrepareLayoutGpu, MoreExpertsThanOneSharedPass) {
  // 8192 per-expert counters fit one pass: 20000 experts take three, the last
  // partial; 65536 (the limit) eight.
  for (int experts : {20000, 65536}) {
    Problem p = problem(16, experts, 8, 512, Generator::kUniform);
    RankInputs in = make_inputs(p, 3, 11);
    run(p, in.topk_idx, in.num_tokens, 4, kAll, 5, "experts " + std::to_string(experts));
  }
}

TEST_F(PrepareLayoutGpu, ThousandRanks) {
  Problem p = problem(1024, 2048, 8, 1024, Generator::kUniform);
  RankInputs in = make_inputs(p, 1000, 5);
  run(p, in.topk_idx, in.num_tokens, 8, kAll, 1, "1024 ranks");
}

TEST_F(PrepareLayoutGpu, GraphReplayRecomputes) {
  Problem p = problem(4, 64, 8, 128, Generator::kSkewed);
  RankInputs first = make_inputs(p, 0, 21);
  Call c(p, first.num_tokens, 8, kAll, 0);
  c.alloc();
  c.upload(first.topk_idx);
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  mep_prepare_layout_args_t a = c.args();
  const mep_kstatus_t st = mep_prepare_layout(&a, s);
  CUDA_OK(cudaStreamEndCapture(s, &graph));
  ASSERT_EQ(st, MEP_KSTATUS_OK) << mep_kernels_last_error();
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (uint64_t seed = 22; seed < 26; ++seed) {
    RankInputs in = make_inputs(p, 0, seed);  // kSkewed: same token count
    c.upload(in.topk_idx);
    c.poison();
    CUDA_OK(cudaDeviceSynchronize());  // s does not wait for the legacy stream
    CUDA_OK(cudaGraphLaunch(exec, s));
    CUDA_OK(cudaStreamSynchronize(s));
    expect_matches(c, in.topk_idx, "graph replay seed " + std::to_string(seed));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}

}  // namespace
