// bench_flags.h: moe_ep_bench's command-line flags (defined in
// bench_flags.cc; `moe_ep_bench --help` lists them) and the checked plan
// they give.
#ifndef MOE_EP_TOOLS_BENCH_BENCH_FLAGS_H_
#define MOE_EP_TOOLS_BENCH_BENCH_FLAGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/flags/declare.h"

ABSL_DECLARE_FLAG(std::string, plugin);
ABSL_DECLARE_FLAG(std::string, mode);
ABSL_DECLARE_FLAG(std::vector<std::string>, tokens);
ABSL_DECLARE_FLAG(std::vector<std::string>, hidden);
ABSL_DECLARE_FLAG(int32_t, top_k);
ABSL_DECLARE_FLAG(int32_t, experts);
ABSL_DECLARE_FLAG(std::string, dtype);
ABSL_DECLARE_FLAG(int32_t, iters);
ABSL_DECLARE_FLAG(int32_t, warmup);
ABSL_DECLARE_FLAG(std::string, transport);
ABSL_DECLARE_FLAG(std::string, json);
ABSL_DECLARE_FLAG(uint64_t, seed);
ABSL_DECLARE_FLAG(double, routing_skew);
ABSL_DECLARE_FLAG(bool, sync_each_iter);
ABSL_DECLARE_FLAG(bool, graph);
ABSL_DECLARE_FLAG(bool, adopt_comm);
ABSL_DECLARE_FLAG(bool, dispatch_weights);
ABSL_DECLARE_FLAG(int32_t, num_sms);
ABSL_DECLARE_FLAG(int32_t, id_wait_s);

namespace mep_bench {

// The flags, checked against each other and the rank count, with the
// mode's defaults filled in; the run's constants.
struct Plan {
  bool ht = false;                   // --mode=ht: high-throughput groups
  std::vector<int> tokens, hidden, dtypes;  // dtypes: 1 = fp8
  int top_k, experts, iters, warmup, max_tokens, max_hidden;
  uint64_t seed;
  double routing_skew;  // --routing_skew: 0 uniform
  std::string transport;
};

// Dies with a sentence naming the flag on the first bad value (before any
// GPU is touched).
Plan ParseFlags(int world);

}  // namespace mep_bench

#endif  // MOE_EP_TOOLS_BENCH_BENCH_FLAGS_H_
