// bench_ht.h: one high-throughput (prefill) case on the public API: whole
// dispatch (prepare + dispatch of x [T, H] with its top-k weights) and
// whole combine, timed per iteration with CUDA events on one stream; the
// NCCL all-to-all and peer-copy references of the same bytes; and, after
// the warm-up, a check of the dispatch's counts and rows and of the
// combine's output against the routing, so a wrong result is never timed.
#ifndef MOE_EP_TOOLS_BENCH_BENCH_HT_H_
#define MOE_EP_TOOLS_BENCH_BENCH_HT_H_

#include <string>
#include <vector>

#include "moe_ep.h"
#include "tools/bench/bench_case.h"
#include "tools/bench/bench_flags.h"
#include "tools/bench/bench_setup.h"

namespace mep_bench {

// The HT flag rules this build can tell before any GPU is touched (fp8 HT
// input and --graph need what moe_ep.h 0.3 adds); dies on a broken one.
void CheckHtFlags(const Plan& p, const std::string& dtype);

// Against the loaded plugin's version: whether dispatches take
// MOE_EP_FLAG_WORST_CASE (fixed-size outputs, no host sync); dies when the
// plan needs what the plugin lacks. *line: what the report says of it.
bool HtWorstCase(const Plan& p, int vmaj, int vmin, std::string* line);

// One HT case into st: bytes, inputs, moe-ep, then both references.
void MeasureHtCase(const Setup& s, const Buffers& b, moe_ep_group_t* group, const Traffic& tr,
                   int fp8, int hidden, int tokens, std::vector<double>* st);

}  // namespace mep_bench

#endif  // MOE_EP_TOOLS_BENCH_BENCH_HT_H_
