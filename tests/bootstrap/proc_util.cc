// proc_util.cc: fork/exec, output capture and bounded waits for the
// multi-process bootstrap tests.
#include "tests/bootstrap/proc_util.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>

extern char **environ;

namespace mep_test {

int64_t NowMs() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

bool Proc::Exited(int code) const {
  return !running && WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == code;
}

bool Proc::Signaled(int sig) const {
  return !running && WIFSIGNALED(wait_status) && WTERMSIG(wait_status) == sig;
}

std::string Proc::Describe() const {
  char how[128];
  if (running) {
    snprintf(how, sizeof(how), "still running");
  } else if (killed_by_us) {
    snprintf(how, sizeof(how), "hung: killed by the test at its deadline");
  } else if (WIFEXITED(wait_status)) {
    snprintf(how, sizeof(how), "exit %d", WEXITSTATUS(wait_status));
  } else if (WIFSIGNALED(wait_status)) {
    snprintf(how, sizeof(how), "signal %d", WTERMSIG(wait_status));
  } else {
    snprintf(how, sizeof(how), "wait status 0x%x", wait_status);
  }
  return name + " [" + how + ", " + std::to_string(end_ms - start_ms) +
         " ms]\n  stdout: " + out + "  stderr: " + err;
}

std::map<std::string, std::string> Proc::Result() const {
  std::map<std::string, std::string> kv;
  size_t at = out.find("RESULT ");
  if (at == std::string::npos) return kv;
  size_t end = out.find('\n', at);
  std::string line = out.substr(at + 7, end == std::string::npos ? end : end - at - 7);
  size_t pos = 0;
  while (pos < line.size()) {
    size_t eq = line.find('=', pos);
    if (eq == std::string::npos) break;
    std::string key = line.substr(pos, eq - pos);
    if (key == "msg") {  // the message is the rest of the line
      kv[key] = line.substr(eq + 1);
      break;
    }
    size_t sp = line.find(' ', eq);
    if (sp == std::string::npos) sp = line.size();
    kv[key] = line.substr(eq + 1, sp - eq - 1);
    pos = sp + 1;
  }
  return kv;
}

int64_t Proc::ResultInt(const std::string &key) const {
  auto kv = Result();
  auto it = kv.find(key);
  return it == kv.end() ? -1 : atoll(it->second.c_str());
}

Proc Spawn(const std::string &name, const std::vector<std::string> &argv,
           const std::vector<std::string> &env) {
  Proc p;
  p.name = name;
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
    p.err = std::string("pipe: ") + strerror(errno);
    return p;
  }
  std::vector<std::string> envs;
  for (char **e = environ; *e != nullptr; e++) envs.push_back(*e);
  for (const std::string &e : env) envs.push_back(e);
  std::vector<char *> cargv, cenv;
  for (const std::string &a : argv) cargv.push_back(const_cast<char *>(a.c_str()));
  cargv.push_back(nullptr);
  // getenv returns the first match: reversed, the overrides come first.
  for (size_t i = envs.size(); i-- > 0;) {
    cenv.push_back(const_cast<char *>(envs[i].c_str()));
  }
  cenv.push_back(nullptr);
  p.start_ms = NowMs();
  pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], 1);
    dup2(err[1], 2);
    execve(cargv[0], cargv.data(), cenv.data());
    fprintf(stderr, "execve %s: %s\n", cargv[0], strerror(errno));
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  p.pid = pid;
  p.out_fd = out[0];
  p.err_fd = err[0];
  p.running = pid > 0;
  fcntl(p.out_fd, F_SETFL, O_NONBLOCK);
  fcntl(p.err_fd, F_SETFL, O_NONBLOCK);
  return p;
}

static void Drain(int *fd, std::string *to) {
  if (*fd < 0) return;
  char buf[4096];
  for (;;) {
    ssize_t n = read(*fd, buf, sizeof(buf));
    if (n > 0) {
      to->append(buf, (size_t)n);
      continue;
    }
    if (n == 0) {
      close(*fd);
      *fd = -1;
    }
    return;
  }
}

void WaitAll(std::vector<Proc *> procs, int64_t deadline_ms) {
  for (;;) {
    int running = 0;
    for (Proc *p : procs) {
      Drain(&p->out_fd, &p->out);
      Drain(&p->err_fd, &p->err);
      if (!p->running) continue;
      int st = 0;
      if (waitpid(p->pid, &st, WNOHANG) == p->pid) {
        p->running = false;
        p->wait_status = st;
        p->end_ms = NowMs();
      } else {
        running++;
      }
    }
    if (running == 0) break;
    if (NowMs() >= deadline_ms) {
      for (Proc *p : procs) {
        if (!p->running) continue;
        kill(p->pid, SIGKILL);
        waitpid(p->pid, &p->wait_status, 0);
        p->running = false;
        p->killed_by_us = true;
        p->end_ms = NowMs();
      }
      break;
    }
    usleep(5000);
  }
  // Output written just before exit is still in the pipes.
  for (Proc *p : procs) {
    for (int i = 0; i < 50 && (p->out_fd >= 0 || p->err_fd >= 0); i++) {
      Drain(&p->out_fd, &p->out);
      Drain(&p->err_fd, &p->err);
      if (p->out_fd >= 0 || p->err_fd >= 0) usleep(2000);
    }
    if (p->out_fd >= 0) close(p->out_fd);
    if (p->err_fd >= 0) close(p->err_fd);
    p->out_fd = p->err_fd = -1;
  }
}

void WaitOne(Proc *p, int64_t deadline_ms) { WaitAll({p}, deadline_ms); }

int WaitAny(std::vector<Proc *> procs, int64_t deadline_ms) {
  while (NowMs() < deadline_ms) {
    for (size_t i = 0; i < procs.size(); i++) {
      Proc *p = procs[i];
      Drain(&p->out_fd, &p->out);
      Drain(&p->err_fd, &p->err);
      int st = 0;
      if (p->running && waitpid(p->pid, &st, WNOHANG) == p->pid) {
        p->running = false;
        p->wait_status = st;
        p->end_ms = NowMs();
        WaitOne(p, NowMs() + 1000);  // collect the rest of its output
        return (int)i;
      }
    }
    usleep(5000);
  }
  return -1;
}

void KillNow(Proc *p, int sig) {
  if (p->running) kill(p->pid, sig);
  WaitOne(p, NowMs() + 5000);
}

std::string Runfile(const std::string &path) {
  // Bazel runs tests from the workspace's runfiles directory.
  const char *srcdir = getenv("TEST_SRCDIR");
  const char *ws = getenv("TEST_WORKSPACE");
  if (srcdir != nullptr && ws != nullptr) {
    std::string full = std::string(srcdir) + "/" + ws + "/" + path;
    if (access(full.c_str(), X_OK) == 0) return full;
  }
  return path;
}

std::vector<std::string> WorkerArgv(int rank, int world,
                                    const std::string &scenario,
                                    const std::string &address,
                                    const std::string &token, int timeout_ms) {
  std::vector<std::string> argv = {
      Runfile("tests/bootstrap/bootstrap_worker"), "--scenario=" + scenario,
      "--rank=" + std::to_string(rank), "--world=" + std::to_string(world),
      "--address=" + address, "--timeout_ms=" + std::to_string(timeout_ms)};
  argv.push_back(token.empty() ? "--no_token" : "--token=" + token);
  return argv;
}

}  // namespace mep_test
