// demo_verify_test.cc: the demo engine checks its combines with its own
// small reference (integration/demo_verify.c), not the oracle; here the two
// must agree: transported rows and expert rows bit for bit, and the combine
// check must accept the oracle's expected output and name the first element
// of a wrong one.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "integration/demo_verify.h"
#include "tests/oracle/oracle.h"

namespace {

namespace oracle = moe_ep_oracle;

oracle::Problem ProblemFor(bool fp8) {
  oracle::Problem p;
  p.world = 2;
  p.num_experts = 16;
  p.hidden = 512;
  p.top_k = 4;
  p.max_tokens_per_rank = 32;
  p.generator = oracle::Generator::kMasked;
  p.dispatch_dtype = fp8 ? oracle::DispatchDtype::kFp8 : oracle::DispatchDtype::kBf16;
  return p;
}

TEST(DemoVerify, TransportAndExpertMatchTheOracleExactly) {
  for (int fp8 = 0; fp8 <= 1; fp8++) {
    for (uint64_t seed = 1; seed <= 3; seed++) {
      const oracle::Problem p = ProblemFor(fp8);
      const oracle::RankInputs in = oracle::make_inputs(p, 1, seed);
      std::vector<float> got(p.hidden), want(p.hidden);
      std::vector<uint16_t> yg(p.hidden), yw(p.hidden);
      for (int t = 0; t < in.num_tokens; t++) {
        const uint16_t *x = &in.x[(size_t)t * p.hidden];
        demo_transported_row(x, p.hidden, fp8, got.data());
        oracle::transported_row(p, x, want.data());
        ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
            << "rank 1 seed " << seed << " fp8 " << fp8 << " token " << t;
        demo_expert_row(5, got.data(), p.hidden, yg.data());
        oracle::expert_fn_row(5, want.data(), p.hidden, yw.data());
        ASSERT_EQ(oracle::compare_exact_u16("expert row", yg.data(), yw.data(), p.hidden, p.hidden),
                  "")
            << "rank 1 seed " << seed << " fp8 " << fp8 << " token " << t;
      }
    }
  }
}

TEST(DemoVerify, CombineCheckAcceptsTheOracleAndNamesTheFirstBadElement) {
  for (int fp8 = 0; fp8 <= 1; fp8++) {
    const uint64_t seed = 7;
    const oracle::Problem p = ProblemFor(fp8);
    const oracle::RankInputs in = oracle::make_inputs(p, 0, seed);
    std::vector<uint16_t> out = oracle::ll_combine_expected(p, in);
    char why[512] = "";
    EXPECT_EQ(1, demo_verify_combine(0, p.hidden, p.top_k, p.num_experts / p.world, fp8, in.num_tokens, in.x.data(),
                                     in.topk_idx.data(), in.topk_weights.data(), out.data(), why,
                                     sizeof why))
        << "rank 0 seed " << seed << " fp8 " << fp8 << ": " << why;
    // The check is bit-exact: one bf16 ulp off is a failure.
    const size_t bad = (size_t)3 * p.hidden + 17;
    out[bad] ^= 1u;
    EXPECT_EQ(0, demo_verify_combine(0, p.hidden, p.top_k, p.num_experts / p.world, fp8, in.num_tokens, in.x.data(),
                                     in.topk_idx.data(), in.topk_weights.data(), out.data(), why,
                                     sizeof why));
    EXPECT_NE(std::string(why).find("rank 0: combine out[3][17]"), std::string::npos) << why;
  }
}

}  // namespace
