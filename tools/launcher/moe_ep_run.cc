// moe_ep_run.cc: the local multi-process launcher. Starts N ranks of a
// program with the MOE_EP_* environment the bootstrap reads, forwards
// SIGINT/SIGTERM/SIGHUP/SIGQUIT, and tears the job down when one rank fails
// or time runs out. No rank, nor anything a rank started, outlives it: the
// ranks die with it (even by SIGKILL), and it adopts and kills what they
// leave behind.
//
//   moe_ep_run -n N [--timeout_s S] [--grace_s G] -- prog args...
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "tools/launcher/loopback_port.h"

namespace {

volatile sig_atomic_t g_signal = 0;

void OnSignal(int sig) { g_signal = sig; }

struct Rank {
  pid_t pid = -1;
  bool running = false;
  int status = 0;
};

void Usage() {
  fprintf(stderr,
          "usage: moe_ep_run -n N [--timeout_s S] [--grace_s G] -- prog "
          "[args...]\n"
          "  -n N          ranks to start on this host (1..1024)\n"
          "  --timeout_s S kill every rank after S seconds (default: none)\n"
          "  --grace_s G   after a rank fails, wait G seconds for the others\n"
          "                before killing them (default 10)\n");
}

double NowS() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

bool ParseNum(const char *s, double lo, double hi, double *out) {
  char *end = nullptr;
  errno = 0;
  double v = strtod(s, &end);
  // !(in range) also refuses NaN, which every comparison lets through.
  if (errno != 0 || end == s || *end != '\0' || !(v >= lo && v <= hi)) return false;
  *out = v;
  return true;
}

std::string RandomToken() {
  unsigned char b[16];
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0 || read(fd, b, sizeof(b)) != (ssize_t)sizeof(b)) {
    if (fd >= 0) close(fd);
    return "";
  }
  close(fd);
  std::string s;
  char hex[3];
  for (unsigned char c : b) {
    snprintf(hex, sizeof(hex), "%02x", c);
    s += hex;
  }
  return s;
}

std::string Describe(int status) {
  char buf[128];
  if (WIFEXITED(status)) {
    snprintf(buf, sizeof(buf), "exited with status %d", WEXITSTATUS(status));
  } else if (WIFSIGNALED(status)) {
    snprintf(buf, sizeof(buf), "was killed by signal %d (%s)",
             WTERMSIG(status), strsignal(WTERMSIG(status)));
  } else {
    snprintf(buf, sizeof(buf), "ended with wait status 0x%x", status);
  }
  return buf;
}

// Each rank leads its own process group, so a signal reaches its children
// too, and a terminal's Ctrl-C reaches the ranks only through us (once).
// Running ranks only: an ended rank's group id may belong to someone else
// by now (what an ended rank left behind is ours: KillLeftovers).
void SignalAll(std::vector<Rank> &ranks, int sig) {
  for (Rank &r : ranks) {
    if (r.running) kill(-r.pid, sig);
  }
}

// Our children still alive once the ranks have ended: what the ranks left
// behind, which came to us as their subreaper. Killed and reaped, again
// while more arrive (their own orphans), within two seconds. Our unreaped
// children only, so no pid can belong to anyone else.
void KillLeftovers() {
  const pid_t self = getpid();
  const double until = NowS() + 2;
  for (;;) {
    int found = 0;
    if (DIR *d = opendir("/proc")) {
      while (struct dirent *e = readdir(d)) {
        const pid_t pid = (pid_t)atoi(e->d_name);
        if (pid <= 0) continue;
        char path[64], line[512];
        snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
        FILE *f = fopen(path, "r");
        if (f == nullptr) continue;
        size_t len = fread(line, 1, sizeof(line) - 1, f);
        fclose(f);
        line[len] = '\0';
        const char *close = strrchr(line, ')');  // the name may hold spaces
        int ppid = 0;
        if (close != nullptr && sscanf(close + 1, " %*c %d", &ppid) == 1 && ppid == self) {
          kill(pid, SIGKILL);
          found++;
        }
      }
      closedir(d);
    }
    while (waitpid(-1, nullptr, WNOHANG) > 0) {
    }
    if (found == 0 || NowS() >= until) return;
    usleep(20000);
  }
}

}  // namespace

int main(int argc, char **argv) {
  int n = -1;
  double timeout_s = 0, grace_s = 10;
  int i = 1;
  for (; i < argc; i++) {
    std::string a = argv[i];
    double v = 0;
    auto value = [&](const char *name) -> const char * {
      std::string eq = std::string(name) + "=";
      if (a.compare(0, eq.size(), eq) == 0) return argv[i] + eq.size();
      if (a == name && i + 1 < argc) return argv[++i];
      return nullptr;
    };
    const char *s;
    if (a == "--") {
      i++;
      break;
    } else if ((s = value("-n")) != nullptr || (s = value("--n")) != nullptr ||
               (s = value("--np")) != nullptr) {
      if (!ParseNum(s, 1, 1024, &v) || v != (int)v) {
        fprintf(stderr, "moe_ep_run: -n %s: expected an integer in 1..1024\n", s);
        return 2;
      }
      n = (int)v;
    } else if ((s = value("--timeout_s")) != nullptr) {
      if (!ParseNum(s, 0, 1e7, &v)) {
        fprintf(stderr, "moe_ep_run: --timeout_s %s: expected seconds >= 0\n", s);
        return 2;
      }
      timeout_s = v;
    } else if ((s = value("--grace_s")) != nullptr) {
      if (!ParseNum(s, 0, 1e6, &v)) {
        fprintf(stderr, "moe_ep_run: --grace_s %s: expected seconds >= 0\n", s);
        return 2;
      }
      grace_s = v;
    } else if (a == "-h" || a == "--help") {
      Usage();
      return 0;
    } else if (a == "-n" || a == "--n" || a == "--np" || a == "--timeout_s" ||
               a == "--grace_s") {
      fprintf(stderr, "moe_ep_run: %s needs a value\n", a.c_str());
      Usage();
      return 2;
    } else {
      fprintf(stderr, "moe_ep_run: unknown argument '%s'\n", a.c_str());
      Usage();
      return 2;
    }
  }
  if (n < 1) {
    fprintf(stderr, "moe_ep_run: -n N (the number of ranks) is required\n");
    Usage();
    return 2;
  }
  if (i >= argc) {
    fprintf(stderr, "moe_ep_run: no program to run; put it after --\n");
    Usage();
    return 2;
  }
  char **prog = argv + i;

  // Below the ephemeral range: a rank's own outgoing connections (NCCL's,
  // UCX's) cannot take the port before rank 0 listens on it.
  int port = moe_ep::free_loopback_port();
  if (port <= 0) {
    fprintf(stderr, "moe_ep_run: cannot find a free TCP port on 127.0.0.1: %s\n",
            strerror(errno));
    return 2;
  }
  std::string address = "127.0.0.1:" + std::to_string(port);
  const char *tok_env = getenv("MOE_EP_JOB_TOKEN");
  std::string token = tok_env != nullptr && *tok_env ? tok_env : RandomToken();
  if (token.empty()) {
    fprintf(stderr, "moe_ep_run: cannot read /dev/urandom for a job token\n");
    return 2;
  }

  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGHUP, &sa, nullptr);
  sigaction(SIGQUIT, &sa, nullptr);
  // An inherited SIG_IGN would have the kernel reap the ranks unseen.
  signal(SIGCHLD, SIG_DFL);
  // Orphaned descendants of a rank come back to us, not to init.
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  const pid_t launcher = getpid();

  std::vector<Rank> ranks(n);
  for (int r = 0; r < n; r++) {
    pid_t pid = fork();
    if (pid < 0) {
      fprintf(stderr, "moe_ep_run: fork for rank %d failed: %s\n", r,
              strerror(errno));
      SignalAll(ranks, SIGKILL);
      return 2;
    }
    if (pid == 0) {
      setpgid(0, 0);
      signal(SIGINT, SIG_DFL);
      signal(SIGTERM, SIG_DFL);
      signal(SIGHUP, SIG_DFL);
      signal(SIGQUIT, SIG_DFL);
      // Die with the launcher (even by SIGKILL), and not outlive it if it
      // died before this line.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != launcher) _exit(128 + SIGKILL);
      setenv("MOE_EP_RANK", std::to_string(r).c_str(), 1);
      setenv("MOE_EP_WORLD_SIZE", std::to_string(n).c_str(), 1);
      setenv("MOE_EP_LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("MOE_EP_LOCAL_WORLD_SIZE", std::to_string(n).c_str(), 1);
      setenv("MOE_EP_BOOTSTRAP_ADDRESS", address.c_str(), 1);
      setenv("MOE_EP_JOB_TOKEN", token.c_str(), 1);
      execvp(prog[0], prog);
      fprintf(stderr, "moe_ep_run: rank %d: cannot run %s: %s\n", r, prog[0],
              strerror(errno));
      _exit(127);
    }
    setpgid(pid, pid);  // also here: no race with the child's own call
    ranks[r].pid = pid;
    ranks[r].running = true;
  }

  const double start = NowS();
  double kill_at = 0;   // when the failure grace period ends
  double force_at = 0;  // SIGKILL after SIGTERM was ignored
  int first_failed = -1;
  bool timed_out = false;
  bool tearing_down = false;  // we signalled the ranks: deaths are expected
  int running = n;
  while (running > 0) {
    if (g_signal != 0) {
      int sig = g_signal;
      g_signal = 0;
      fprintf(stderr, "moe_ep_run: got signal %d (%s); forwarding to %d rank(s)\n",
              sig, strsignal(sig), running);
      SignalAll(ranks, sig);
      tearing_down = true;
      if (force_at == 0) force_at = NowS() + 10;
    }
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid < 0 && errno == ECHILD) {
      fprintf(stderr, "moe_ep_run: %d rank(s) gone without an exit status\n",
              running);
      for (Rank &r : ranks) {
        if (r.running) {
          r.running = false;
          r.status = 128 << 8;  // unknown: never success
        }
      }
      break;
    }
    if (pid > 0) {
      for (int r = 0; r < n; r++) {
        if (ranks[r].pid != pid || !ranks[r].running) continue;
        ranks[r].running = false;
        ranks[r].status = status;
        running--;
        bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (!ok) {
          fprintf(stderr, "moe_ep_run: rank %d (pid %d) %s\n", r, (int)pid,
                  Describe(status).c_str());
          if (first_failed < 0 && !tearing_down) {
            first_failed = r;
            if (running > 0) {
              fprintf(stderr,
                      "moe_ep_run: giving the other %d rank(s) %.1f s to "
                      "finish\n",
                      running, grace_s);
              kill_at = NowS() + grace_s;
            }
          }
        }
      }
      continue;
    }
    double now = NowS();
    if (timeout_s > 0 && !timed_out && now - start >= timeout_s) {
      timed_out = true;
      tearing_down = true;
      kill_at = 0;
      fprintf(stderr,
              "moe_ep_run: --timeout_s %.1f expired with %d rank(s) still "
              "running; killing them\n",
              timeout_s, running);
      SignalAll(ranks, SIGTERM);
      force_at = now + 2;
    }
    if (kill_at > 0 && now >= kill_at) {
      kill_at = 0;
      fprintf(stderr, "moe_ep_run: grace period over; terminating %d rank(s)\n",
              running);
      SignalAll(ranks, SIGTERM);
      force_at = now + 2;
    }
    if (force_at > 0 && now >= force_at) {
      force_at = 0;
      SignalAll(ranks, SIGKILL);
    }
    usleep(20000);
  }

  KillLeftovers();
  int code = 0;
  for (int r = 0; r < n; r++) {
    int st = ranks[r].status;
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) continue;
    if (code == 0) {
      code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
  }
  if (first_failed >= 0) {
    int st = ranks[first_failed].status;
    code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    fprintf(stderr, "moe_ep_run: job failed: rank %d %s first\n", first_failed,
            Describe(st).c_str());
  }
  if (timed_out) {
    fprintf(stderr, "moe_ep_run: job timed out after %.1f s\n", timeout_s);
    code = 124;
  } else if (code == 0 && tearing_down) {
    code = 128 + SIGTERM;  // interrupted: never report success
  }
  return code;
}
