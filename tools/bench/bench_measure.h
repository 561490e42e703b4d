// bench_measure.h: the measurement of moe-ep itself for one LL case: whole
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

// recv_count of the last dispatch against the rows the routing sends each
// local expert (the same count in both modes), and the group's
// asynchronous error; dies on a difference.
void CheckRecvCount(const Setup& s, const Buffers& b, moe_ep_group_t* group, const Traffic& tr,
                    const char* dtype, int hidden, int tokens);

// Fills st's kDisp .. kCRecv (p50, p99) and kHostUsFull / kHostUsHalves.
void MeasureMoeEp(const Setup& s, const Buffers& b, moe_ep_group_t* group, const Traffic& tr,
                  int fp8, int hidden, int tokens, std::vector<double>* st);

// One LL case: bytes, inputs, moe-ep, then both references, into st.
void MeasureLlCase(const Setup& s, const Buffers& b, moe_ep_group_t* group, const Traffic& tr,
                   int fp8, int hidden, int tokens, std::vector<double>* st);

}  // namespace mep_bench

#endif  // MOE_EP_TOOLS_BENCH_BENCH_MEASURE_H_
