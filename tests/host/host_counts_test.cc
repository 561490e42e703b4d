// host_counts_test.cc: HT prepare's count table on the host backend
// (runtime/host/host_counts.h). Every rank reads the same allgathered
// table; a refusal names the refusing rank and leaves the group usable, an
// entry outside [0, max_tokens_per_rank] is refused before it is summed
// (a negative or huge count would size the engine's recv_x), and every
// rank names the same source.
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/error.h"
#include "runtime/host/host_counts.h"

namespace moe_ep_test {
namespace {

constexpr int kMax = 64;

std::vector<int32_t> Table(int world, int32_t fill) {
  return std::vector<int32_t>(static_cast<size_t>(world) * world, fill);
}

TEST(HostCounts, SumsTheColumnOfTheReadingRank) {
  const int world = 4;
  std::vector<int32_t> all = Table(world, 0);
  for (int s = 0; s < world; s++) {
    for (int d = 0; d < world; d++) all[s * world + d] = (s * 7 + d * 3) % (kMax + 1);
  }
  all[1 * world + 2] = kMax;  // the bound itself is allowed
  for (int r = 0; r < world; r++) {
    int64_t want = 0;
    for (int s = 0; s < world; s++) want += all[s * world + r];
    int64_t got = -1;
    ASSERT_EQ(mep_host_count_table_read(all.data(), world, r, kMax, &got), MOE_EP_OK)
        << "rank " << r << ": " << mep_last_error();
    EXPECT_EQ(got, want) << "rank " << r;
  }
}

TEST(HostCounts, RefusalNamesTheRefusingRank) {
  const int world = 3;
  std::vector<int32_t> all = Table(world, 1);
  for (int d = 0; d < world; d++) all[2 * world + d] = MEP_HOST_REFUSED_COUNT;
  for (int r = 0; r < world; r++) {
    int64_t got = 123;
    ASSERT_EQ(mep_host_count_table_read(all.data(), world, r, kMax, &got),
              MOE_EP_ERR_INVALID_ARGUMENT) << "rank " << r;
    const std::string msg = mep_last_error();
    EXPECT_NE(msg.find("prepare on rank " + std::to_string(r) + ": rank 2 refused"),
              std::string::npos) << msg;
    EXPECT_EQ(got, 123) << "rank " << r << ": num_recv written on a refusal";
  }
}

struct Bad {
  int src, dst;
  int32_t value;
};

TEST(HostCounts, EntryOutsideTheBoundFailsEveryRankOnTheSameSource) {
  const int world = 4;
  for (const Bad& b : {Bad{1, 3, kMax + 1}, Bad{2, 0, -2}, Bad{0, 1, INT32_MIN},
                       Bad{3, 3, INT32_MAX}, Bad{1, 2, -1}, Bad{2, 0, -1}}) {
    std::vector<int32_t> all = Table(world, 5);
    all[b.src * world + b.dst] = b.value;
    for (int r = 0; r < world; r++) {
      int64_t got = 123;
      ASSERT_EQ(mep_host_count_table_read(all.data(), world, r, kMax, &got),
                MOE_EP_ERR_INTERNAL)
          << "rank " << r << " source " << b.src << " value " << b.value;
      const std::string want = "prepare on rank " + std::to_string(r) + ": rank " +
                               std::to_string(b.src) + " announced " + std::to_string(b.value) +
                               " tokens for rank " + std::to_string(b.dst) +
                               ", outside [0, max_tokens_per_rank=" + std::to_string(kMax) + "]";
      const std::string msg = mep_last_error();
      EXPECT_NE(msg.find(want), std::string::npos) << "want: " << want << "\ngot: " << msg;
      EXPECT_EQ(got, 123) << "rank " << r << ": num_recv written for a corrupt table";
    }
  }
}

// Sources are read in rank order: a refusal before a corrupt row wins, and
// a corrupt row before a refusal wins.
TEST(HostCounts, FirstSourceInRankOrderDecides) {
  const int world = 3;
  std::vector<int32_t> all = Table(world, 2);
  for (int d = 0; d < world; d++) all[0 * world + d] = MEP_HOST_REFUSED_COUNT;
  all[1 * world + 1] = kMax + 9;
  int64_t got = 0;
  EXPECT_EQ(mep_host_count_table_read(all.data(), world, 2, kMax, &got),
            MOE_EP_ERR_INVALID_ARGUMENT);
  for (int d = 0; d < world; d++) all[0 * world + d] = 2;
  for (int d = 0; d < world; d++) all[2 * world + d] = MEP_HOST_REFUSED_COUNT;
  EXPECT_EQ(mep_host_count_table_read(all.data(), world, 0, kMax, &got), MOE_EP_ERR_INTERNAL);
}

}  // namespace
}  // namespace moe_ep_test
