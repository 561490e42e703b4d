// bootstrap_stranger.cc: a process that speaks the bootstrap's wire protocol
// over UCX directly, to attack rank 0 the way an outsider on the network
// could: messages without (or after a refused) handshake, labelled as a real
// rank, and floods of large messages. It prints one "STRANGER key=value ..."
// line: what it sent, what rank 0 answered, and whether rank 0 cut it off.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <string>
#include <vector>

#include <ucp/api/ucp.h>

#include "runtime/bootstrap_types.h"
#include "tests/bootstrap/flag_util.h"

namespace {

struct Opts {
  std::string mode = "contrib";  // contrib | answer | flood
  std::string hello = "none";    // none | empty | wrong
  std::string address;           // 127.0.0.1:port
  std::string proto = "eager";   // eager | rndv (flood)
  int world = 2;
  int label = 1;          // the rank the messages claim to come from
  int count = 256;        // flood: messages
  size_t bytes = 1 << 20;  // flood: payload per message
  int duration_ms = 3000;  // answer: how long to keep answering
};

struct State {
  int refused = 0;
  int accepted = 0;
  int results = 0;  // RESULT / FORMED: data meant for a member
  int other = 0;
  int failed = 0;
  ucs_status_t fail_status = UCS_OK;
};

using mep_test::Flag;
int64_t NowMs() { return mep_test::MonoNowMs(); }

Opts Parse(int argc, char **argv) {
  Opts o;
  for (int i = 1; i < argc; i++) {
    std::string v;
    if (Flag(argv[i], "--mode", &v)) o.mode = v;
    else if (Flag(argv[i], "--hello", &v)) o.hello = v;
    else if (Flag(argv[i], "--address", &v)) o.address = v;
    else if (Flag(argv[i], "--proto", &v)) o.proto = v;
    else if (Flag(argv[i], "--world", &v)) o.world = atoi(v.c_str());
    else if (Flag(argv[i], "--label", &v)) o.label = atoi(v.c_str());
    else if (Flag(argv[i], "--count", &v)) o.count = atoi(v.c_str());
    else if (Flag(argv[i], "--bytes", &v)) o.bytes = strtoull(v.c_str(), 0, 10);
    else if (Flag(argv[i], "--duration_ms", &v)) o.duration_ms = atoi(v.c_str());
    else {
      fprintf(stderr, "bootstrap_stranger: unknown argument %s\n", argv[i]);
      exit(64);
    }
  }
  return o;
}

ucs_status_t OnMessage(void *arg, const void *header, size_t header_length,
                       void *data, size_t length,
                       const ucp_am_recv_param_t *param) {
  State *s = static_cast<State *>(arg);
  (void)data, (void)length, (void)param;
  if (header_length != sizeof(mep_bs_hdr_t)) return UCS_OK;
  mep_bs_hdr_t h;
  memcpy(&h, header, sizeof(h));
  if (h.type == MEP_BS_MSG_REFUSE) s->refused++;
  else if (h.type == MEP_BS_MSG_ACCEPT) s->accepted++;
  else if (h.type == MEP_BS_MSG_RESULT || h.type == MEP_BS_MSG_FORMED) s->results++;
  else s->other++;
  return UCS_OK;  // a rendezvous offer is declined by returning UCS_OK
}

void OnError(void *arg, ucp_ep_h, ucs_status_t status) {
  State *s = static_cast<State *>(arg);
  if (!s->failed) s->fail_status = status;
  s->failed = 1;
}

// Waits until something accepts TCP connections at the address.
bool WaitListening(const sockaddr_in &a, int64_t deadline) {
  while (NowMs() < deadline) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    bool ok = fd >= 0 && connect(fd, (const sockaddr *)&a, sizeof(a)) == 0;
    if (fd >= 0) close(fd);
    if (ok) return true;
    usleep(20000);
  }
  return false;
}

void SendDone(void *req, ucs_status_t st, void *user) {
  int *pending = static_cast<int *>(user);
  (*pending)--;
  (void)st;
  ucp_request_free(req);
}

// Sends header + payload with the reply flag (so rank 0 can tell which
// connection it came on, as it does for real ranks). UCX may read the
// header and payload until the send completes: both are copied and kept
// for the life of the process (it is short).
int Send(ucp_ep_h ep, const mep_bs_hdr_t &hdr, const void *payload, bool eager,
         int *pending) {
  const mep_bs_hdr_t &h = *new mep_bs_hdr_t(hdr);
  if (payload != nullptr && h.payload_len < 4096) {
    char *copy = new char[h.payload_len + 1];
    memcpy(copy, payload, h.payload_len);
    payload = copy;
  }
  ucp_request_param_t p;
  memset(&p, 0, sizeof(p));
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                   UCP_OP_ATTR_FIELD_FLAGS;
  p.cb.send = SendDone;
  p.user_data = pending;
  p.flags = UCP_AM_SEND_FLAG_REPLY | (eager ? UCP_AM_SEND_FLAG_EAGER : 0);
  ucs_status_ptr_t r = ucp_am_send_nbx(ep, MEP_BS_AM_ID, &h, sizeof(h), payload,
                                       (size_t)h.payload_len, &p);
  if (UCS_PTR_IS_PTR(r)) {
    (*pending)++;
    return 1;
  }
  return UCS_PTR_STATUS(r) == UCS_OK;
}

mep_bs_hdr_t Header(const Opts &o, int type) {
  mep_bs_hdr_t h;
  memset(&h, 0, sizeof(h));
  h.magic = MEP_BS_MAGIC;
  h.version = MEP_BS_VERSION;
  h.type = (uint16_t)type;
  h.src = o.label;
  h.world_size = o.world;
  h.failed_rank = -1;
  h.ctr = 1;  // a number the receiver would take, so only the MAC stops it
  return h;
}

// Rank label's part of the first collective of the worker's scenarios (an
// allgather of 0 bytes, sequence number 1).
mep_bs_hdr_t FirstContrib(const Opts &o) {
  mep_bs_hdr_t h = Header(o, MEP_BS_MSG_CONTRIB);
  h.seq = 1;
  h.op = MEP_BS_OP_ALLGATHER;
  return h;
}

void Progress(ucp_worker_h w, int ms) {
  int64_t end = NowMs() + ms;
  do {
    while (ucp_worker_progress(w) != 0) {
    }
    usleep(1000);
  } while (NowMs() < end);
}

}  // namespace

int main(int argc, char **argv) {
  Opts o = Parse(argc, argv);
  sockaddr_in a;
  if (!mep_test::Ipv4Address(o.address, &a)) {
    fprintf(stderr, "bootstrap_stranger: bad --address %s\n", o.address.c_str());
    return 64;
  }
  if (!WaitListening(a, NowMs() + 10000)) {
    printf("STRANGER connected=0\n");
    return 2;
  }

  State s;
  ucp_params_t cp;
  memset(&cp, 0, sizeof(cp));
  cp.field_mask = UCP_PARAM_FIELD_FEATURES;
  cp.features = UCP_FEATURE_AM;
  ucp_context_h ctx;
  ucp_worker_h worker;
  if (ucp_init(&cp, NULL, &ctx) != UCS_OK) return 3;
  ucp_worker_params_t wp;
  memset(&wp, 0, sizeof(wp));
  if (ucp_worker_create(ctx, &wp, &worker) != UCS_OK) return 3;
  ucp_am_handler_param_t ap;
  memset(&ap, 0, sizeof(ap));
  ap.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                  UCP_AM_HANDLER_PARAM_FIELD_ARG;
  ap.id = MEP_BS_AM_ID;
  ap.cb = OnMessage;
  ap.arg = &s;
  if (ucp_worker_set_am_recv_handler(worker, &ap) != UCS_OK) return 3;
  ucp_ep_params_t ep_params;
  memset(&ep_params, 0, sizeof(ep_params));
  ep_params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                         UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                         UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep_params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  ep_params.sockaddr.addr = (const sockaddr *)&a;
  ep_params.sockaddr.addrlen = sizeof(a);
  ep_params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep_params.err_handler.cb = OnError;
  ep_params.err_handler.arg = &s;
  ucp_ep_h ep;
  if (ucp_ep_create(worker, &ep_params, &ep) != UCS_OK) return 3;

  int pending = 0;
  int sent = 0;
  const bool eager = o.proto == "eager";
  if (o.hello != "none") {
    std::string tok = o.hello == "wrong" ? "not-the-job-token" : "";
    mep_bs_hdr_t h = Header(o, MEP_BS_MSG_HELLO);
    h.payload_len = tok.size();
    sent += Send(ep, h, tok.data(), true, &pending);
  }
  // However loaded the machine, rank 0 gets its time to answer or cut.
  const int patience_ms = 15000;
  std::vector<char> payload;  // flood: UCX reads it until each send ends
  if (o.mode == "contrib") {
    // At once, before any verdict: rank 1's part of the first exchange.
    sent += Send(ep, FirstContrib(o), nullptr, true, &pending);
  } else if (o.mode == "answer") {
    // Wait for the verdict, then keep answering as rank `label` while the
    // real ranks form and run their first exchange.
    int64_t end = NowMs() + patience_ms;
    while (!s.refused && !s.failed && NowMs() < end) Progress(worker, 5);
    end = NowMs() + o.duration_ms;
    while (!s.failed && NowMs() < end) {
      sent += Send(ep, FirstContrib(o), nullptr, true, &pending);
      Progress(worker, 20);
    }
  } else if (o.mode == "flood") {
    payload.assign(o.bytes, 'x');
    mep_bs_hdr_t h = FirstContrib(o);
    h.bytes = o.bytes;
    h.payload_len = o.bytes;
    for (int i = 0; i < o.count && !s.failed; i++) {
      sent += Send(ep, h, payload.data(), eager, &pending);
      while (ucp_worker_progress(worker) != 0) {
      }
    }
  }
  int64_t end = NowMs() + patience_ms;
  while (!s.failed && NowMs() < end) Progress(worker, 5);
  Progress(worker, 200);
  printf("STRANGER mode=%s hello=%s sent=%d refused=%d accepted=%d results=%d "
         "other=%d cut=%d status=%s\n",
         o.mode.c_str(), o.hello.c_str(), sent, s.refused, s.accepted,
         s.results, s.other, s.failed, ucs_status_string(s.fail_status));
  fflush(stdout);
  // Exit without a tidy close: an outsider owes rank 0 nothing.
  _exit(0);
}
