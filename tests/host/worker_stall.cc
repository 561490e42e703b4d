// worker_stall.cc: one rank stops at an NCCL setup step for longer than
// bootstrap.timeout_ms (the stand-in NCCL of tests/gpu/nccl_stall_shim.c,
// MEP_STALL=RANK:CALL:NTH:MS). Every other rank's group_create must return
// MOE_EP_ERR_TIMEOUT naming itself, the step and the bound, before the
// stalled rank would have arrived (it did not wait for it); the stalled
// rank's own group_create must fail too, naming itself.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tests/host/worker_common.h"

namespace moe_ep_test {

int expect_setup_stall(Ctx& c, moe_ep_status_t st, const std::string& msg, double ms) {
  const char* spec = std::getenv("MEP_STALL");
  const char* env_rank = std::getenv("MOE_EP_RANK");
  int stalled = -1, nth = 0, stall_ms = 0;
  char call[64] = {0};
  if (spec == nullptr || env_rank == nullptr ||
      std::sscanf(spec, "%d:%63[^:]:%d:%d", &stalled, call, &nth, &stall_ms) != 4) {
    std::fprintf(stderr, "FAIL setup_stall: needs MEP_STALL=RANK:CALL:NTH:MS and MOE_EP_RANK\n");
    return 1;
  }
  const int rank = std::atoi(env_rank);
  // The others fail in NCCL setup; the stalled rank fails wherever its
  // late step finds the others gone.
  const std::string me = (rank != stalled ? "NCCL setup on rank " : "rank ") + std::to_string(rank);
  std::string why;
  if (c.group != nullptr) {
    why = "group_create succeeded";
    c.api->group_destroy(c.group);
    c.group = nullptr;
  } else if (msg.find(me) == std::string::npos) {
    why = "the sentence does not name \"" + me + "\"";
  } else if (rank != stalled) {
    const std::string bound = "bootstrap.timeout_ms=" + std::to_string(c.opt.boot_ms);
    if (std::string(c.api->status_string(st)) != "MOE_EP_ERR_TIMEOUT")
      why = "status is not MOE_EP_ERR_TIMEOUT";
    else if (msg.find(bound) == std::string::npos)
      why = "the sentence does not name \"" + bound + "\"";
    else if (ms >= stall_ms)
      why = "it took " + std::to_string(ms) + " ms, not less than the stall of " +
            std::to_string(stall_ms) + " ms: it waited for the stalled rank";
  }
  std::fprintf(stderr, "%s rank=%d setup_stall (rank %d stops at %s call %d): %.0f ms: %s: %s\n",
               why.empty() ? "PASSED" : "FAIL", rank, stalled, call, nth, ms,
               c.api->status_string(st), msg.c_str());
  if (!why.empty()) std::fprintf(stderr, "  %s\n", why.c_str());
  return why.empty() ? 0 : 1;
}

}  // namespace moe_ep_test
