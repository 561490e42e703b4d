// registry_test.cc: the live-object registry's answers, and the retirement
// of a freed object's memory that keeps its address from new objects.
#include "runtime/registry.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <set>
#include <vector>

namespace {

TEST(Registry, TakeIsWonOnceAndOwnerAndRankAreRemembered) {
  int group = 0;
  void* obj = std::malloc(64);
  ASSERT_TRUE(mep_registry_add(obj, MEP_OBJ_HOOK, &group, 3));
  void* owner = nullptr;
  int rank = -1;
  EXPECT_TRUE(mep_registry_owner(obj, MEP_OBJ_HOOK, &owner, &rank));
  EXPECT_EQ(owner, &group);
  // The rank outlives the owner: an orphaned entry still names it.
  mep_registry_orphan(&group);
  EXPECT_TRUE(mep_registry_owner(obj, MEP_OBJ_HOOK, &owner, &rank));
  EXPECT_EQ(owner, nullptr);
  EXPECT_EQ(rank, 3);
  EXPECT_FALSE(mep_registry_contains(obj, MEP_OBJ_HANDLE)) << "registered as a hook, not a handle";
  EXPECT_EQ(mep_registry_take(obj, MEP_OBJ_HOOK), 1);
  EXPECT_EQ(mep_registry_take(obj, MEP_OBJ_HOOK), 0) << "a second free must lose";
  EXPECT_FALSE(mep_registry_contains(obj, MEP_OBJ_HOOK));
  mep_registry_retire(obj);
}

// Objects retired after being taken keep their addresses from every new
// allocation of the same size until MEP_REGISTRY_RETIRED later
// retirements: a stale pointer cannot name a new object.
TEST(Registry, RetiredAddressesAreNotHandedOutAgain) {
  constexpr size_t kSize = 96;
  std::set<void*> retired;
  for (int i = 0; i < 16; i++) {
    void* obj = std::malloc(kSize);
    ASSERT_NE(obj, nullptr);
    ASSERT_TRUE(mep_registry_add(obj, MEP_OBJ_HANDLE, nullptr, -1));
    ASSERT_EQ(mep_registry_take(obj, MEP_OBJ_HANDLE), 1);
    retired.insert(obj);
    mep_registry_retire(obj);
  }
  std::vector<void*> fresh;
  for (int i = 0; i < 64; i++) {
    void* p = std::malloc(kSize);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(retired.count(p), 0u) << "allocation " << i << " got the retired address " << p;
    fresh.push_back(p);
  }
  for (void* p : fresh) std::free(p);
}

TEST(Registry, RetireIgnoresNull) { mep_registry_retire(nullptr); }

}  // namespace
