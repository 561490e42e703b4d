// error_test.cc: every failure sentence an entry returns names a rank
// (mep_error_name_rank): one that names none gets this rank's; one that
// already names a rank, the failing one or the one it blames, is left as is.
#include <string>

#include "gtest/gtest.h"

extern "C" {
#include "runtime/error.h"
}

namespace {

std::string Named(const char *sentence, int rank) {
  mep_error(MOE_EP_ERR_INVALID_ARGUMENT, "%s", sentence);
  mep_error_name_rank(rank);
  return mep_last_error();
}

TEST(ErrorTest, SentenceWithoutARankGetsThisRanks) {
  EXPECT_EQ(Named("prepare: params->top_k=9 must be in [1, config top_k=8]", 3),
            "rank 3: prepare: params->top_k=9 must be in [1, config top_k=8]");
  // "per-rank" and "ranks" name no rank.
  EXPECT_EQ(Named("prepare: exchanging per-rank token counts: ranks disagree", 0),
            "rank 0: prepare: exchanging per-rank token counts: ranks disagree");
}

TEST(ErrorTest, SentenceNamingARankIsLeftAsIs) {
  EXPECT_EQ(Named("dispatch on rank 2: the stream is capturing", 5),
            "dispatch on rank 2: the stream is capturing");
  EXPECT_EQ(Named("combine: rank 0 lost rank 1: rank 1 left the group", 0),
            "combine: rank 0 lost rank 1: rank 1 left the group");
}

}  // namespace
