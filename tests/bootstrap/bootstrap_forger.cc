// bootstrap_forger.cc: an insider's tricks on rank 0's gate, written from
// the record layout and the proof's definition (HMAC-SHA-256 under the job
// token of the label "moe-ep knock" with its NUL, the gate's challenge, the
// knock's nonce, its header and its body), not from the bootstrap's code.
//   replay  a knock proven for one connection (claiming the wrong world
//           size, so rank 0 refuses it after checking the proof) sent
//           again on a second connection, whose challenge differs
//   tamper  a proven knock whose worker address is altered after proving
// Prints "FORGER mode=... first=<type>:<reason> second=<type>:<reason>".
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "runtime/bootstrap_types.h"
#include "runtime/hmac.h"
#include "tests/bootstrap/flag_util.h"
#include "tests/bootstrap/gate_records.h"

namespace {

struct Opts {
  std::string mode = "replay";
  std::string address;
  std::string token;
  int world = 2;
};

using Bytes = std::vector<unsigned char>;

int Connect(const sockaddr_in &a) {
  for (int64_t end = mep_test::MonoNowMs() + 15000; mep_test::MonoNowMs() < end;) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd >= 0 && connect(fd, (const sockaddr *)&a, sizeof(a)) == 0) {
      timeval tv = {15, 0};
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      return fd;
    }
    if (fd >= 0) close(fd);
    usleep(20000);
  }
  return -1;
}

// One record: header, then proof and body; false on a short read.
bool ReadRecord(int fd, mep_bs_knock_hdr_t *h, Bytes *rest) {
  if (recv(fd, h, sizeof(*h), MSG_WAITALL) != (ssize_t)sizeof(*h)) return false;
  rest->assign(h->proof_len + h->body_len, 0);
  return rest->empty() ||
         recv(fd, rest->data(), rest->size(), MSG_WAITALL) == (ssize_t)rest->size();
}

// A knock answering `challenge`: header, proof, body (nonce + address).
Bytes Knock(const Opts &o, int world, const unsigned char *challenge) {
  Bytes body(MEP_BS_NONCE_BYTES, 0x42);
  body.insert(body.end(), 64, 0x5a);  // a made-up worker address
  mep_bs_knock_hdr_t h = mep_test::GateHeader(MEP_BS_KNOCK, 1, world);
  h.proof_len = MEP_BS_PROOF_BYTES;
  h.body_len = (uint32_t)body.size();
  const char label[] = "moe-ep knock";
  const void *parts[] = {label, challenge, body.data(), &h, body.data()};
  const size_t lens[] = {sizeof(label), MEP_BS_NONCE_BYTES, MEP_BS_NONCE_BYTES, sizeof(h),
                         body.size()};
  unsigned char proof[MEP_SHA256_BYTES];
  mep_hmac_sha256(o.token.data(), o.token.size(), 5, parts, lens, proof);
  Bytes out(sizeof(h) + sizeof(proof) + body.size());
  memcpy(out.data(), &h, sizeof(h));
  memcpy(out.data() + sizeof(h), proof, sizeof(proof));
  memcpy(out.data() + sizeof(h) + sizeof(proof), body.data(), body.size());
  return out;
}

// Sends `knock` (built by make(challenge) when empty) on a new connection;
// returns "<type>:<reason>" of the verdict.
template <typename Make>
std::string Try(const sockaddr_in &a, Bytes *knock, Make make) {
  int fd = Connect(a);
  if (fd < 0) return "noconnect:";
  mep_bs_knock_hdr_t h;
  Bytes rest;
  std::string got = "nochallenge:";
  if (ReadRecord(fd, &h, &rest) && h.type == MEP_BS_CHALLENGE &&
      rest.size() == MEP_BS_NONCE_BYTES) {
    if (knock->empty()) *knock = make(rest.data());
    (void)send(fd, knock->data(), knock->size(), MSG_NOSIGNAL);
    got = "noverdict:";
    if (ReadRecord(fd, &h, &rest)) {
      got = std::to_string(h.type) + ":" +
            std::string(rest.begin() + h.proof_len, rest.end());
    }
  }
  close(fd);
  return got;
}

}  // namespace

int main(int argc, char **argv) {
  Opts o;
  for (int i = 1; i < argc; i++) {
    std::string v;
    if (mep_test::Flag(argv[i], "--mode", &v)) o.mode = v;
    else if (mep_test::Flag(argv[i], "--address", &v)) o.address = v;
    else if (mep_test::Flag(argv[i], "--token", &v)) o.token = v;
    else if (mep_test::Flag(argv[i], "--world", &v)) o.world = atoi(v.c_str());
    else {
      fprintf(stderr, "bootstrap_forger: unknown argument %s\n", argv[i]);
      return 64;
    }
  }
  sockaddr_in a;
  if (!mep_test::Ipv4Address(o.address, &a)) {
    fprintf(stderr, "bootstrap_forger: bad --address %s\n", o.address.c_str());
    return 64;
  }
  std::string first, second = "-:";
  if (o.mode == "replay") {
    Bytes knock;
    first = Try(a, &knock, [&](const unsigned char *c) { return Knock(o, o.world + 1, c); });
    second = Try(a, &knock, [&](const unsigned char *c) { return Knock(o, o.world + 1, c); });
  } else if (o.mode == "tamper") {
    Bytes knock;
    first = Try(a, &knock, [&](const unsigned char *c) {
      Bytes k = Knock(o, o.world, c);
      k.back() ^= 1;  // the address, after proving
      return k;
    });
  } else {
    fprintf(stderr, "bootstrap_forger: unknown --mode %s\n", o.mode.c_str());
    return 64;
  }
  printf("FORGER mode=%s first=%s second=%s\n", o.mode.c_str(), first.c_str(), second.c_str());
  fflush(stdout);
  return 0;
}
