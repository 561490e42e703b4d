// bootstrap_fake_gate_test.cc: a joiner whose bootstrap address is answered
// by something other than this group's rank 0: a server that speaks the
// gate's records but cannot prove it holds the job token (its verdict's
// proof is wrong, its "worker address" garbage). The joiner must not hand
// that address to UCX (a malformed one aborts the process inside UCX), and
// must fail within its timeout saying rank 0 did not prove the token.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/bootstrap.h"
#include "runtime/bootstrap_types.h"
#include "runtime/error.h"
#include "tests/bootstrap/gate_records.h"

namespace {

// Answers every connection: a challenge, then (after reading the knock's
// header and the rest) an OK verdict whose proof and address are junk.
void FakeGate(int lfd, std::atomic<bool> *stop, std::atomic<int> *served) {
  while (!stop->load()) {
    timeval tv = {0, 100000};
    setsockopt(lfd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    int fd = accept(lfd, nullptr, nullptr);
    if (fd < 0) continue;
    mep_bs_knock_hdr_t h = mep_test::GateHeader(MEP_BS_CHALLENGE, 0, 2);
    h.body_len = MEP_BS_NONCE_BYTES;
    std::vector<unsigned char> out(sizeof(h));
    memcpy(out.data(), &h, sizeof(h));
    out.insert(out.end(), MEP_BS_NONCE_BYTES, 0x11);
    (void)send(fd, out.data(), out.size(), MSG_NOSIGNAL);
    mep_bs_knock_hdr_t k;
    timeval rt = {2, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &rt, sizeof(rt));
    if (recv(fd, &k, sizeof(k), MSG_WAITALL) == (ssize_t)sizeof(k)) {
      std::vector<unsigned char> rest(k.proof_len + k.body_len);
      (void)recv(fd, rest.data(), rest.size(), MSG_WAITALL);
      h.type = MEP_BS_KNOCK_OK;
      h.proof_len = MEP_BS_PROOF_BYTES;
      h.body_len = 64;
      out.assign(sizeof(h), 0);
      memcpy(out.data(), &h, sizeof(h));
      out.insert(out.end(), MEP_BS_PROOF_BYTES + 64, 0x5a);
      (void)send(fd, out.data(), out.size(), MSG_NOSIGNAL);
      served->fetch_add(1);
    }
    close(fd);
  }
}

TEST(BootstrapJoin, AnswerWithoutProofOfTheTokenIsNotTrusted) {
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(lfd, 0);
  sockaddr_in a;
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  ASSERT_EQ(bind(lfd, (sockaddr *)&a, sizeof(a)), 0);
  ASSERT_EQ(listen(lfd, 8), 0);
  ASSERT_EQ(getsockname(lfd, (sockaddr *)&a, &len), 0);
  const std::string addr = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  std::atomic<bool> stop{false};
  std::atomic<int> served{0};
  std::thread gate(FakeGate, lfd, &stop, &served);

  mep_bootstrap_params_t p;
  p.rank = 1;
  p.world_size = 2;
  p.address = addr.c_str();
  // Long enough for the joiner to be served at least once however slowly
  // it starts; it gives up at this bound either way.
  p.timeout_ms = 10000;
  p.token = "the-real-token";
  mep_bootstrap_t *bs = nullptr;
  const moe_ep_status_t st = mep_bootstrap_create(&p, &bs);
  const std::string msg = mep_last_error();
  stop = true;
  gate.join();
  close(lfd);
  EXPECT_EQ(st, MOE_EP_ERR_BOOTSTRAP) << msg;
  EXPECT_EQ(bs, nullptr);
  EXPECT_GE(served.load(), 1) << "the fake gate answered no knock";
  EXPECT_NE(msg.find("rank 1 could not reach rank 0 at " + addr), std::string::npos) << msg;
  EXPECT_NE(msg.find("did not prove it holds the job token"), std::string::npos) << msg;
}

}  // namespace
