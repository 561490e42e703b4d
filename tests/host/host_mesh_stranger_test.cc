// host_mesh_stranger_test.cc: a UCX process outside the group that reaches
// the host mesh's worker (its transports listen on ports any UCX process
// can find) and sends it active messages with the mesh's id, laid out as
// the mesh's own headers but without a tag under the group's keys: puts,
// signals, a goodbye, a short header and rendezvous data. None may touch
// the region or the peers' state, each is counted, and the mesh then
// carries the group's own put and signal as before. (What one who reads
// the group's traffic can do with it: host_mesh_reader_test.cc.)
#include <string.h>
#include <time.h>

#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <ucp/api/ucp.h>

#include "runtime/bootstrap.h"
#include "runtime/error.h"
#include "runtime/host/host_mesh.h"
#include "runtime/host/host_mesh_impl.h"
#include "tests/common/ports.h"
#include "tests/host/mesh_outsider.h"

namespace {

constexpr size_t kRegion = 1 << 20;
constexpr int kTimeoutMs = 30000;

int64_t NowMs() { return moe_ep_test::MonoMs(); }

using Stranger = moe_ep_test::MeshOutsider;

// A header as the mesh lays it out, to rank 0, with a made-up tag.
mep_host_msg_t Forged(int kind, uint64_t offset, uint64_t value, uint8_t tag_byte, int src = 0,
                      uint64_t seq = 1) {
  mep_host_msg_t h;
  memset(&h, 0, sizeof(h));
  memset(h.tag, tag_byte, sizeof(h.tag));
  h.seq = seq;
  h.offset = offset;
  h.value = value;
  h.src = src;
  h.kind = kind;
  return h;
}

class HostMeshStranger : public ::testing::Test {
 protected:
  void SetUp() override {
    address_ = "127.0.0.1:" + std::to_string(moe_ep_test::free_loopback_port());
    mep_bootstrap_params_t p = {};
    p.rank = 0;
    p.world_size = 1;
    p.address = address_.c_str();
    p.timeout_ms = kTimeoutMs;
    p.token = "t";
    ASSERT_EQ(mep_bootstrap_create(&p, &bs_), MOE_EP_OK) << mep_last_error();
    ASSERT_EQ(mep_host_mesh_create(bs_, kRegion, kTimeoutMs, &mesh_), MOE_EP_OK)
        << mep_last_error();
  }
  void TearDown() override {
    mep_host_mesh_destroy(mesh_);
    mep_bootstrap_destroy(bs_);
  }

  // Waits (bounded) until the mesh has counted `n` dropped messages.
  uint64_t AwaitStrangers(uint64_t n) {
    const int64_t deadline = NowMs() + kTimeoutMs;
    uint64_t seen;
    while ((seen = mep_host_mesh_strangers(mesh_)) < n && NowMs() < deadline) {
      timespec ts = {0, 1000000};
      nanosleep(&ts, nullptr);
    }
    return seen;
  }

  // The group's own path: a put to itself and the signal behind it.
  void ExpectOwnPutLands() {
    std::vector<uint8_t> row(256, 0x5a);
    mep_host_mesh_begin(mesh_);
    ASSERT_EQ(mep_host_mesh_put(mesh_, 0, row.data(), row.size(), 4096), MOE_EP_OK)
        << mep_last_error();
    ASSERT_EQ(mep_host_mesh_signal(mesh_, 0, 8192, 1), MOE_EP_OK) << mep_last_error();
    ASSERT_EQ(mep_host_mesh_complete(mesh_, "stranger test put"), MOE_EP_OK) << mep_last_error();
    ASSERT_EQ(mep_host_mesh_wait(mesh_, 8192, 1, 0, "stranger test wait"), MOE_EP_OK)
        << mep_last_error();
    EXPECT_EQ(memcmp(mep_host_mesh_local(mesh_) + 4096, row.data(), row.size()), 0);
  }

  // First byte of the region outside [skip_lo, skip_hi) that is not zero, or -1.
  long FirstNonZero(size_t skip_lo = 0, size_t skip_hi = 0) {
    const uint8_t *r = mep_host_mesh_local(mesh_);
    for (size_t i = 0; i < kRegion; i++) {
      if (i >= skip_lo && i < skip_hi) continue;
      if (r[i] != 0) return static_cast<long>(i);
    }
    return -1;
  }

  std::string address_;
  mep_bootstrap_t *bs_ = nullptr;
  mep_host_mesh_t *mesh_ = nullptr;
};

TEST_F(HostMeshStranger, MessagesWithoutATagAreDroppedUnread) {
  size_t len = 0;
  const void *addr = mep_host_mesh_address(mesh_, &len);
  ASSERT_NE(addr, nullptr);
  ASSERT_GT(len, 0u);
  Stranger s(kTimeoutMs);
  ASSERT_EQ(s.Open(addr), "");

  std::vector<uint8_t> row(512, 0xab), big(256 << 10, 0xcd);
  uint64_t sent = 0;
  // Tags a stranger might try: none, all ones, and a "likely" pattern.
  for (uint8_t tag_byte : {0x00, 0xff, 0x01}) {
    mep_host_msg_t put = Forged(MEP_HOST_MSG_PUT, 0, 0, tag_byte);
    const mep_host_msg_t sig = Forged(MEP_HOST_MSG_SIGNAL, 8192, 1, tag_byte);
    const mep_host_msg_t bye = Forged(MEP_HOST_MSG_BYE, 0, 0, tag_byte);
    const mep_host_msg_t ack = Forged(MEP_HOST_MSG_HELLO_ACK, 0, 0, tag_byte);
    put.bytes = row.size();
    EXPECT_EQ(s.Send(&put, sizeof(put), row.data(), row.size(), false), UCS_OK);
    put.bytes = big.size();
    EXPECT_EQ(s.Send(&put, sizeof(put), big.data(), big.size(), true), UCS_OK);
    EXPECT_EQ(s.Send(&sig, sizeof(sig), nullptr, 0, false), UCS_OK);
    EXPECT_EQ(s.Send(&bye, sizeof(bye), nullptr, 0, false), UCS_OK);
    EXPECT_EQ(s.Send(&ack, sizeof(ack), nullptr, 0, false), UCS_OK);
    sent += 5;
  }
  // Headers a member would be failed for (a put past the region), or that
  // name a source outside the group: from a stranger, dropped like the
  // rest, so the tag is checked before anything in the header is believed.
  for (const mep_host_msg_t& bad :
       {Forged(MEP_HOST_MSG_PUT, 0, 0, 0, -1), Forged(MEP_HOST_MSG_SIGNAL, 8192, 1, 0, 1),
        Forged(MEP_HOST_MSG_PUT, kRegion, 0, 0), Forged(MEP_HOST_MSG_BYE, 0, 0, 0, 1 << 30)}) {
    EXPECT_EQ(s.Send(&bad, sizeof(bad), row.data(), row.size(), false), UCS_OK);
    sent += 1;
  }
  // A header of the wrong size (before this check it broke the group:
  // every later wait reported a malformed message).
  const uint8_t shorty[3] = {1, 2, 3};
  EXPECT_EQ(s.Send(shorty, sizeof(shorty), row.data(), row.size(), false), UCS_OK);
  std::vector<uint8_t> longer(sizeof(mep_host_msg_t) + 8, 0);
  EXPECT_EQ(s.Send(longer.data(), longer.size(), big.data(), big.size(), true), UCS_OK);
  sent += 2;

  EXPECT_EQ(AwaitStrangers(sent), sent);
  const long bad = FirstNonZero();
  EXPECT_EQ(bad, -1) << "a stranger's message changed region byte " << bad << " to "
                     << static_cast<int>(mep_host_mesh_local(mesh_)[bad < 0 ? 0 : bad]);
  ExpectOwnPutLands();
  EXPECT_EQ(FirstNonZero(4096, 8192 + 8), -1);
}

// Many rendezvous messages from a stranger: none is fetched, and the mesh
// goes on carrying the group's data.
TEST_F(HostMeshStranger, RendezvousFloodIsNotFetched) {
  size_t len = 0;
  const void *addr = mep_host_mesh_address(mesh_, &len);
  Stranger s(kTimeoutMs);
  ASSERT_EQ(s.Open(addr), "");
  std::vector<uint8_t> big(1 << 20, 0xee);
  mep_host_msg_t put = Forged(MEP_HOST_MSG_PUT, 0, 0, 0);
  put.bytes = big.size();
  constexpr uint64_t kMessages = 256;
  for (uint64_t i = 0; i < kMessages; i++)
    ASSERT_EQ(s.Send(&put, sizeof(put), big.data(), big.size(), true), UCS_OK) << "message " << i;
  EXPECT_EQ(AwaitStrangers(kMessages), kMessages);
  EXPECT_EQ(FirstNonZero(), -1);
  ExpectOwnPutLands();
}

// A member's signal (tagged under the group's key, with the sender's next
// number) at an offset that is not a multiple of 8: one atomic 8-byte
// store could not carry it, so the mesh fails naming the sender instead of
// storing it torn.
TEST_F(HostMeshStranger, MisalignedSignalFailsTheMesh) {
  size_t len = 0;
  const void *addr = mep_host_mesh_address(mesh_, &len);
  Stranger s(kTimeoutMs);
  ASSERT_EQ(s.Open(addr), "");
  mep_host_msg_t sig = Forged(MEP_HOST_MSG_SIGNAL, 8192 + 4, 1, 0);
  pthread_mutex_lock(&mesh_->lock);
  sig.seq = ++mesh_->peers[0].sent;
  mep_host_msg_seal(&mesh_->peers[0].key_out, &sig);
  pthread_mutex_unlock(&mesh_->lock);
  ASSERT_EQ(s.Send(&sig, sizeof(sig), nullptr, 0, false), UCS_OK);
  mep_host_mesh_begin(mesh_);  // the wait's deadline
  EXPECT_NE(mep_host_mesh_wait(mesh_, 8192, 1, 0, "misaligned signal wait"), MOE_EP_OK);
  EXPECT_NE(std::string(mep_last_error()).find("rank 0 sent a signal at offset 8196, not a "
                                               "multiple of 8"),
            std::string::npos)
      << mep_last_error();
  EXPECT_EQ(FirstNonZero(), -1);
}

}  // namespace
