// host_mesh_goodbye_test.cc: a rank that leaves (destroys its mesh, which
// says goodbye) is blamed only for the operations it left before. Three
// ranks of a host mesh in this process, each with its own bootstrap, mesh,
// UCX worker and progress thread. Rank 2 signals rank 0 its part of an
// operation and leaves:
//   - rank 0, waiting for rank 1's part of that operation, is not told
//     that rank 2 left: it gets rank 1's signal when rank 1 sends it, and
//     while rank 1 sends nothing its wait ends in TIMEOUT naming rank 1
//     (alive, absent), not rank 2;
//   - a wait in the next operation, which rank 2 never signalled, fails at
//     once with PEER_FAILED naming rank 2 as the rank that left.
// The first case fails where any goodbye dooms every wait; the second
// guards the fast failure that must stay. Nothing depends on timing beyond
// generous bounds: rank 0 acts only after it has heard the goodbye, the
// absent wait ends by its timeout alone, and rank 2's destroy waits up to
// 2 s for rank 0's progress thread to acknowledge the goodbye before it
// closes its endpoints.
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
constexpr int kAbsentMs = 1500;  // rank 0's bound for the wait nobody answers
// Rank 0's signal word for each source.
constexpr size_t FlagOf(int src) { return 4096 + 8 * static_cast<size_t>(src); }

using Rank = moe_ep_test::MeshRank;

class HostMeshGoodbye : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string address = "127.0.0.1:" + std::to_string(moe_ep_test::free_loopback_port());
    const char *token = "goodbye test token";
    std::thread others[kWorld - 1];
    for (int r = 1; r < kWorld; r++) {
      r_[r].rank = r;
      others[r - 1] = std::thread([&, r] { r_[r].Create(address, kWorld, token, kRegion,
                                                         kTimeoutMs); });
    }
    r_[0].Create(address, kWorld, token, kRegion, kTimeoutMs);
    for (std::thread &t : others) t.join();
    for (const Rank &r : r_) ASSERT_EQ(r.st, MOE_EP_OK) << "rank " << r.rank << ": " << r.msg;
  }
  void TearDown() override {
    for (Rank &r : r_) mep_host_mesh_destroy(r.mesh);
    for (Rank &r : r_) mep_bootstrap_destroy(r.bs);
  }

  mep_host_mesh_t *Mesh(int r) { return r_[r].mesh; }

  void Signal(int from, uint64_t value) {
    mep_host_mesh_t *m = Mesh(from);
    mep_host_mesh_begin(m);
    ASSERT_EQ(mep_host_mesh_signal(m, 0, FlagOf(from), value), MOE_EP_OK)
        << "rank " << from << ": " << mep_last_error();
    ASSERT_EQ(mep_host_mesh_complete(m, "goodbye test signal"), MOE_EP_OK)
        << "rank " << from << ": " << mep_last_error();
  }

  moe_ep_status_t Wait(int from, uint64_t value) {
    mep_host_mesh_begin(Mesh(0));
    return mep_host_mesh_wait(Mesh(0), FlagOf(from), value, from, "goodbye test wait");
  }

  // Rank 2 leaves; returns once rank 0 has heard its goodbye (bounded).
  void Rank2Leaves() {
    mep_host_mesh_destroy(r_[2].mesh);
    r_[2].mesh = nullptr;
    mep_host_mesh_t *m = Mesh(0);
    const int64_t deadline = moe_ep_test::MonoMs() + kTimeoutMs;
    int heard = 0;
    while (!heard && moe_ep_test::MonoMs() < deadline) {
      pthread_mutex_lock(&m->lock);
      heard = m->peers[2].said_bye;
      pthread_mutex_unlock(&m->lock);
      if (!heard) {
        timespec ts = {0, 1000000};
        nanosleep(&ts, nullptr);
      }
    }
    ASSERT_TRUE(heard) << "rank 0 did not hear rank 2's goodbye within " << kTimeoutMs << " ms";
  }

  void SetTimeout(int r, int ms) {
    mep_host_mesh_t *m = Mesh(r);
    pthread_mutex_lock(&m->lock);
    m->timeout_ms = ms;
    pthread_mutex_unlock(&m->lock);
  }

  Rank r_[kWorld];
};

TEST_F(HostMeshGoodbye, LeaverThatSentItsPartIsNotBlamed) {
  const uint64_t op = 5;
  ASSERT_NO_FATAL_FAILURE(Signal(2, op));
  ASSERT_EQ(Wait(2, op), MOE_EP_OK) << mep_last_error();
  ASSERT_NO_FATAL_FAILURE(Rank2Leaves());

  // Rank 1 has not sent its part: rank 0's wait names rank 1, absent.
  SetTimeout(0, kAbsentMs);
  const moe_ep_status_t st = Wait(1, op);
  const std::string msg = mep_last_error();
  EXPECT_EQ(st, MOE_EP_ERR_TIMEOUT) << msg;
  EXPECT_NE(msg.find("rank 0 waited timeouts.kernel_ms=" + std::to_string(kAbsentMs) +
                     " for rank 1's operation " + std::to_string(op - 1)),
            std::string::npos)
      << msg;
  EXPECT_EQ(msg.find("rank 2"), std::string::npos) << "rank 2 blamed: " << msg;

  // Rank 1's part still completes the operation on rank 0.
  SetTimeout(0, kTimeoutMs);
  ASSERT_NO_FATAL_FAILURE(Signal(1, op));
  EXPECT_EQ(Wait(1, op), MOE_EP_OK) << mep_last_error();
}

TEST_F(HostMeshGoodbye, LeaverIsBlamedAtOnceForAnOperationItLeftBefore) {
  const uint64_t op = 5;
  ASSERT_NO_FATAL_FAILURE(Signal(2, op));
  ASSERT_NO_FATAL_FAILURE(Signal(1, op));
  ASSERT_EQ(Wait(2, op), MOE_EP_OK) << mep_last_error();
  ASSERT_EQ(Wait(1, op), MOE_EP_OK) << mep_last_error();
  ASSERT_NO_FATAL_FAILURE(Rank2Leaves());

  // The next operation: rank 2 will never signal it, so rank 0's wait for
  // rank 1 fails at once (well inside the 30 s bound) naming rank 2.
  const int64_t start = moe_ep_test::MonoMs();
  const moe_ep_status_t st = Wait(1, op + 1);
  const std::string msg = mep_last_error();
  EXPECT_EQ(st, MOE_EP_ERR_PEER_FAILED) << msg;
  EXPECT_NE(msg.find("rank 0 lost rank 2: rank 2 left the group"), std::string::npos) << msg;
  EXPECT_LT(moe_ep_test::MonoMs() - start, kTimeoutMs) << "the wait ran out its bound: " << msg;
  // Sending to the rank that left is refused the same way.
  mep_host_mesh_begin(Mesh(0));
  EXPECT_EQ(mep_host_mesh_signal(Mesh(0), 2, FlagOf(0), op + 1), MOE_EP_ERR_PEER_FAILED);
  EXPECT_NE(std::string(mep_last_error()).find("rank 2 left the group"), std::string::npos)
      << mep_last_error();
}

}  // namespace
