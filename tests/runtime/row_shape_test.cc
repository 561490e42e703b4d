// row_shape_test.cc: the sentences of a dispatch whose peers made the call
// with rows laid out otherwise name both ranks and both calls' hidden,
// top_k and row format, with the status that says whether the group
// survives.
#include <string>

#include "gtest/gtest.h"

extern "C" {
#include "kernels/common/kernels_types.h"
#include "kernels/ht/ht_layout.h"
#include "kernels/common/row_desc.h"
#include "runtime/error.h"
#include "runtime/nccl/row_shape.h"
#include "runtime/row_desc_text.h"
}

namespace {

void ExpectHas(const std::string &msg, const std::string &part) {
  EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' not in: " << msg;
}

TEST(RowShape, HtDescriptionsReadAsTheCallsWereMade) {
  char text[96];
  mep_row_desc_text(mep_row_desc(7168, 8, 0, 0), text, sizeof text);
  EXPECT_EQ(std::string(text), "hidden=7168, top_k=8, bf16 rows");
  mep_row_desc_text(mep_row_desc(7168, 8, 1, MEP_FP8_SCALE_F32), text, sizeof text);
  EXPECT_EQ(std::string(text), "hidden=7168, top_k=8, fp8 rows with f32 scales");
  mep_row_desc_text(mep_row_desc(2048, 32, 1, MEP_FP8_SCALE_UE8M0_PACKED), text, sizeof text);
  EXPECT_EQ(std::string(text), "hidden=2048, top_k=32, fp8 rows with packed UE8M0 scales");
  mep_row_desc_text(mep_row_desc(32768, 32, 1, MEP_FP8_SCALE_PER_TOKEN), text, sizeof text);
  EXPECT_EQ(std::string(text), "hidden=32768, top_k=32, fp8 rows with per-token f32 scales");
}

TEST(RowShape, HtRefusedDispatchNamesBothRanksAndKeepsTheGroup) {
  const uint32_t theirs = mep_row_desc(4096, 8, 0, 0);
  const uint32_t mine = mep_row_desc(7168, 8, 1, MEP_FP8_SCALE_UE8M0_PACKED);
  EXPECT_EQ(mep_ht_refused_error(3, mep_ht_refused_recv(5, theirs), mine),
            MOE_EP_ERR_INVALID_ARGUMENT);
  const std::string msg = mep_last_error();
  ExpectHas(msg, "dispatch on rank 3: rank 5 made this call with hidden=4096, top_k=8, bf16 "
                 "rows, this rank with hidden=7168, top_k=8, fp8 rows with packed UE8M0 scales");
  ExpectHas(msg, "the group stays usable");
  ExpectHas(msg, "skip this layer call's combine");
}

TEST(RowShape, HtWorstCaseDispatchFailsTheGroup) {
  EXPECT_EQ(mep_ht_row_desc_fatal(0, 1, mep_row_desc(7168, 8, 0, 0),
                                  mep_row_desc(7168, 6, 0, 0)),
            MOE_EP_ERR_MISMATCH);
  const std::string msg = mep_last_error();
  ExpectHas(msg, "on rank 0 found that rank 1 made this call with hidden=7168, top_k=6, bf16 "
                 "rows, this rank with hidden=7168, top_k=8, bf16 rows");
  ExpectHas(msg, "MOE_EP_FLAG_WORST_CASE");
  ExpectHas(msg, "destroy the group");
}

TEST(RowShape, LlDescriptionsNameTheScaleFormat) {
  char text[96];
  mep_row_desc_text(mep_row_desc(2880, 8, 0, MEP_FP8_SCALE_UE8M0), text, sizeof text);
  EXPECT_EQ(std::string(text), "hidden=2880, top_k=8, bf16 rows");
  mep_row_desc_text(mep_row_desc(7168, 8, 1, MEP_FP8_SCALE_F32), text, sizeof text);
  EXPECT_EQ(std::string(text), "hidden=7168, top_k=8, fp8 rows with f32 scales");
  mep_row_desc_text(mep_row_desc(7168, 1, 1, MEP_FP8_SCALE_UE8M0), text, sizeof text);
  EXPECT_EQ(std::string(text),
            "hidden=7168, top_k=1, fp8 rows with power-of-two (UE8M0 in f32) scales");
  mep_row_desc_text(mep_row_desc(32768, 32, 1, MEP_FP8_SCALE_UE8M0_PACKED), text, sizeof text);
  EXPECT_EQ(std::string(text), "hidden=32768, top_k=32, fp8 rows with packed UE8M0 scales");
}

TEST(RowShape, LlDifferenceFailsTheGroup) {
  EXPECT_EQ(mep_ll_row_desc_fatal(1, 0, 1, mep_row_desc(7168, 8, 1, MEP_FP8_SCALE_F32),
                                  mep_row_desc(7168, 8, 0, 0)),
            MOE_EP_ERR_MISMATCH);
  const std::string msg = mep_last_error();
  ExpectHas(msg, "a dispatch receive on rank 1 (buffer set 1) found that rank 0 made this call "
                 "with hidden=7168, top_k=8, bf16 rows, this rank with hidden=7168, top_k=8, "
                 "fp8 rows with f32 scales");
  ExpectHas(msg, "destroy the group");
}

}  // namespace
