// host_mesh_reader_test.cc: one who reads the network between two ranks of
// a host mesh (both ranks in this process, each with its own bootstrap,
// mesh, UCX worker and progress thread) and then writes to a rank's mesh
// worker from a UCX process of its own. It knows all that travels in the
// clear: the workers' addresses (the bootstrap's allgather) and the
// headers and data of the messages it saw (the mesh's test seam
// mep_host_mesh_keep_sent hands the test the last header a rank queued).
// With them it puts the seen header over other data, at another offset or
// length, replays a put and a signal as they were, names another source,
// turns a signal into a goodbye, and sends a message to the rank that sent
// it. Each is dropped and counted: the region stays as it was, no rank is
// taken for gone, and the ranks' own round trips carry on.
#include <pthread.h>
#include <string.h>
#include <time.h>

#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <ucp/api/ucp.h>

#include "runtime/bootstrap.h"
#include "runtime/error.h"
#include "runtime/host/host_mesh.h"
#include "runtime/host/host_mesh_impl.h"
#include "tests/common/ports.h"
#include "tests/host/mesh_outsider.h"
#include "tests/host/mesh_rank.h"

namespace {

constexpr size_t kRegion = 1 << 20;
constexpr int kTimeoutMs = 30000;
constexpr size_t kRow = 4096;   // where rank 1's row lands on rank 0
constexpr size_t kFlag = 8192;  // the signal word behind it
constexpr size_t kRowBytes = 256;

int64_t NowMs() { return moe_ep_test::MonoMs(); }

using Reader = moe_ep_test::MeshOutsider;

using Rank = moe_ep_test::MeshRank;

class HostMeshReader : public ::testing::Test {
 protected:
  void SetUp() override {
    mep_host_mesh_keep_sent = 1;
    const std::string address = "127.0.0.1:" + std::to_string(moe_ep_test::free_loopback_port());
    r_[1].rank = 1;
    const char *token = "network reader test token";
    std::thread root([&] { r_[0].Create(address, 2, token, kRegion, kTimeoutMs); });
    r_[1].Create(address, 2, token, kRegion, kTimeoutMs);
    root.join();
    for (const Rank &r : r_) ASSERT_EQ(r.st, MOE_EP_OK) << "rank " << r.rank << ": " << r.msg;
  }
  void TearDown() override {
    for (Rank &r : r_) mep_host_mesh_destroy(r.mesh);
    for (Rank &r : r_) mep_bootstrap_destroy(r.bs);
    mep_host_mesh_keep_sent = 0;
  }

  mep_host_mesh_t *Mesh(int r) { return r_[r].mesh; }

  static mep_host_msg_t LastSent(mep_host_mesh_t *m) {
    pthread_mutex_lock(&m->lock);
    const mep_host_msg_t h = m->last_sent;
    pthread_mutex_unlock(&m->lock);
    return h;
  }

  // A real put of `row` and the signal `value` behind it, from rank `from`
  // to rank `to`, received there; *put and *sig get the headers as they
  // crossed the network.
  void RoundTrip(int from, int to, const std::vector<uint8_t> &row, uint64_t value,
                 mep_host_msg_t *put = nullptr, mep_host_msg_t *sig = nullptr) {
    mep_host_mesh_t *src = Mesh(from);
    mep_host_mesh_begin(src);
    ASSERT_EQ(mep_host_mesh_put(src, to, row.data(), row.size(), kRow), MOE_EP_OK)
        << mep_last_error();
    if (put != nullptr) *put = LastSent(src);
    ASSERT_EQ(mep_host_mesh_signal(src, to, kFlag, value), MOE_EP_OK) << mep_last_error();
    if (sig != nullptr) *sig = LastSent(src);
    ASSERT_EQ(mep_host_mesh_complete(src, "reader test put"), MOE_EP_OK) << mep_last_error();
    mep_host_mesh_begin(Mesh(to));
    ASSERT_EQ(mep_host_mesh_wait(Mesh(to), kFlag, value, from, "reader test wait"), MOE_EP_OK)
        << "rank " << to << ": " << mep_last_error();
    EXPECT_EQ(memcmp(mep_host_mesh_local(Mesh(to)) + kRow, row.data(), row.size()), 0)
        << "rank " << to << " did not get rank " << from << "'s row";
  }

  // The receiving engine has read the row and the signal: both back to
  // zero, so whatever writes them again shows.
  void Consume(int r) {
    uint8_t *region = mep_host_mesh_local(Mesh(r));
    memset(region + kRow, 0, kRowBytes);
    __atomic_store_n(reinterpret_cast<uint64_t *>(region + kFlag), 0, __ATOMIC_RELEASE);
  }

  // Waits (bounded) until rank r has counted `n` dropped messages.
  uint64_t AwaitStrangers(int r, uint64_t n) {
    const int64_t deadline = NowMs() + kTimeoutMs;
    uint64_t seen;
    while ((seen = mep_host_mesh_strangers(Mesh(r))) < n && NowMs() < deadline) {
      timespec ts = {0, 1000000};
      nanosleep(&ts, nullptr);
    }
    return seen;
  }

  // First byte of rank r's region that is not zero, or -1.
  long FirstNonZero(int r) {
    const uint8_t *region = mep_host_mesh_local(Mesh(r));
    for (size_t i = 0; i < kRegion; i++) {
      if (region[i] != 0) return static_cast<long>(i);
    }
    return -1;
  }

  // Rank r still takes every peer for a member of a live group.
  void ExpectNoPeerLost(int r) {
    mep_host_mesh_t *m = Mesh(r);
    pthread_mutex_lock(&m->lock);
    EXPECT_EQ(m->first_failed, -1) << "rank " << r << " takes rank " << m->first_failed
                                   << " for gone";
    EXPECT_EQ(m->recv_error, 0) << "rank " << r << ": " << m->recv_error_msg;
    for (int p = 0; p < 2; p++) {
      EXPECT_EQ(m->peers[p].said_bye, 0) << "rank " << r << " heard a goodbye from " << p;
    }
    pthread_mutex_unlock(&m->lock);
  }

  Rank r_[2];
};

TEST_F(HostMeshReader, SeenHeadersCannotBeReusedForgedOrReplayed) {
  const std::vector<uint8_t> row(kRowBytes, 0x11);
  mep_host_msg_t put, sig;
  ASSERT_NO_FATAL_FAILURE(RoundTrip(1, 0, row, 1, &put, &sig));
  ASSERT_EQ(put.kind, MEP_HOST_MSG_PUT);
  ASSERT_EQ(put.bytes, kRowBytes);
  ASSERT_EQ(sig.kind, MEP_HOST_MSG_SIGNAL);
  Consume(0);
  ASSERT_EQ(FirstNonZero(0), -1);
  const uint64_t before0 = mep_host_mesh_strangers(Mesh(0));
  const uint64_t before1 = mep_host_mesh_strangers(Mesh(1));

  size_t len = 0;
  Reader to0(kTimeoutMs);
  ASSERT_EQ(to0.Open(mep_host_mesh_address(Mesh(0), &len)), "");
  uint64_t sent0 = 0;
  const std::vector<uint8_t> evil(kRowBytes, 0xee), longer(2 * kRowBytes, 0xee);

  // (a) The seen put's header over other data, at another offset, with
  // its length field and data changed to match, and as rendezvous.
  EXPECT_EQ(to0.Send(put, evil.data(), evil.size()), UCS_OK);
  EXPECT_EQ(to0.Send(put, evil.data(), evil.size(), true), UCS_OK);
  mep_host_msg_t moved = put;
  moved.offset = 0;
  EXPECT_EQ(to0.Send(moved, evil.data(), evil.size()), UCS_OK);
  mep_host_msg_t grown = put;
  grown.bytes = longer.size();
  EXPECT_EQ(to0.Send(grown, longer.data(), longer.size()), UCS_OK);
  EXPECT_EQ(to0.Send(put, longer.data(), longer.size()), UCS_OK);
  mep_host_msg_t renumbered = put;  // a number rank 1 has not used yet
  renumbered.seq += 1000;
  EXPECT_EQ(to0.Send(renumbered, evil.data(), evil.size()), UCS_OK);
  sent0 += 6;
  // (b) The put and the signal again, byte for byte.
  EXPECT_EQ(to0.Send(put, row.data(), row.size()), UCS_OK);
  EXPECT_EQ(to0.Send(sig, nullptr, 0), UCS_OK);
  sent0 += 2;
  // (c) Another source: rank 0 itself, and a rank outside the group (a
  // member would be failed for that; the reader must not be able to). The
  // signal made a goodbye, which would fail the group blaming rank 1.
  for (int src : {0, 2, -1, 1 << 30}) {
    mep_host_msg_t forged = sig;
    forged.src = src;
    forged.seq += 1000;
    EXPECT_EQ(to0.Send(forged, nullptr, 0), UCS_OK) << "src " << src;
    sent0 += 1;
  }
  mep_host_msg_t bye = sig;
  bye.kind = MEP_HOST_MSG_BYE;
  EXPECT_EQ(to0.Send(bye, nullptr, 0), UCS_OK);
  bye.seq += 1000;
  EXPECT_EQ(to0.Send(bye, nullptr, 0), UCS_OK);
  sent0 += 2;

  // The message rank 1 sent, to rank 1: another direction, another key.
  Reader to1(kTimeoutMs);
  ASSERT_EQ(to1.Open(mep_host_mesh_address(Mesh(1), &len)), "");
  mep_host_msg_t back = sig;
  back.seq += 1000;
  EXPECT_EQ(to1.Send(sig, nullptr, 0), UCS_OK);
  EXPECT_EQ(to1.Send(back, nullptr, 0), UCS_OK);

  EXPECT_EQ(AwaitStrangers(0, before0 + sent0), before0 + sent0);
  EXPECT_EQ(AwaitStrangers(1, before1 + 2), before1 + 2);
  const long bad = FirstNonZero(0);
  EXPECT_EQ(bad, -1) << "the reader changed rank 0's region byte " << bad << " to "
                     << static_cast<int>(mep_host_mesh_local(Mesh(0))[bad < 0 ? 0 : bad]);
  ExpectNoPeerLost(0);
  ExpectNoPeerLost(1);

  // The group goes on: rank 1's next message numbers are its own, both
  // directions.
  ASSERT_NO_FATAL_FAILURE(RoundTrip(1, 0, std::vector<uint8_t>(kRowBytes, 0x22), 2));
  ASSERT_NO_FATAL_FAILURE(RoundTrip(0, 1, std::vector<uint8_t>(kRowBytes, 0x33), 1));
  EXPECT_EQ(mep_host_mesh_strangers(Mesh(0)), before0 + sent0);
  EXPECT_EQ(mep_host_mesh_strangers(Mesh(1)), before1 + 2);
}

// A header seen on the network tells nothing that makes the next one: the
// tag changes with the number, and the seen tag, as another number's,
// does not pass.
TEST_F(HostMeshReader, NextNumberWithSeenTagIsDropped) {
  const std::vector<uint8_t> row(kRowBytes, 0x44);
  mep_host_msg_t put, sig;
  ASSERT_NO_FATAL_FAILURE(RoundTrip(1, 0, row, 1, &put, &sig));
  Consume(0);
  const uint64_t before = mep_host_mesh_strangers(Mesh(0));
  size_t len = 0;
  Reader to0(kTimeoutMs);
  ASSERT_EQ(to0.Open(mep_host_mesh_address(Mesh(0), &len)), "");
  // Rank 1's next numbers, which rank 0 has not taken: the signal's seen
  // tag with the value a waiter would take for the next operation.
  mep_host_msg_t next = sig;
  next.seq = sig.seq + 1;
  next.value = 2;
  EXPECT_EQ(to0.Send(next, nullptr, 0), UCS_OK);
  next.seq = sig.seq + 2;
  EXPECT_EQ(to0.Send(next, nullptr, 0), UCS_OK);
  EXPECT_EQ(AwaitStrangers(0, before + 2), before + 2);
  EXPECT_EQ(FirstNonZero(0), -1);
  // Those numbers were not used up by the forgeries: rank 1's own messages
  // with them are taken.
  ASSERT_NO_FATAL_FAILURE(RoundTrip(1, 0, std::vector<uint8_t>(kRowBytes, 0x55), 2));
  EXPECT_EQ(mep_host_mesh_strangers(Mesh(0)), before + 2);
}

}  // namespace
