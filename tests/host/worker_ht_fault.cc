// worker_ht_fault.cc: a rank (--victim) dies (SIGKILL) around an HT
// prepare. On the host backend that prepare exchanges every rank's counts
// through the bootstrap's collectives (rank 0 gathers and answers), where a
// peer that dies turns into MOE_EP_ERR_PEER_FAILED naming it on every
// survivor (runtime/bootstrap.h), bounded by bootstrap.timeout_ms. Every
// survivor must get that status naming the victim, find the group failed
// afterwards, destroy it and exit 0. --fault_at says when the victim dies:
//   before:  before any survivor calls prepare (they start only once its
//            process has ended);
//   waiting: without calling prepare, once every survivor is about to call
//            it (so most of them wait in the exchange when it dies);
//   inside:  inside its own prepare, run on a second thread; one survivor
//            calls prepare only once the victim's process has ended, so the
//            exchange cannot complete while the victim lives.
// Inside, the victim's counts may have reached rank 0 before it died: the
// exchange then has every rank's part and may complete, and the survivors
// must hear of the death from the next call (the HT dispatch) instead. The
// bootstrap allows exactly that (bootstrap_coll.c, root_deliver: a rank
// that dies after contributing surfaces in the next operation).
#include <chrono>
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "tests/host/ht_call.h"
#include "tests/host/worker_common.h"

namespace moe_ep_test {
namespace {

using moe_ep_oracle::Generator;

// One verified HT round trip: the group, and its count exchange, work.
bool ht_works(Ctx& c, const moe_ep_oracle::Problem& p, uint64_t seed) {
  HtCall call(c, p, seed);
  if (call.prepare() != MOE_EP_OK) return false;
  if (!expect_status(c, seed, "ht dispatch before the fault", call.dispatch(0, call.num_recv()),
                     MOE_EP_OK)) {
    return false;
  }
  call.check_dispatch();
  if (!expect_status(c, seed, "ht combine before the fault", call.combine(0, call.num_recv()),
                     MOE_EP_OK)) {
    return false;
  }
  call.check_combine();
  return c.failures == 0;
}

// A survivor's verdict on the call that had to report the death: status
// PEER_FAILED and a sentence naming the victim as the rank that died or
// failed. `msg` is that call's last_error.
void check_reported(Ctx& c, uint64_t seed, const std::string& what, moe_ep_status_t st,
                    const std::string& msg, int victim) {
  c.checks++;
  const std::string want =
      "MOE_EP_ERR_PEER_FAILED naming rank " + std::to_string(victim) + " as died or failed";
  if (st != MOE_EP_ERR_PEER_FAILED) {
    fail(c, seed, what,
         std::string("status ") + c.api->status_string(st) + ", expected " + want +
             " (last_error: " + msg + ")");
  } else if (!names_dead_rank(msg, victim)) {
    fail(c, seed, what, "last_error \"" + msg + "\", expected " + want);
  }
}

// The victim's part: never returns.
[[noreturn]] void die(Ctx& c, HtCall& call, const std::vector<int>& early) {
  const std::string& at = c.opt.fault_at;
  if (at != "before") outside_barrier_among(c, "ht_prepare", early);
  if (at == "inside") {
    // Its prepare blocks in the exchange: one survivor holds back until
    // this process has ended. The pause only makes it likely that its
    // counts are on the wire when it dies; no check depends on it.
    std::thread([&call] { call.prepare(false); }).detach();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  outside_announce_pid(c, "ht_victim");
  std::raise(SIGKILL);
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

}  // namespace

void run_ht_prepare_fault(Ctx& c) {
  const std::string& at = c.opt.fault_at;
  c.checks++;
  if (!c.opt.ht || (at != "before" && at != "waiting" && at != "inside")) {
    const std::string got = std::string(c.opt.ht ? "ht" : "ll") + " mode, --fault_at=" + at;
    fail(c, 0, "htfault", "expected --mode=ht and --fault_at=before|waiting|inside, got " + got);
    return;
  }
  const int victim = fault_victim(c);
  if (victim < 0) return;
  const auto& layer = c.opt.layers[0];
  auto p = problem_for(c, layer.first, layer.second, Generator::kUniform);
  if (!ht_works(c, p, 41)) return;
  // Inside, the first survivor holds back; the others call prepare at once.
  // With a victim other than rank 0 that is rank 0 itself, which gathers
  // the counts: it may find the victim's part already in beside its dead
  // connection (the case the header allows to complete).
  const int late = victim == 0 ? 1 : 0;
  std::vector<int> early;
  for (int r = 0; r < c.world; r++) {
    if (r != victim && (at != "inside" || r != late)) early.push_back(r);
  }
  HtCall call(c, p, 42);
  if (c.rank == victim) die(c, call, early);
  const bool wait_for_death = at == "before" || (at == "inside" && c.rank == late);
  if (wait_for_death && !outside_wait_ended(c, "ht_victim", victim)) return;
  if (!wait_for_death) outside_barrier_among(c, "ht_prepare", {});  // arrived
  const auto start = std::chrono::steady_clock::now();
  moe_ep_status_t st = call.prepare(false);
  std::string msg = c.api->last_error();
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr, "rank %d: ht prepare, rank %d dead (%s): %s after %.0f ms: %s\n", c.rank,
               victim, at.c_str(), c.api->status_string(st), ms,
               st == MOE_EP_OK ? "" : msg.c_str());
  const std::string dead = "rank " + std::to_string(victim) + " dead";
  if (st == MOE_EP_OK && at == "inside") {
    // Every rank's counts had arrived: the death is the dispatch's to tell.
    st = call.dispatch(0, call.num_recv());
    msg = c.api->last_error();
    std::fprintf(stderr, "rank %d: ht dispatch after it: %s: %s\n", c.rank,
                 c.api->status_string(st), msg.c_str());
    check_reported(c, 42, "ht dispatch after a complete exchange, " + dead, st, msg, victim);
  } else {
    check_reported(c, 42, "ht prepare, " + dead + " (" + at + ")", st, msg, victim);
  }
  st = c.api->group_poll_error(c.group);
  check_reported(c, 42, "group_poll_error after the fault", st, c.api->last_error(), victim);
  // Every survivor stays until all have heard (as worker_fault.cc): one
  // that left at once would be a lost peer, or a lost rank 0, to the rest.
  outside_barrier_without(c, "ht_fault_noticed", victim);
}

}  // namespace moe_ep_test
