// ht_refusal_test.cc: the sentences of an HT dispatch whose peers' rows are
// laid out otherwise name both ranks and both calls' hidden, top_k and row
// format, with the status that says whether the group survives.
#include <string>

#include "gtest/gtest.h"

extern "C" {
#include "kernels/ht/ht_layout.h"
#include "runtime/error.h"
#include "runtime/nccl/ht_refusal.h"
}

namespace {

void ExpectHas(const std::string &msg, const std::string &part) {
  EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' not in: " << msg;
}

TEST(HtRefusal, DescriptionsReadAsTheCallsWereMade) {
  char text[96];
  mep_ht_desc_text(mep_ht_row_desc(7168, 8, 0, 0), text, sizeof text);
  EXPECT_EQ(std::string(text), "hidden=7168, top_k=8, bf16 rows");
  mep_ht_desc_text(mep_ht_row_desc(7168, 8, 1, 56), text, sizeof text);
  EXPECT_EQ(std::string(text), "hidden=7168, top_k=8, fp8 rows with 56 scale words");
  mep_ht_desc_text(mep_ht_row_desc(2048, 32, 1, 4), text, sizeof text);
  EXPECT_EQ(std::string(text), "hidden=2048, top_k=32, fp8 rows with 4 scale words");
}

TEST(HtRefusal, RefusedDispatchNamesBothRanksAndKeepsTheGroup) {
  const uint32_t theirs = mep_ht_row_desc(4096, 8, 0, 0);
  const uint32_t mine = mep_ht_row_desc(7168, 8, 1, 14);
  EXPECT_EQ(mep_ht_refused_error(3, mep_ht_refused_recv(5, theirs), mine),
            MOE_EP_ERR_INVALID_ARGUMENT);
  const std::string msg = mep_last_error();
  ExpectHas(msg, "dispatch on rank 3: rank 5 made this call with hidden=4096, top_k=8, bf16 "
                 "rows, this rank with hidden=7168, top_k=8, fp8 rows with 14 scale words");
  ExpectHas(msg, "the group stays usable");
  ExpectHas(msg, "skip this layer call's combine");
}

TEST(HtRefusal, WorstCaseDispatchFailsTheGroup) {
  EXPECT_EQ(mep_ht_row_desc_fatal(0, 1, mep_ht_row_desc(7168, 8, 0, 0),
                                  mep_ht_row_desc(7168, 6, 0, 0)),
            MOE_EP_ERR_MISMATCH);
  const std::string msg = mep_last_error();
  ExpectHas(msg, "on rank 0 found that rank 1 made this call with hidden=7168, top_k=6, bf16 "
                 "rows, this rank with hidden=7168, top_k=8, bf16 rows");
  ExpectHas(msg, "MOE_EP_FLAG_WORST_CASE");
  ExpectHas(msg, "destroy the group");
}

}  // namespace
