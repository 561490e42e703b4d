// bootstrap_worker.cc: one rank of a bootstrap test. Runs a named scenario
// against the real UCX bootstrap and prints one "RESULT key=value ..." line
// that the drivers parse; exit code 0 means the scenario's own checks passed.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "runtime/bootstrap.h"
#include "runtime/bootstrap_fault.h"
extern "C" {
#include "runtime/bootstrap_types.h"  // mep_bs_progress while held open (C, no guard)
}
#include "runtime/error.h"
#include "tests/bootstrap/flag_util.h"

namespace {

struct Opts {
  std::string scenario = "collectives";
  int rank = -1;
  int world = -1;
  std::string address;
  std::string token;
  bool token_set = false;
  bool no_token = false;
  int timeout_ms = 10000;
  int iters = 20;
  int die_rank = -1;
  int die_at = -1;
  int fail_rank = -1;
  int max_ms = 20000;
  // Scenario "agree": the rank whose setup fails (-1: none), and whether it
  // gives up before the others' broadcast (1) or agrees in step (0).
  int quit_rank = -1;
  int quit_early = 0;
  // The rank whose bootstrap runs out of memory for its messages
  // (mep_bs_fail_alloc_after = 0): from "create" on, or from the
  // scenario's first "op" on.
  int oom_rank = -1;
  std::string oom_at = "op";
  // The rank that puts an unsealed copy on its connection before each of
  // its first `unsealed` messages (mep_bs_send_unsealed_first), and a
  // replayed copy after each of its first `replayed`
  // (mep_bs_send_replayed_first): from "create" on (the joining
  // handshake's messages too), or from the scenario's first "op" on.
  int copies_rank = -1;
  int unsealed = 0;
  int replayed = 0;
  std::string copies_at = "op";
  // Before destroy, wait (up to max_ms) until this file exists: the driver
  // keeps the rank's connections up until its peers have finished.
  std::string hold_file;
  // This rank sleeps this long before bootstrap_create.
  int start_delay_ms = 0;
  // Scenario "late_root": rank 0 enters the second barrier late_ms late;
  // hang_rank enters it only once hang_file exists (or max_ms passed).
  int late_ms = 0;
  int hang_rank = -1;
  std::string hang_file;
};

using mep_test::Flag;
int64_t NowMs() { return mep_test::MonoNowMs(); }

int EnvInt(const char *name, int dflt) {
  const char *v = getenv(name);
  return v != nullptr && *v != '\0' ? atoi(v) : dflt;
}

void SetCopies(const Opts &o) {
  mep_bs_send_unsealed_first = o.unsealed;
  mep_bs_send_replayed_first = o.replayed;
}

Opts Parse(int argc, char **argv) {
  Opts o;
  for (int i = 1; i < argc; i++) {
    std::string v;
    const char *a = argv[i];
    if (Flag(a, "--scenario", &v)) o.scenario = v;
    else if (Flag(a, "--rank", &v)) o.rank = atoi(v.c_str());
    else if (Flag(a, "--world", &v)) o.world = atoi(v.c_str());
    else if (Flag(a, "--address", &v)) o.address = v;
    else if (Flag(a, "--token", &v)) { o.token = v; o.token_set = true; }
    else if (strcmp(a, "--no_token") == 0) o.no_token = true;
    else if (Flag(a, "--timeout_ms", &v)) o.timeout_ms = atoi(v.c_str());
    else if (Flag(a, "--iters", &v)) o.iters = atoi(v.c_str());
    else if (Flag(a, "--die_rank", &v)) o.die_rank = atoi(v.c_str());
    else if (Flag(a, "--die_at", &v)) o.die_at = atoi(v.c_str());
    else if (Flag(a, "--fail_rank", &v)) o.fail_rank = atoi(v.c_str());
    else if (Flag(a, "--max_ms", &v)) o.max_ms = atoi(v.c_str());
    else if (Flag(a, "--quit_rank", &v)) o.quit_rank = atoi(v.c_str());
    else if (Flag(a, "--quit_early", &v)) o.quit_early = atoi(v.c_str());
    else if (Flag(a, "--oom_rank", &v)) o.oom_rank = atoi(v.c_str());
    else if (Flag(a, "--oom_at", &v)) o.oom_at = v;
    else if (Flag(a, "--copies_rank", &v)) o.copies_rank = atoi(v.c_str());
    else if (Flag(a, "--unsealed", &v)) o.unsealed = atoi(v.c_str());
    else if (Flag(a, "--replayed", &v)) o.replayed = atoi(v.c_str());
    else if (Flag(a, "--copies_at", &v)) o.copies_at = v;
    else if (Flag(a, "--hold_file", &v)) o.hold_file = v;
    else if (Flag(a, "--start_delay_ms", &v)) o.start_delay_ms = atoi(v.c_str());
    else if (Flag(a, "--late_ms", &v)) o.late_ms = atoi(v.c_str());
    else if (Flag(a, "--hang_rank", &v)) o.hang_rank = atoi(v.c_str());
    else if (Flag(a, "--hang_file", &v)) o.hang_file = v;
    else {
      fprintf(stderr, "bootstrap_worker: unknown argument %s\n", a);
      exit(64);
    }
  }
  // The launcher's environment fills whatever the flags left out.
  if (o.rank < 0) o.rank = EnvInt("MOE_EP_RANK", -1);
  if (o.world < 0) o.world = EnvInt("MOE_EP_WORLD_SIZE", -1);
  if (o.address.empty() && getenv("MOE_EP_BOOTSTRAP_ADDRESS") != nullptr) {
    o.address = getenv("MOE_EP_BOOTSTRAP_ADDRESS");
  }
  if (!o.token_set && getenv("MOE_EP_JOB_TOKEN") != nullptr) {
    o.token = getenv("MOE_EP_JOB_TOKEN");
  }
  if (o.no_token) o.token.clear();
  return o;
}

// A /proc/self/status field in kB ("VmRSS", "VmHWM"), or -1.
long StatusKb(const char *field) {
  FILE *f = fopen("/proc/self/status", "r");
  if (f == nullptr) return -1;
  char line[256];
  long kb = -1;
  size_t n = strlen(field);
  while (fgets(line, sizeof(line), f) != nullptr) {
    if (strncmp(line, field, n) == 0 && line[n] == ':') {
      kb = atol(line + n + 1);
      break;
    }
  }
  fclose(f);
  return kb;
}

// Times on CLOCK_MONOTONIC, which every process on the machine shares, so
// the driver can bound waits from a reference common to all ranks.
struct Stamps {
  int64_t start_mono_ms = 0;  // main() entered
  int64_t fail_mono_ms = 0;   // the failing call returned (0: none failed)
  long rss_start_kb = -1;     // before the bootstrap existed
  long hwm_kb = -1;           // peak, just before destroy
};
Stamps g_stamps;

void Report(const Opts &o, moe_ep_status_t st, int64_t create_ms,
            int64_t op_ms, int iters, int64_t destroy_ms, const char *msg) {
  const Stamps &t = g_stamps;
  // One write so lines from several ranks never interleave.
  char line[2048];
  snprintf(line, sizeof(line),
           "RESULT rank=%d status=%s create_ms=%lld op_ms=%lld iters=%d "
           "destroy_ms=%lld start_mono_ms=%lld fail_mono_ms=%lld "
           "rss_start_kb=%ld hwm_kb=%ld msg=%s\n",
           o.rank, mep_status_string(st), (long long)create_ms,
           (long long)op_ms, iters, (long long)destroy_ms,
           (long long)t.start_mono_ms, (long long)t.fail_mono_ms,
           t.rss_start_kb, t.hwm_kb, msg);
  fputs(line, stdout);
  fflush(stdout);
}

// 1 when a TCP connection to host:port (IPv4) is accepted, 0 when refused
// or unreachable.
int AcceptsTcp(const std::string &address) {
  sockaddr_in a;
  if (!mep_test::Ipv4Address(address, &a)) return 0;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  int ok = fd >= 0 && connect(fd, (const sockaddr *)&a, sizeof(a)) == 0;
  if (fd >= 0) close(fd);
  return ok;
}

unsigned char Pattern(int rank, int iter, size_t size, size_t i) {
  return (unsigned char)(rank * 131 + iter * 17 + size * 7 + i * 3 + 1);
}

// Returns 0, or 100 after printing the first mismatch.
int CheckBlock(const Opts &o, const char *op, int iter, size_t size, int block,
               const unsigned char *got, int src) {
  for (size_t i = 0; i < size; i++) {
    unsigned char want = Pattern(src, iter, size, i);
    if (got[i] != want) {
      printf("MISMATCH rank=%d op=%s iter=%d size=%zu block=%d index=%zu "
             "expected=%u got=%u\n",
             o.rank, op, iter, size, block, i, want, got[i]);
      return 100;
    }
  }
  return 0;
}

int RunCollectives(const Opts &o, mep_bootstrap_t *bs, int *done,
                   moe_ep_status_t *st) {
  const size_t sizes[] = {0, 1, 13, 4096, 65536};
  const int w = o.world;
  std::vector<unsigned char> send, recv, buf;
  for (int it = 0; it < o.iters; it++) {
    for (size_t size : sizes) {
      send.resize(size);
      for (size_t i = 0; i < size; i++) send[i] = Pattern(o.rank, it, size, i);
      recv.assign(size * w + 1, 0xEE);
      *st = mep_bootstrap_allgather(bs, send.data(), recv.data(), size);
      if (*st != MOE_EP_OK) return 1;
      for (int r = 0; r < w; r++) {
        int rc = CheckBlock(o, "allgather", it, size, r, &recv[r * size], r);
        if (rc != 0) return rc;
      }
      if (recv[size * w] != 0xEE) {
        printf("MISMATCH rank=%d op=allgather wrote past %zu bytes\n", o.rank,
               size * w);
        return 100;
      }
      for (int root = 0; root < w; root++) {
        buf.assign(size, 0);
        if (o.rank == root) {
          for (size_t i = 0; i < size; i++) buf[i] = Pattern(root, it, size, i);
        }
        *st = mep_bootstrap_broadcast(bs, buf.data(), size, root);
        if (*st != MOE_EP_OK) return 1;
        int rc = CheckBlock(o, "broadcast", it, size, root, buf.data(), root);
        if (rc != 0) return rc;
      }
    }
    *st = mep_bootstrap_barrier(bs);
    if (*st != MOE_EP_OK) return 1;
    *done = it + 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char **argv) {
  g_stamps.start_mono_ms = NowMs();
  g_stamps.rss_start_kb = StatusKb("VmRSS");
  Opts o = Parse(argc, argv);
  if (o.scenario == "sleep") {
    printf("SLEEPING rank=%d\n", o.rank);
    fflush(stdout);
    sleep(60);
    return 0;
  }
  if (o.scenario == "env") {
    // What the launcher promises each rank.
    const char *addr = getenv("MOE_EP_BOOTSTRAP_ADDRESS");
    const char *tok = getenv("MOE_EP_JOB_TOKEN");
    bool ok = o.rank >= 0 && o.world > 0 && o.rank < o.world &&
              EnvInt("MOE_EP_LOCAL_RANK", -1) == o.rank &&
              EnvInt("MOE_EP_LOCAL_WORLD_SIZE", -1) == o.world &&
              addr != nullptr && strncmp(addr, "127.0.0.1:", 10) == 0 &&
              atoi(addr + 10) > 0 && tok != nullptr && strlen(tok) >= 16;
    printf("ENV rank=%d world=%d address=%s token_len=%zu ok=%d\n", o.rank,
           o.world, addr ? addr : "(unset)", tok ? strlen(tok) : 0, ok);
    return ok ? 0 : 1;
  }
  if (o.rank == o.fail_rank) {
    printf("RESULT rank=%d status=FAIL_ON_PURPOSE\n", o.rank);
    return 3;
  }
  mep_bootstrap_params_t p;
  p.rank = o.rank;
  p.world_size = o.world;
  p.address = o.address.c_str();
  p.timeout_ms = o.timeout_ms;
  p.token = o.token.c_str();
  if (o.rank == o.oom_rank && o.oom_at == "create") mep_bs_fail_alloc_after = 0;
  if (o.rank == o.copies_rank && o.copies_at == "create") SetCopies(o);
  if (o.start_delay_ms > 0) usleep((useconds_t)o.start_delay_ms * 1000);
  int64_t t0 = NowMs();
  mep_bootstrap_t *bs = nullptr;
  moe_ep_status_t st = mep_bootstrap_create(&p, &bs);
  int64_t create_ms = NowMs() - t0;
  if (st != MOE_EP_OK) {
    g_stamps.fail_mono_ms = NowMs();
    g_stamps.hwm_kb = StatusKb("VmHWM");
    Report(o, st, create_ms, 0, 0, 0, mep_last_error());
    return (int)st;
  }
  if (mep_bootstrap_rank(bs) != o.rank ||
      mep_bootstrap_world_size(bs) != o.world) {
    Report(o, MOE_EP_ERR_INTERNAL, create_ms, 0, 0, 0, "accessors disagree");
    mep_bootstrap_destroy(bs);
    return 101;
  }
  int rc = 0;
  int done = 0;
  int64_t op_ms = 0;
  if (o.rank == o.oom_rank && o.oom_at == "op") mep_bs_fail_alloc_after = 0;
  if (o.rank == o.copies_rank && o.copies_at == "op") SetCopies(o);
  if (o.scenario == "collectives") {
    int64_t t1 = NowMs();
    rc = RunCollectives(o, bs, &done, &st);
    op_ms = NowMs() - t1;
  } else if (o.scenario == "allgather") {
    // One allgather of each rank's number.
    int64_t t1 = NowMs();
    const int64_t mine = 1000 + o.rank;
    std::vector<int64_t> all(o.world, -1);
    st = mep_bootstrap_allgather(bs, &mine, all.data(), sizeof mine);
    op_ms = NowMs() - t1;
    for (int r = 0; st == MOE_EP_OK && r < o.world; r++) {
      if (all[r] != 1000 + r) {
        printf("MISMATCH rank=%d op=allgather block=%d expected=%d got=%lld\n", o.rank, r,
               1000 + r, (long long)all[r]);
        rc = 100;
      }
    }
    done = st == MOE_EP_OK && rc == 0;
  } else if (o.scenario == "barrier") {
    int64_t t1 = NowMs();
    st = mep_bootstrap_barrier(bs);
    op_ms = NowMs() - t1;
    done = st == MOE_EP_OK;
  } else if (o.scenario == "barrier_loop") {
    // Loops until a barrier fails (the expected outcome when a rank dies)
    // or max_ms passes; op_ms is how long the failing barrier took.
    int64_t end = NowMs() + o.max_ms;
    for (int i = 0; NowMs() < end; i++) {
      if (o.rank == o.die_rank && i == o.die_at) raise(SIGKILL);
      int64_t t1 = NowMs();
      st = mep_bootstrap_barrier(bs);
      op_ms = NowMs() - t1;
      if (st != MOE_EP_OK) break;
      done = i + 1;
    }
  } else if (o.scenario == "late_root") {
    // In step once, then rank 0 comes late to the next barrier and
    // hang_rank not until the driver says: the ranks that came on time
    // must learn which rank is missing, not blame rank 0.
    st = mep_bootstrap_barrier(bs);
    if (st == MOE_EP_OK) {
      if (o.rank == 0) usleep((useconds_t)o.late_ms * 1000);
      for (int64_t end = NowMs() + o.max_ms; o.rank == o.hang_rank && NowMs() < end;) {
        if (access(o.hang_file.c_str(), F_OK) == 0) break;
        usleep(10000);
      }
      int64_t t1 = NowMs();
      st = mep_bootstrap_barrier(bs);
      op_ms = NowMs() - t1;
      done = st == MOE_EP_OK;
    }
  } else if (o.scenario == "agree") {
    // A setup phase (one broadcast) closed by an agreement; quit_rank's
    // setup "fails" with MOE_EP_ERR_CUDA. In step, every rank must see
    // exactly that rank's status; early, the agreement meets the others'
    // broadcast and the group fails (the driver checks the sentences).
    int64_t t1 = NowMs();
    const bool quits = o.rank == o.quit_rank;
    st = MOE_EP_OK;
    if (!(quits && o.quit_early)) {
      uint64_t v = o.rank == 0 ? 0x5eedull : 0;
      st = mep_bootstrap_broadcast(bs, &v, sizeof v, 0);
      if (st == MOE_EP_OK && v != 0x5eedull) rc = 100;
    }
    if (quits && o.quit_early) {
      // What a rank does when it cannot make the step the others are in
      // (out of memory for its receive buffer): fails it in their place.
      st = mep_bootstrap_fail_step(bs, MOE_EP_ERR_CUDA);
    } else if (st == MOE_EP_OK) {
      std::vector<int32_t> all(o.world, -1);
      st = mep_bootstrap_agree(bs, quits ? MOE_EP_ERR_CUDA : MOE_EP_OK, all.data());
      for (int r = 0; st == MOE_EP_OK && r < o.world; r++) {
        const int32_t want = r == o.quit_rank ? MOE_EP_ERR_CUDA : MOE_EP_OK;
        if (all[r] != want) {
          fprintf(stderr, "rank %d: agreement slot %d holds %d, expected %d\n", o.rank, r,
                  all[r], want);
          rc = 100;
        }
      }
      done = st == MOE_EP_OK && rc == 0;
    }
    op_ms = NowMs() - t1;
  } else if (o.scenario == "port") {
    // Once the group formed, rank 0's bootstrap address takes no new
    // connection (the kernel refuses it); a barrier keeps every rank's
    // connection up while rank 0 tries.
    if (o.rank == 0) printf("PORT rank=0 accepts=%d\n", AcceptsTcp(o.address));
    st = mep_bootstrap_barrier(bs);
    done = st == MOE_EP_OK;
  } else if (o.scenario != "form") {
    fprintf(stderr, "bootstrap_worker: unknown scenario %s\n",
            o.scenario.c_str());
    rc = 64;
  }
  std::string msg = st == MOE_EP_OK ? "" : mep_last_error();
  mep_bs_fail_alloc_after = -1;
  mep_bs_send_unsealed_first = 0;
  mep_bs_send_replayed_first = 0;
  if (st != MOE_EP_OK) g_stamps.fail_mono_ms = NowMs();
  // Held open, the bootstrap still moves its messages (an ABORT still in
  // flight reaches the peers however slowly the machine runs).
  int idle = 0;
  for (int64_t end = NowMs() + o.max_ms; !o.hold_file.empty() && NowMs() < end;) {
    if (access(o.hold_file.c_str(), F_OK) == 0) break;
    if (bs != nullptr) mep_bs_progress(bs, &idle);
    usleep(10000);
  }
  g_stamps.hwm_kb = StatusKb("VmHWM");
  int64_t t2 = NowMs();
  mep_bootstrap_destroy(bs);
  int64_t destroy_ms = NowMs() - t2;
  if (rc == 0 && st != MOE_EP_OK) rc = (int)st;
  Report(o, st, create_ms, op_ms, done, destroy_ms, msg.c_str());
  return rc;
}
