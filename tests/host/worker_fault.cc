// worker_fault.cc: one rank (--victim, the last by default) dies (SIGKILL)
// in the middle of a layer call; every survivor must report
// MOE_EP_ERR_PEER_FAILED naming it (heard, not waited out), say that it
// died, keep reporting it, and destroy the group cleanly. Rank 0 is a
// victim of its own: it hosted the bootstrap's gate and is the hub of its
// collectives, which the survivors must not need to learn of its death.
#include <csignal>
#include <string>

#include "tests/host/ll_call.h"
#include "tests/host/worker_common.h"

namespace moe_ep_test {

int fault_victim(Ctx& c) {
  int victim = c.opt.victim >= 0 ? c.opt.victim : c.world - 1;
  c.checks++;
  if (victim < c.world) return victim;
  fail(c, 0, "--victim",
       "rank " + std::to_string(victim) + " is not in a group of " + std::to_string(c.world) +
           " ranks");
  return -1;
}

bool names_dead_rank(const std::string& msg, int rank) {
  const std::string r = "rank " + std::to_string(rank);
  return msg.find(r + " died") != std::string::npos || msg.find(r + " failed") != std::string::npos;
}

void run_fault(Ctx& c) {
  using moe_ep_oracle::Generator;
  auto p = problem_for(c, c.opt.layers[0].first, c.opt.layers[0].second, Generator::kUniform);
  ll_roundtrip(c, p, 21, false);  // the group works before the fault
  const int victim = fault_victim(c);
  if (victim < 0) return;
  LlCall call(c, p, 22);
  if (call.prepare() != MOE_EP_OK) return;
  if (c.rank == victim) std::raise(SIGKILL);
  moe_ep_status_t st = call.dispatch(0, nullptr);
  // Named as dead (its connection closed without a goodbye), by this rank:
  // heard from the closed connection, since a wait that ran out would say
  // TIMEOUT.
  std::string want_rank = "rank " + std::to_string(victim);
  std::string want_died = "rank " + std::to_string(c.rank) + " lost " + want_rank + ": " +
                          want_rank + " died";
  expect_status(c, 22, "dispatch with a dead peer", st, MOE_EP_ERR_PEER_FAILED, want_died.c_str());
  // "rank N died", not "rank N" alone, which a sentence holds for other
  // reasons too when N is 0 ("rank 0 reports").
  const std::string still_dead = want_rank + " died";
  expect_status(c, 22, "poll_error after the fault", c.api->group_poll_error(c.group),
                MOE_EP_ERR_PEER_FAILED, still_dead.c_str());
  // Stay up until every survivor has noticed the victim, as an engine
  // would: a survivor that exits at once is itself a lost peer to the ranks
  // that have not (the host mesh does not forward who failed first).
  outside_barrier_without(c, "fault_noticed", victim);
}

}  // namespace moe_ep_test
