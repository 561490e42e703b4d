// bootstrap_fake_gate_test.cc: a joiner whose bootstrap address is answered
// by something other than this group's rank 0: a server that speaks the
// gate's records but cannot prove it holds the job token. Its admission
// (junk proof, junk "worker address") must not reach UCX (a malformed
// address aborts the process inside UCX); its refusal (no proof, or a junk
// one) must not end the join: the joiner keeps knocking until its deadline,
// so the real rank 0, started on the port afterwards, still forms the group.
// A refusal the real rank 0 proves still ends the join at once.
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

constexpr char kToken[] = "the-real-job-token";
// Groups that must form: a bound no step of a loaded machine comes near.
constexpr int kFormTimeoutMs = 60000;

// What the fake gate answers a knock with.
enum class Answer {
  kOkJunkProof,       // OK, proof and address junk
  kRefuseNoProof,     // REFUSE with a reason and no proof
  kRefuseJunkProof,   // REFUSE with a reason and a junk proof
};

constexpr char kFakeReason[] = "rank 1 already joined";

// One answer record to a knock.
std::vector<unsigned char> AnswerRecord(Answer a) {
  mep_bs_knock_hdr_t h = mep_test::GateHeader(MEP_BS_KNOCK_OK, 0, 2);
  std::vector<unsigned char> body;
  if (a == Answer::kOkJunkProof) {
    h.proof_len = MEP_BS_PROOF_BYTES;
    body.assign(MEP_BS_PROOF_BYTES + 64, 0x5a);
    h.body_len = 64;
  } else {
    h.type = MEP_BS_KNOCK_REFUSE;
    h.proof_len = a == Answer::kRefuseJunkProof ? MEP_BS_PROOF_BYTES : 0;
    body.assign(h.proof_len, 0x5a);
    body.insert(body.end(), kFakeReason, kFakeReason + strlen(kFakeReason));
    h.body_len = (uint32_t)strlen(kFakeReason);
  }
  std::vector<unsigned char> out(sizeof(h));
  memcpy(out.data(), &h, sizeof(h));
  out.insert(out.end(), body.begin(), body.end());
  return out;
}

// Answers connections in turn with answers[i] (the last one repeated)
// until `stop`, or until it has answered `limit` knocks (0: no limit).
void FakeGate(int lfd, std::vector<Answer> answers, int limit, std::atomic<bool> *stop,
              std::atomic<int> *served) {
  timeval tv = {0, 100000};
  setsockopt(lfd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  while (!stop->load() && (limit == 0 || served->load() < limit)) {
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
      const size_t i = (size_t)served->load();
      out = AnswerRecord(answers[i < answers.size() ? i : answers.size() - 1]);
      (void)send(fd, out.data(), out.size(), MSG_NOSIGNAL);
      served->fetch_add(1);
    }
    close(fd);
  }
}

// A listening loopback socket on a free port; its "127.0.0.1:port". With
// SO_REUSEADDR, like rank 0's gate: the connections it closes linger in
// TIME_WAIT on the port, and a rank 0 that binds it afterwards may do so
// only when both sides allow reuse.
int Listen(std::string *addr) {
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  if (lfd < 0) return -1;
  int one = 1;
  (void)setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a;
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (bind(lfd, (sockaddr *)&a, sizeof(a)) != 0 || listen(lfd, 8) != 0 ||
      getsockname(lfd, (sockaddr *)&a, &len) != 0) {
    close(lfd);
    return -1;
  }
  *addr = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  return lfd;
}

// One rank's mep_bootstrap_create, run on a thread of its own.
struct Rank {
  int rank = 0;
  int world = 2;
  int timeout_ms = kFormTimeoutMs;
  std::string address;
  mep_bootstrap_t *bs = nullptr;
  moe_ep_status_t st = MOE_EP_ERR_INTERNAL;
  std::string msg;

  void Create() {
    mep_bootstrap_params_t p;
    p.rank = rank;
    p.world_size = world;
    p.address = address.c_str();
    p.timeout_ms = timeout_ms;
    p.token = kToken;
    st = mep_bootstrap_create(&p, &bs);
    msg = st == MOE_EP_OK ? "" : mep_last_error();
  }
  std::string Describe() const {
    return "rank " + std::to_string(rank) + " of " + std::to_string(world) +
           ": status " + mep_status_string(st) + ": " + msg;
  }
};

// Both ranks formed: an allgather carries each rank's value to the other.
void ExpectFormedPair(Rank *r0, Rank *r1) {
  ASSERT_EQ(r0->st, MOE_EP_OK) << r0->Describe();
  ASSERT_EQ(r1->st, MOE_EP_OK) << r1->Describe();
  int32_t got0[2] = {-1, -1}, got1[2] = {-1, -1};
  const int32_t v0 = 100, v1 = 101;
  moe_ep_status_t st0 = MOE_EP_ERR_INTERNAL;
  std::thread t([&] { st0 = mep_bootstrap_allgather(r0->bs, &v0, got0, sizeof v0); });
  const moe_ep_status_t st1 = mep_bootstrap_allgather(r1->bs, &v1, got1, sizeof v1);
  t.join();
  EXPECT_EQ(st0, MOE_EP_OK) << "rank 0";
  EXPECT_EQ(st1, MOE_EP_OK) << "rank 1";
  for (int i = 0; i < 2; i++) {
    EXPECT_EQ(got0[i], 100 + i) << "rank 0, block " << i;
    EXPECT_EQ(got1[i], 100 + i) << "rank 1, block " << i;
  }
  mep_bootstrap_destroy(r1->bs);
  mep_bootstrap_destroy(r0->bs);
}

// A joiner (rank 1 of 2, 10 s) against a fake gate that answers every knock
// with `a`; *addr gets the gate's address, *served the knocks it answered.
// The timeout is long enough for the joiner to be served at least once
// however slowly it starts; it gives up at this bound either way.
Rank JoinFakeGate(Answer a, std::string *addr, int *served) {
  Rank r1;
  r1.rank = 1;
  r1.timeout_ms = 10000;
  int lfd = Listen(addr);
  if (lfd < 0) return r1;
  r1.address = *addr;
  std::atomic<bool> stop{false};
  std::atomic<int> count{0};
  std::thread gate(FakeGate, lfd, std::vector<Answer>{a}, 0, &stop, &count);
  r1.Create();
  stop = true;
  gate.join();
  close(lfd);
  *served = count.load();
  return r1;
}

TEST(BootstrapJoin, AnswerWithoutProofOfTheTokenIsNotTrusted) {
  std::string addr;
  int served = 0;
  Rank r1 = JoinFakeGate(Answer::kOkJunkProof, &addr, &served);
  EXPECT_EQ(r1.st, MOE_EP_ERR_BOOTSTRAP) << r1.Describe();
  EXPECT_EQ(r1.bs, nullptr);
  EXPECT_GE(served, 1) << "the fake gate answered no knock";
  EXPECT_NE(r1.msg.find("rank 1 could not reach rank 0 at " + addr), std::string::npos)
      << r1.Describe();
  EXPECT_NE(r1.msg.find("did not prove it holds the job token"), std::string::npos)
      << r1.Describe();
}

// A refusal without a valid proof is retried to the deadline, and the final
// error quotes it as unproven.
TEST(BootstrapJoin, UnprovenRefusalIsQuotedAtTheDeadline) {
  std::string addr;
  int served = 0;
  Rank r1 = JoinFakeGate(Answer::kRefuseNoProof, &addr, &served);
  EXPECT_EQ(r1.st, MOE_EP_ERR_BOOTSTRAP) << r1.Describe();
  EXPECT_GE(served, 1) << "the fake gate answered no knock";
  EXPECT_NE(r1.msg.find("rank 1 could not reach rank 0 at " + addr + " within 10000 ms"),
            std::string::npos)
      << r1.Describe();
  EXPECT_NE(r1.msg.find(std::string("rank 0 answered: ") + kFakeReason + " (not proven"),
            std::string::npos)
      << r1.Describe();
  EXPECT_EQ(r1.msg.find("refused to admit"), std::string::npos) << r1.Describe();
}

// Something holds rank 0's port for a moment and answers the joiner's
// first two knocks with refusals it cannot prove (none, then a junk
// proof), then lets the port go; the real rank 0 starts on it afterwards.
// The joiner keeps knocking, and the group forms.
TEST(BootstrapJoin, UnprovenRefusalDoesNotEndTheJoin) {
  std::string addr;
  int lfd = Listen(&addr);
  ASSERT_GE(lfd, 0);
  std::atomic<bool> joiner_done{false};
  std::atomic<int> served{0};
  Rank r1;
  r1.rank = 1;
  r1.address = addr;
  std::thread joiner([&] {
    r1.Create();
    joiner_done = true;
  });
  const std::vector<Answer> answers = {Answer::kRefuseNoProof, Answer::kRefuseJunkProof};
  // Returns once it has refused both knocks, or once the joiner gave up.
  FakeGate(lfd, answers, (int)answers.size(), &joiner_done, &served);
  close(lfd);
  if (joiner_done.load()) {
    // No rank 0 has existed yet: the joiner took a refusal as final.
    joiner.join();
    FAIL() << "the joiner ended after " << served.load()
           << " unproven refusals (expected it to keep knocking): " << r1.Describe();
  }
  EXPECT_EQ(served.load(), 2);
  Rank r0;
  r0.address = addr;
  r0.Create();
  joiner.join();
  ExpectFormedPair(&r0, &r1);
}

// A refusal the real rank 0 proves (the right token, the wrong world size)
// ends the join at once with rank 0's reason, not at the deadline; rank 0
// then forms its group with the right rank 1.
TEST(BootstrapJoin, ProvenRefusalEndsTheJoinAtOnce) {
  std::string addr;
  int lfd = Listen(&addr);  // a free port for rank 0
  ASSERT_GE(lfd, 0);
  close(lfd);
  Rank r0;
  r0.address = addr;
  std::thread root([&] { r0.Create(); });
  Rank bad;
  bad.rank = 1;
  bad.world = 3;
  bad.address = addr;
  bad.Create();
  EXPECT_EQ(bad.st, MOE_EP_ERR_BOOTSTRAP) << bad.Describe();
  EXPECT_EQ(bad.bs, nullptr);
  EXPECT_NE(bad.msg.find("rank 1: rank 0 at " + addr +
                         " refused to admit rank 1 of 3: world size mismatch: rank 1 says "
                         "world_size 3, rank 0 has 2"),
            std::string::npos)
      << bad.Describe();
  EXPECT_EQ(bad.msg.find("could not reach"), std::string::npos) << bad.Describe();
  EXPECT_EQ(bad.msg.find("not proven"), std::string::npos) << bad.Describe();
  Rank r1;
  r1.rank = 1;
  r1.address = addr;
  r1.Create();
  root.join();
  ExpectFormedPair(&r0, &r1);
}

}  // namespace
