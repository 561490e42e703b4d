// host_mesh_leave_test.cc: a rank that leaves the group (destroys its
// mesh, saying goodbye) after it has done its part of an operation does
// not end the others' waits on other ranks: a wait on a rank that is still
// there goes on and completes, and only a wait on the rank that left fails,
// naming it. Three ranks in this process, each with its own bootstrap,
// mesh, UCX worker and progress thread. The steps are ordered by the test
// (rank 0 has seen the goodbye before rank 1 signals), so nothing depends
// on timing.
#include <pthread.h>
#include <time.h>

#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "runtime/bootstrap.h"
#include "runtime/error.h"
#include "runtime/host/host_mesh.h"
#include "runtime/host/host_mesh_impl.h"
#include "tests/common/ports.h"
#include "tests/host/mesh_rank.h"

namespace {

constexpr int kWorld = 3;
constexpr size_t kRegion = 1 << 16;
constexpr int kTimeoutMs = 30000;
// Rank 0's signal words, one per source.
constexpr size_t kFlagFrom[kWorld] = {0, 64, 128};

int64_t NowMs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

using Rank = moe_ep_test::MeshRank;

class HostMeshLeave : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string address = "127.0.0.1:" + std::to_string(moe_ep_test::free_loopback_port());
    std::thread others[kWorld];
    for (int r = 0; r < kWorld; r++) {
      r_[r].rank = r;
      others[r] = std::thread([this, r, address] {
        r_[r].Create(address, kWorld, "host mesh leave test token", kRegion, kTimeoutMs);
      });
    }
    for (auto &t : others) t.join();
    for (const Rank &r : r_) ASSERT_EQ(r.st, MOE_EP_OK) << "rank " << r.rank << ": " << r.msg;
  }
  void TearDown() override {
    for (Rank &r : r_) mep_host_mesh_destroy(r.mesh);
    for (Rank &r : r_) mep_bootstrap_destroy(r.bs);
  }

  // Signals rank 0 as rank `from` and waits until the signal has left.
  void SignalRoot(int from, uint64_t value) {
    mep_host_mesh_t *m = r_[from].mesh;
    mep_host_mesh_begin(m);
    ASSERT_EQ(mep_host_mesh_signal(m, 0, kFlagFrom[from], value), MOE_EP_OK)
        << "rank " << from << ": " << mep_last_error();
    ASSERT_EQ(mep_host_mesh_complete(m, "leave test signal"), MOE_EP_OK)
        << "rank " << from << ": " << mep_last_error();
  }

  // Waits (bounded) until rank 0 has taken rank `peer`'s goodbye.
  bool RootSawGoodbye(int peer) {
    mep_host_mesh_t *m = r_[0].mesh;
    const int64_t deadline = NowMs() + kTimeoutMs;
    for (;;) {
      pthread_mutex_lock(&m->lock);
      const int bye = m->peers[peer].said_bye;
      pthread_mutex_unlock(&m->lock);
      if (bye) return true;
      if (NowMs() > deadline) return false;
      timespec ts = {0, 1000000};
      nanosleep(&ts, nullptr);
    }
  }

  Rank r_[kWorld];
};

TEST_F(HostMeshLeave, WaitOnAnotherRankOutlivesARankThatLeftAfterItsPart) {
  const uint64_t op = 5;
  SignalRoot(2, op);  // rank 2's part of the operation, then it leaves
  mep_host_mesh_destroy(r_[2].mesh);
  r_[2].mesh = nullptr;
  ASSERT_TRUE(RootSawGoodbye(2)) << "rank 0 never took rank 2's goodbye";
  SignalRoot(1, op);  // rank 1's part comes after rank 2 left

  mep_host_mesh_t *root = r_[0].mesh;
  mep_host_mesh_begin(root);
  EXPECT_EQ(mep_host_mesh_wait(root, kFlagFrom[2], op, 2, "leave test wait on rank 2"),
            MOE_EP_OK)
      << "rank 0: " << mep_last_error();
  EXPECT_EQ(mep_host_mesh_wait(root, kFlagFrom[1], op, 1, "leave test wait on rank 1"),
            MOE_EP_OK)
      << "rank 0: " << mep_last_error();

  // The next operation needs rank 2 again: that wait fails at once, naming
  // the rank that left.
  mep_host_mesh_begin(root);
  EXPECT_EQ(mep_host_mesh_wait(root, kFlagFrom[2], op + 1, 2, "leave test next op"),
            MOE_EP_ERR_PEER_FAILED);
  const std::string msg = mep_last_error();
  EXPECT_NE(msg.find("rank 0 lost rank 2: rank 2 left the group"), std::string::npos) << msg;
}

}  // namespace
