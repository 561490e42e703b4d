// worker_two_groups_threads.cc: two groups over the same ranks, each made,
// used and destroyed by a thread of its own in every rank, at the same
// time: the two group_create calls run concurrently (two gates, two
// bootstraps, two meshes in one process), then each thread runs LL layers
// on its group (every routing generator, direct and deferred) checked
// against the oracle. Entries on different groups never wait for each other
// (moe_ep.h, "threads"), so neither thread needs the other to progress. The
// groups run different shapes and seeds, so rows or signals delivered to
// the wrong group show as mismatches. --runs rounds, each on fresh groups
// (two --ports per round); --iterations passes over the generators each.
#include <cstdio>
#include <functional>
#include <string>
#include <thread>

#include "tests/host/worker_common.h"

namespace moe_ep_test {
namespace {

using moe_ep_oracle::Generator;

const Generator kGenerators[] = {Generator::kUniform, Generator::kSkewed, Generator::kAllToOneRank,
                                 Generator::kEmptyRanks, Generator::kMasked};

// The group of lane `lane` on 127.0.0.1:port. The address is set in the
// config struct rather than through MOE_EP_BOOTSTRAP_ADDRESS (as
// create_group_on_port does): setenv on one thread while the other reads
// the environment (config_from_yaml, group_create) is a data race.
moe_ep_group_t* create_on(Ctx& c, int lane, int port) {
  const std::string what =
      "lane " + std::to_string(lane) + " group_create on 127.0.0.1:" + std::to_string(port);
  moe_ep_config_t* cfg = nullptr;
  const std::string yaml = config_yaml(c.opt);
  c.checks++;
  if (c.api->config_from_yaml(yaml.c_str(), &cfg) != MOE_EP_OK) {
    fail(c, 0, what, std::string("config: ") + c.api->last_error());
    return nullptr;
  }
  std::snprintf(cfg->bootstrap_address, sizeof cfg->bootstrap_address, "127.0.0.1:%d", port);
  moe_ep_group_params_t gp = MOE_EP_INIT(moe_ep_group_params_t);
  gp.config = cfg;
  gp.rank = -1;
  gp.world_size = -1;
  gp.cuda_device = -1;
  moe_ep_group_t* g = nullptr;
  const moe_ep_status_t st = c.api->group_create(&gp, &g);
  c.api->config_free(cfg);
  if (!expect_status(c, 0, what, st, MOE_EP_OK)) return nullptr;
  moe_ep_group_info_t info = MOE_EP_INIT(moe_ep_group_info_t);
  c.api->group_info(g, &info);
  c.checks++;
  if (info.rank != c.rank || info.world_size != c.world) {
    fail(c, 0, what,
         "group_info says rank " + std::to_string(info.rank) + " of " +
             std::to_string(info.world_size) + ", expected rank " + std::to_string(c.rank) +
             " of " + std::to_string(c.world));
  }
  return g;
}

// One lane's round: its own group, its layer, its seeds. `c` is the lane's
// own Ctx (counts folded back after the join).
void lane_round(Ctx& c, int lane, int run, int port) {
  c.group = create_on(c, lane, port);
  if (c.group == nullptr) return;
  const auto& layer = c.opt.layers[lane % c.opt.layers.size()];
  for (int it = 0; it < c.opt.iterations && c.failures == 0; it++) {
    for (Generator g : kGenerators) {
      const int gi = static_cast<int>(g);
      const uint64_t seed = 7000 + 100000 * static_cast<uint64_t>(lane) +
                            1000 * static_cast<uint64_t>(run) + 10 * static_cast<uint64_t>(it) + gi;
      const bool defer = (it + gi + lane) % 2 == 1;
      ll_roundtrip(c, problem_for(c, layer.first, layer.second, g), seed, defer);
    }
  }
  const moe_ep_status_t st = c.api->group_destroy(c.group);
  c.group = nullptr;
  expect_status(c, 0, "lane " + std::to_string(lane) + " group_destroy", st, MOE_EP_OK);
}

}  // namespace

void run_two_groups_threads(Ctx& c) {
  const size_t need = 2 * static_cast<size_t>(c.opt.runs);
  c.checks++;
  if (c.opt.ports.size() < need) {
    fail(c, 0, c.opt.scenario,
         "needs " + std::to_string(need) + " --ports, got " + std::to_string(c.opt.ports.size()));
    return;
  }
  int passed = 0;
  for (int run = 0; run < c.opt.runs && c.failures == 0; run++) {
    Ctx lane[2] = {c, c};
    for (Ctx& l : lane) {
      l.group = nullptr;
      l.failures = 0;
      l.checks = 0;
    }
    std::thread second(lane_round, std::ref(lane[1]), 1, run, c.opt.ports[2 * run + 1]);
    lane_round(lane[0], 0, run, c.opt.ports[2 * run]);
    second.join();
    for (const Ctx& l : lane) {
      c.failures += l.failures;
      c.checks += l.checks;
    }
    passed += lane[0].failures == 0 && lane[1].failures == 0;
  }
  std::fprintf(stderr, "rank %d: %s: %d of %d runs passed\n", c.rank, c.opt.scenario.c_str(),
               passed, c.opt.runs);
}

}  // namespace moe_ep_test
