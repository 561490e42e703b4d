// layout_book_test.cc: the nccl backend's record of which dispatch's layout
// each buffer set holds. A refused dispatch launch must not take over the
// set, so the handle dispatched before it still combines; an accepted one
// must, so the older handle is refused with a sentence naming both.
#include <string>

#include "gtest/gtest.h"

extern "C" {
#include "runtime/error.h"
#include "runtime/nccl/layout_book.h"
}

namespace {

constexpr int32_t kRank = 3;

TEST(LayoutBook, RefusedDispatchKeepsTheOlderHandleValid) {
  mep_layout_book_t book{};
  ASSERT_EQ(mep_layout_book_record(&book, 0, 4, MOE_EP_OK), MOE_EP_OK);
  // The launch of dispatch 5 on the same set is refused: its status comes
  // back unchanged and dispatch 4's handle still combines.
  EXPECT_EQ(mep_layout_book_record(&book, 0, 5, MOE_EP_ERR_INVALID_ARGUMENT),
            MOE_EP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(mep_layout_book_check(&book, "combine", kRank, 0, 4), MOE_EP_OK) << mep_last_error();
  EXPECT_EQ(mep_layout_book_record(&book, 0, 5, MOE_EP_ERR_CUDA), MOE_EP_ERR_CUDA);
  EXPECT_EQ(mep_layout_book_check(&book, "combine", kRank, 0, 4), MOE_EP_OK) << mep_last_error();
  EXPECT_EQ(mep_layout_book_check(&book, "combine", kRank, 0, 5), MOE_EP_ERR_INVALID_ARGUMENT);
}

TEST(LayoutBook, AcceptedDispatchOverwritesOnlyItsSet) {
  mep_layout_book_t book{};
  ASSERT_EQ(mep_layout_book_record(&book, 0, 0, MOE_EP_OK), MOE_EP_OK);
  ASSERT_EQ(mep_layout_book_record(&book, 1, 1, MOE_EP_OK), MOE_EP_OK);
  ASSERT_EQ(mep_layout_book_record(&book, 0, 2, MOE_EP_OK), MOE_EP_OK);
  EXPECT_EQ(mep_layout_book_check(&book, "combine", kRank, 1, 1), MOE_EP_OK) << mep_last_error();
  EXPECT_EQ(mep_layout_book_check(&book, "combine", kRank, 0, 2), MOE_EP_OK) << mep_last_error();
  ASSERT_EQ(mep_layout_book_check(&book, "combine", kRank, 0, 0), MOE_EP_ERR_INVALID_ARGUMENT);
  const std::string msg = mep_last_error();
  EXPECT_NE(msg.find("combine on rank 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("operation 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("buffer set 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("operation 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("until the next dispatch when a combine comes between"), std::string::npos)
      << msg;
}

TEST(LayoutBook, EmptySetAndBadSetAreRefused) {
  mep_layout_book_t book{};
  // Operation 0 on a zeroed book: "nothing held" must not read as "held 0".
  EXPECT_EQ(mep_layout_book_check(&book, "combine", kRank, 0, 0), MOE_EP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(mep_last_error()).find("holds no dispatch layout"), std::string::npos)
      << mep_last_error();
  EXPECT_EQ(mep_layout_book_record(&book, MEP_NUM_BUFFER_SETS, 7, MOE_EP_OK), MOE_EP_OK);
  EXPECT_EQ(mep_layout_book_check(&book, "combine", kRank, MEP_NUM_BUFFER_SETS, 7), MOE_EP_ERR_INTERNAL);
  EXPECT_EQ(mep_layout_book_check(&book, "combine", kRank, -1, 7), MOE_EP_ERR_INTERNAL);
}

}  // namespace
