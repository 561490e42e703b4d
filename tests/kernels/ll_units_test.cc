// ll_units_test.cc: the LSA dispatch send's unit order (kernels/ll/ll_units.h)
// covers every unit of a pass exactly once, keeps the expert lists
// block-major on the first blocks, and puts the units after them on
// distinct blocks while there are blocks left; and that a receive block's
// deal of its experts' slot copies gives each warp floor or ceil of
// slots / warps rows, every slot to one warp.
#include "kernels/ll/ll_units.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace {

constexpr int kWarps = 16;  // MEP_LL_THREADS / 32

struct Place {
  int block = -1, warp = -1;
};

// Unit index -> (block, warp) for one pass of the grid.
std::vector<Place> places(int lists, int grid) {
  std::vector<Place> at(grid * kWarps);
  for (int b = 0; b < grid; ++b)
    for (int w = 0; w < kWarps; ++w) {
      const int u = mep_ll_send_first_unit(lists, b, w, grid, kWarps);
      EXPECT_TRUE(u >= 0 && u < grid * kWarps)
          << "lists " << lists << " grid " << grid << ": block " << b << " warp " << w
          << " takes unit " << u << ", outside 0.." << grid * kWarps - 1;
      if (u < 0 || u >= grid * kWarps) continue;
      EXPECT_EQ(at[u].block, -1) << "lists " << lists << " grid " << grid << ": unit " << u
                                 << " taken by block " << at[u].block << " warp "
                                 << at[u].warp << " and by block " << b << " warp " << w;
      at[u] = {b, w};
    }
  return at;
}

TEST(LlUnits, EveryUnitOfAPassOnce) {
  for (int lists : {1, 8, 15, 16, 17, 64, 128, 256, 1000, 1024, 2048})
    for (int grid = 1; grid <= 132; ++grid) {
      const std::vector<Place> at = places(lists, grid);
      for (size_t u = 0; u < at.size(); ++u)
        ASSERT_NE(at[u].block, -1) << "lists " << lists << " grid " << grid << ": unit " << u
                                   << " is taken by no warp";
    }
}

TEST(LlUnits, ListsBlockMajorThenOnePerBlock) {
  for (int lists : {1, 16, 100, 256, 1024})
    for (int grid : {24, 64, 100, 132}) {
      const std::vector<Place> at = places(lists, grid);
      const int list_blocks = (lists + kWarps - 1) / kWarps;
      for (int u = 0; u < lists && u < grid * kWarps; ++u) {
        EXPECT_EQ(at[u].block, u / kWarps) << "lists " << lists << " grid " << grid << ": list "
                                           << u << " on block " << at[u].block;
        EXPECT_EQ(at[u].warp, u % kWarps);
      }
      if (grid <= list_blocks) continue;  // no block left: block-major throughout
      const int rest = grid - list_blocks;
      for (int j = 0; j < rest; ++j) {  // the first units after the lists' blocks
        const Place p = at[list_blocks * kWarps + j];
        EXPECT_EQ(p.block, list_blocks + j) << "lists " << lists << " grid " << grid
                                            << ": unit " << list_blocks * kWarps + j;
        EXPECT_EQ(p.warp, 0);
      }
    }
}

// Slot counts of a block's experts: one slot each (many experts, few
// tokens), uneven, empty experts between full ones, and a single expert.
TEST(LlUnits, ReceiveDealIsRoundRobinOverTheBlocksSlots) {
  const std::vector<std::vector<int>> cases = {
      {1, 1, 1, 1, 1, 1, 1, 1}, {3, 0, 17, 5, 0, 0, 33, 1, 2}, {0, 0, 0}, {40}, {16, 16, 16},
      {15, 1, 15, 1, 15, 1}, std::vector<int>(64, 1), {100, 0, 7}};
  for (const std::vector<int> &filled : cases) {
    int total = 0;
    for (int f : filled) total += f;
    std::vector<int> copies(kWarps, 0);
    std::vector<int> owner(total, -1);
    for (int w = 0; w < kWarps; ++w) {
      int dealt = 0;
      for (size_t e = 0; e < filled.size(); ++e) {
        const int j0 = mep_ll_deal_first_slot(w, dealt, kWarps);
        ASSERT_TRUE(j0 >= 0 && j0 < kWarps) << "expert " << e << " warp " << w << ": first " << j0;
        for (int j = j0; j < filled[e]; j += kWarps) {
          const int flat = dealt + j;
          EXPECT_EQ(owner[flat], -1) << "expert " << e << " slot " << j << " dealt to warp "
                                     << owner[flat] << " and warp " << w;
          EXPECT_EQ(flat % kWarps, w) << "expert " << e << " slot " << j;
          owner[flat] = w;
          ++copies[w];
        }
        dealt += filled[e];
      }
    }
    for (int i = 0; i < total; ++i)
      EXPECT_NE(owner[i], -1) << "slot " << i << " of " << total << " dealt to no warp";
    const auto [lo, hi] = std::minmax_element(copies.begin(), copies.end());
    EXPECT_LE(*hi - *lo, 1) << total << " slots over " << filled.size() << " experts: warps copy "
                            << *lo << " to " << *hi << " rows";
  }
}

}  // namespace
