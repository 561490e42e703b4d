// bootstrap_knocker.cc: an outsider on rank 0's gate (the plain socket at
// the bootstrap address), written against the record layout only. Modes:
//   wrong    a well-formed knock as rank 1 with the wrong token
//   notoken  the same with no token at all
//   huge     a knock header that announces a 1 GiB worker address
//   garbage  --bytes of 'x' (not a knock at all)
//   silent   --conns connections that send half a header and wait
// Each connection waits for rank 0 to answer or close it; with
// --ready_file, that file is created once rank 0 has closed --ready_closed
// of them (so a test knows the gate has been busy with the flood). Prints one
// "KNOCKER mode=... opened=N closed=C refused=R admitted=A reason=..."
// line: connections opened, closed by rank 0, answered with a refusal or
// with an admission, and the first refusal's reason.
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "runtime/bootstrap_types.h"
#include "tests/bootstrap/flag_util.h"
#include "tests/bootstrap/gate_records.h"

namespace {

struct Opts {
  std::string mode = "wrong";
  std::string address;
  int world = 2;
  int conns = 1;
  size_t bytes = 1 << 20;
  int patience_ms = 60000;
  std::string ready_file;
  size_t ready_closed = 0;
};

struct Conn {
  int fd = -1;
  std::vector<unsigned char> in;  // what rank 0 answered
  bool closed = false;            // rank 0 closed (or reset) it
};

using mep_test::Flag;
int64_t NowMs() { return mep_test::MonoNowMs(); }

Opts Parse(int argc, char **argv) {
  Opts o;
  for (int i = 1; i < argc; i++) {
    std::string v;
    if (Flag(argv[i], "--mode", &v)) o.mode = v;
    else if (Flag(argv[i], "--address", &v)) o.address = v;
    else if (Flag(argv[i], "--world", &v)) o.world = atoi(v.c_str());
    else if (Flag(argv[i], "--conns", &v)) o.conns = atoi(v.c_str());
    else if (Flag(argv[i], "--bytes", &v)) o.bytes = strtoull(v.c_str(), 0, 10);
    else if (Flag(argv[i], "--patience_ms", &v)) o.patience_ms = atoi(v.c_str());
    else if (Flag(argv[i], "--ready_file", &v)) o.ready_file = v;
    else if (Flag(argv[i], "--ready_closed", &v)) o.ready_closed = strtoull(v.c_str(), 0, 10);
    else {
      fprintf(stderr, "bootstrap_knocker: unknown argument %s\n", argv[i]);
      exit(64);
    }
  }
  return o;
}

// The bytes this mode sends on each connection. A knock need not wait for
// the gate's challenge: its proof is wrong (or absent) either way.
std::vector<unsigned char> Payload(const Opts &o) {
  if (o.mode == "garbage") return std::vector<unsigned char>(o.bytes, 'x');
  mep_bs_knock_hdr_t h = mep_test::GateHeader(MEP_BS_KNOCK, 1, o.world);
  const size_t body = MEP_BS_NONCE_BYTES + 64;  // a nonce, a made-up address
  if (o.mode == "wrong") {
    h.proof_len = MEP_BS_PROOF_BYTES;
    h.body_len = body;
  } else if (o.mode == "notoken") {
    h.body_len = body;
  } else if (o.mode == "huge") {
    h.proof_len = MEP_BS_PROOF_BYTES;
    h.body_len = 1u << 30;
  }
  std::vector<unsigned char> out(sizeof(h));
  memcpy(out.data(), &h, sizeof(h));
  if (o.mode == "silent") {
    out.resize(sizeof(h) / 2);
  } else if (o.mode == "wrong" || o.mode == "notoken") {
    out.insert(out.end(), h.proof_len, 0x33);
    out.insert(out.end(), body, 0x5a);
  }
  return out;
}

// The first record rank 0 sent that is not its challenge: its type and,
// for a refusal, the reason. Type 0 when there is none.
int Verdict(const std::vector<unsigned char> &in, std::string *reason) {
  size_t at = 0;
  while (at + sizeof(mep_bs_knock_hdr_t) <= in.size()) {
    mep_bs_knock_hdr_t h;
    memcpy(&h, in.data() + at, sizeof(h));
    at += sizeof(h);
    if (h.type != MEP_BS_CHALLENGE) {
      size_t n = in.size() - at < h.proof_len + h.body_len ? in.size() - at
                                                            : h.proof_len + h.body_len;
      if (n > h.proof_len) {
        reason->assign((const char *)in.data() + at + h.proof_len, n - h.proof_len);
      }
      return h.type;
    }
    at += h.proof_len + h.body_len;
  }
  return 0;
}

// Writes as much as the socket takes without blocking for long; a gate
// that closed on us ends the write.
void WriteSome(int fd, const std::vector<unsigned char> &buf, int64_t end) {
  size_t off = 0;
  while (off < buf.size() && NowMs() < end) {
    ssize_t n = send(fd, buf.data() + off, buf.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += (size_t)n;
    } else if (n < 0 && errno != EINTR && errno != EAGAIN) {
      return;
    }
  }
}

}  // namespace

int main(int argc, char **argv) {
  Opts o = Parse(argc, argv);
  sockaddr_in a;
  if (!mep_test::Ipv4Address(o.address, &a)) {
    fprintf(stderr, "bootstrap_knocker: bad --address %s\n", o.address.c_str());
    return 64;
  }
  // Enough descriptors for the flood.
  rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    (void)setrlimit(RLIMIT_NOFILE, &rl);
  }
  const int64_t end = NowMs() + o.patience_ms;
  const std::vector<unsigned char> payload = Payload(o);
  std::vector<Conn> conns;
  // Rank 0 may not listen yet: the first connection retries until it does.
  while (conns.empty() && NowMs() < end) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd >= 0 && connect(fd, (const sockaddr *)&a, sizeof(a)) == 0) {
      conns.push_back(Conn{fd, {}, false});
    } else {
      if (fd >= 0) close(fd);
      usleep(20000);
    }
  }
  while ((int)conns.size() < o.conns && !conns.empty()) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) break;  // out of descriptors: flood with what we have
    if (connect(fd, (const sockaddr *)&a, sizeof(a)) != 0) {
      close(fd);
      break;
    }
    conns.push_back(Conn{fd, {}, false});
  }
  for (Conn &c : conns) {
    WriteSome(c.fd, payload, end);
    (void)fcntl(c.fd, F_SETFL, O_NONBLOCK);
  }
  // Until rank 0 has closed every connection (or patience ends).
  size_t closed = 0;
  bool ready = o.ready_file.empty();
  while (closed < conns.size() && NowMs() < end) {
    if (!ready && closed >= o.ready_closed) {
      FILE *f = fopen(o.ready_file.c_str(), "w");
      if (f != nullptr) fclose(f);
      ready = true;
    }
    std::vector<pollfd> pfds;
    std::vector<Conn *> who;
    for (Conn &c : conns) {
      if (c.closed) continue;
      pfds.push_back(pollfd{c.fd, POLLIN, 0});
      who.push_back(&c);
    }
    if (poll(pfds.data(), pfds.size(), 100) <= 0) continue;
    for (size_t i = 0; i < pfds.size(); i++) {
      if (pfds[i].revents == 0) continue;
      unsigned char buf[4096];
      ssize_t n = recv(who[i]->fd, buf, sizeof(buf), 0);
      if (n > 0) {
        who[i]->in.insert(who[i]->in.end(), buf, buf + n);
      } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        who[i]->closed = true;
        closed++;
      }
    }
  }
  int refused = 0, admitted = 0;
  std::string reason;
  for (const Conn &c : conns) {
    std::string why;
    int type = Verdict(c.in, &why);
    if (type == MEP_BS_KNOCK_OK) admitted++;
    if (type == MEP_BS_KNOCK_REFUSE) {
      refused++;
      if (reason.empty()) reason = why;
    }
  }
  printf("KNOCKER mode=%s opened=%zu closed=%zu refused=%d admitted=%d "
         "reason=%s\n",
         o.mode.c_str(), conns.size(), closed, refused, admitted,
         reason.c_str());
  fflush(stdout);
  return 0;
}
