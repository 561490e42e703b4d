// worker_outside.cc: what an engine does between moe-ep calls: waiting in
// a collective of its own (here a barrier on files, which never calls into
// moe-ep), and forming further groups on ports of their own.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include <sys/stat.h>

#include "tests/host/worker_common.h"

namespace moe_ep_test {

static bool exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

// Marks this rank's arrival at `name`, then waits for ranks [from, to).
static bool arrive_and_wait(Ctx& c, const std::string& name, int from, int to) {
  if (c.opt.barrier_dir.empty()) {
    fail(c, 0, "outside barrier " + name, "--barrier_dir is not set");
    return false;
  }
  std::string base = c.opt.barrier_dir + "/" + name + ".";
  std::ofstream(base + std::to_string(c.rank)).put('x');
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  for (int r = from; r < to; r++) {
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

bool outside_barrier(Ctx& c, const std::string& name) {
  return arrive_and_wait(c, name, 0, c.world);
}

bool outside_barrier_first(Ctx& c, const std::string& name, int ranks) {
  return arrive_and_wait(c, name, 0, ranks);
}

bool outside_wait_for(Ctx& c, const std::string& name, int rank) {
  return arrive_and_wait(c, name, rank, rank + 1);
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
