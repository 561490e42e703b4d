// worker_timeout.cc: the last rank skips one dispatch (it stays alive). The
// others' bounded waits expire: the call itself (host backend, and an HT
// dispatch on the nccl backend, which waits for its kernel) or the next
// call / group_poll_error (an LL dispatch on the nccl backend: the kernel
// records it and exits) returns MOE_EP_ERR_TIMEOUT naming the rank that
// did not take part. HT runs it on the nccl backend only: the host backend
// exchanges HT counts in prepare through the bootstrap's collectives, where
// an absent rank shows as that collective's failure instead.
#include <string>

#include "tests/host/ht_call.h"
#include "tests/host/ll_call.h"
#include "tests/host/worker_common.h"

namespace moe_ep_test {

namespace {

// One verified HT round trip on a fresh handle.
void ht_roundtrip_once(Ctx& c, const moe_ep_oracle::Problem& p, uint64_t seed) {
  HtCall call(c, p, seed);
  if (call.prepare() != MOE_EP_OK) return;
  if (!expect_status(c, seed, "ht dispatch", call.dispatch(0, call.num_recv()), MOE_EP_OK)) return;
  call.check_dispatch();
  if (expect_status(c, seed, "ht combine", call.combine(0, call.num_recv()), MOE_EP_OK))
    call.check_combine();
}

// The others' dispatch with the victim absent: its status, once the call
// (or, on an LL nccl group, the device and group_poll_error) has finished.
moe_ep_status_t dispatch_without(Ctx& c, const moe_ep_oracle::Problem& p) {
  if (c.opt.ht) {
    HtCall call(c, p, 32);
    moe_ep_status_t st = call.prepare(false);
    if (st != MOE_EP_OK) return st;
    return call.dispatch(0, static_cast<int64_t>(p.world) * p.max_tokens_per_rank);
  }
  LlCall call(c, p, 32);
  moe_ep_status_t st = call.prepare();
  if (st != MOE_EP_OK) return st;
  st = call.dispatch(0, nullptr);
  if (st == MOE_EP_OK) {
    call.check_dispatch_quietly();  // waits for the device; the data is incomplete
    st = c.api->group_poll_error(c.group);
  }
  return st;
}

}  // namespace

void run_skip(Ctx& c) {
  using moe_ep_oracle::Generator;
  auto p = problem_for(c, c.opt.layers[0].first, c.opt.layers[0].second, Generator::kUniform);
  if (c.opt.ht) {
    ht_roundtrip_once(c, p, 31);
  } else {
    ll_roundtrip(c, p, 31, false);
  }
  int victim = c.world - 1;
  if (c.rank == victim) {
    // Alive but absent from the operation: it stays connected until every
    // other rank has timed out and arrived here.
    outside_barrier(c, "skip_done");
    return;
  }
  std::string want = "rank " + std::to_string(victim);
  moe_ep_status_t st = dispatch_without(c, p);
  expect_status(c, 32, "dispatch with an absent peer", st, MOE_EP_ERR_TIMEOUT, want.c_str());
  if (c.opt.backend == "host") {  // alive and connected, not dead or ahead
    std::string absent = want + " is alive (connected) but did not take part";
    expect_status(c, 32, "dispatch with an absent peer", st, MOE_EP_ERR_TIMEOUT, absent.c_str());
  }
  // The failure sticks: later calls report it instead of touching peers.
  moe_ep_handle_t* h = nullptr;
  moe_ep_prepare_params_t pp = MOE_EP_INIT(moe_ep_prepare_params_t);
  expect_status(c, 33, "the next call after the timeout", c.api->prepare(c.group, &pp, &h),
                MOE_EP_ERR_TIMEOUT, want.c_str());
  // With three or more ranks the first to time out must not destroy its
  // group (main) while another still waits: that one would hear "rank 0
  // left", which is true but not what this scenario checks.
  outside_barrier(c, "skip_done");
}

}  // namespace moe_ep_test
