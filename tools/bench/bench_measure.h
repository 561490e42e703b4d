// bench_measure.h: the measurement of moe-ep itself for one case: whole
// dispatch (prepare + dispatch) and combine, then the send and receive
// halves through DEFER_RECV + hook_run; recv_count is checked against the
// routing after each warm-up, so a wrong result is never timed.
#ifndef MOE_EP_TOOLS_BENCH_BENCH_MEASURE_H_
#define MOE_EP_TOOLS_BENCH_BENCH_MEASURE_H_

#include <vector>

#include "moe_ep.h"
#include "tools/bench/bench_case.h"
#include "tools/bench/bench_setup.h"

namespace mep_bench {

// This rank's x, weights and topk_idx for the case, on the device.
void UploadInputs(const Setup& s, const Buffers& b, const Traffic& tr, int tokens, int hidden);

// Fills st's kDisp .. kCRecv (p50, p99) and kHostUsFull / kHostUsHalves.
void MeasureMoeEp(const Setup& s, const Buffers& b, moe_ep_group_t* group, const Traffic& tr,
                  int fp8, int hidden, int tokens, std::vector<double>* st);

}  // namespace mep_bench

#endif  // MOE_EP_TOOLS_BENCH_BENCH_MEASURE_H_
