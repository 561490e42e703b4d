// shapes_test.cc: the oracle serves every shape the plugin accepts (bf16
// hidden any multiple of 8, fp8 any multiple of 128), and an input it
// cannot serve fails the test with a sentence instead of ending the process.
// The layer calls themselves at such shapes (hidden 2880, 1032, 2056) run
// end to end in ll_test's LlGenerated and ht_test's HtGenerated.
#include <string>

#include <gtest/gtest.h>

#include "tests/oracle/oracle.h"

namespace moe_ep_oracle {
namespace {

Problem with_hidden(int hidden, DispatchDtype dtype = DispatchDtype::kBf16) {
  Problem p;
  p.world = 2;
  p.num_experts = 8;
  p.hidden = hidden;
  p.top_k = 4;
  p.max_tokens_per_rank = 4;
  p.dispatch_dtype = dtype;
  return p;
}

TEST(Shapes, Bf16HiddenIsAnyMultipleOf8) {
  for (int h : {8, 1032, 2056, 2880, 7168, 32768}) EXPECT_EQ(problem_error(with_hidden(h)), "") << h;
  EXPECT_EQ(problem_error(with_hidden(2884)),
            "hidden must be a positive multiple of 8, got hidden = 2884");
  EXPECT_EQ(problem_error(with_hidden(0)), "hidden must be a positive multiple of 8, got hidden = 0");
}

TEST(Shapes, Fp8HiddenIsAMultipleOf128) {
  EXPECT_EQ(problem_error(with_hidden(2048, DispatchDtype::kFp8)), "");
  EXPECT_EQ(problem_error(with_hidden(2880, DispatchDtype::kFp8)),
            "hidden must be a positive multiple of 128 with fp8 dispatch (one scale per 128 "
            "channels), got hidden = 2880");
}

TEST(Shapes, BadProblemThrowsTheSentence) {
  try {
    make_all_inputs(with_hidden(2884), 1);
    FAIL() << "no OracleError";
  } catch (const OracleError& e) {
    EXPECT_EQ(std::string(e.what()),
              "bad Problem: hidden must be a positive multiple of 8, got hidden = 2884");
  }
  EXPECT_THROW(ll_combine_expected(with_hidden(2880, DispatchDtype::kFp8), RankInputs{}),
               OracleError);
}

TEST(Shapes, NonPowerOfTwoScaleThrows) {
  try {
    ue8m0_byte(3.0f);
    FAIL() << "no OracleError";
  } catch (const OracleError& e) {
    EXPECT_NE(std::string(e.what()).find("pow2_scale = 3 is not a power of two"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace moe_ep_oracle
