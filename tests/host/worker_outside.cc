// worker_outside.cc: what an engine does between moe-ep calls: waiting in
// a collective of its own (here a barrier on files, which never calls into
// moe-ep), and forming further groups on ports of their own.
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/host/worker_common.h"

namespace moe_ep_test {

static bool exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

// Marks this rank's arrival at `name`, then waits for `ranks`.
static bool arrive_and_wait(Ctx& c, const std::string& name, const std::vector<int>& ranks) {
  if (c.opt.barrier_dir.empty()) {
    fail(c, 0, "outside barrier " + name, "--barrier_dir is not set");
    return false;
  }
  std::string base = c.opt.barrier_dir + "/" + name + ".";
  std::ofstream(base + std::to_string(c.rank)).put('x');
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  for (int r : ranks) {
    while (!exists(base + std::to_string(r))) {
      if (std::chrono::steady_clock::now() > deadline) {
        fail(c, 0, "outside barrier " + name, "rank " + std::to_string(r) +
                                                  " did not arrive within 120 s");
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  return true;
}

static std::vector<int> span(int from, int to) {
  std::vector<int> v;
  for (int r = from; r < to; r++) v.push_back(r);
  return v;
}

bool outside_barrier(Ctx& c, const std::string& name) {
  return arrive_and_wait(c, name, span(0, c.world));
}

bool outside_barrier_first(Ctx& c, const std::string& name, int ranks) {
  return arrive_and_wait(c, name, span(0, ranks));
}

bool outside_barrier_among(Ctx& c, const std::string& name, const std::vector<int>& ranks) {
  return arrive_and_wait(c, name, ranks);
}

bool outside_barrier_without(Ctx& c, const std::string& name, int absent) {
  std::vector<int> ranks;
  for (int r = 0; r < c.world; r++) {
    if (r != absent) ranks.push_back(r);
  }
  return arrive_and_wait(c, name, ranks);
}

bool outside_wait_for(Ctx& c, const std::string& name, int rank) {
  return arrive_and_wait(c, name, {rank});
}

void outside_announce_pid(Ctx& c, const std::string& name) {
  // Written whole, then renamed: a reader never sees a partial number.
  std::string path = c.opt.barrier_dir + "/" + name + "." + std::to_string(c.rank);
  std::ofstream(path + ".tmp") << getpid() << "\n";
  std::rename((path + ".tmp").c_str(), path.c_str());
}

// True once `pid` has ended: no /proc entry (reaped), or a zombie (its
// exit, which closes its sockets, is done; the driver reaps it later).
static bool ended(long pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(f, stat)) return true;
  size_t close = stat.rfind(')');  // the command name may hold anything
  if (close == std::string::npos || close + 2 >= stat.size()) return false;
  char state = stat[close + 2];
  return state == 'Z' || state == 'X';
}

bool outside_wait_ended(Ctx& c, const std::string& name, int rank) {
  std::string what = "waiting for rank " + std::to_string(rank) + " to end";
  if (c.opt.barrier_dir.empty()) {
    fail(c, 0, what, "--barrier_dir is not set");
    return false;
  }
  std::string path = c.opt.barrier_dir + "/" + name + "." + std::to_string(rank);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  long pid = 0;
  while (pid <= 0 || !ended(pid)) {
    if (pid <= 0) std::ifstream(path) >> pid;
    if (std::chrono::steady_clock::now() > deadline) {
      fail(c, 0, what,
           pid <= 0 ? "it announced no pid at " + name + " within 120 s"
                    : "its process " + std::to_string(pid) + " was still running after 120 s");
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

moe_ep_group_t* create_group_on_port(Ctx& c, int port) {
  // The environment overrides the config's key; config_from_yaml reads it.
  std::string addr = "127.0.0.1:" + std::to_string(port);
  setenv("MOE_EP_BOOTSTRAP_ADDRESS", addr.c_str(), 1);
  moe_ep_config_t* cfg = nullptr;
  std::string yaml = config_yaml(c.opt);
  moe_ep_group_t* g = nullptr;
  if (c.api->config_from_yaml(yaml.c_str(), &cfg) != MOE_EP_OK) {
    fail(c, 0, "config for a group on " + addr, c.api->last_error());
    return nullptr;
  }
  moe_ep_group_params_t gp = MOE_EP_INIT(moe_ep_group_params_t);
  gp.config = cfg;
  gp.rank = -1;
  gp.world_size = -1;
  gp.cuda_device = -1;
  moe_ep_status_t st = c.api->group_create(&gp, &g);
  c.api->config_free(cfg);
  c.checks++;
  if (st != MOE_EP_OK) {
    fail(c, 0, "group_create on " + addr,
         std::string(c.api->status_string(st)) + ": " + c.api->last_error());
    return nullptr;
  }
  return g;
}

}  // namespace moe_ep_test
