// bench_references.h: the two references every case is compared with, on
// the same routing and byte counts: NCCL's host-initiated all-to-all
// (ncclGroupStart + ncclSend/ncclRecv on the bench's own communicator) and
// the peer-copy ceiling (cudaMemcpyPeerAsync to the next GPU, all ranks at
// once).
#ifndef MOE_EP_TOOLS_BENCH_BENCH_REFERENCES_H_
#define MOE_EP_TOOLS_BENCH_BENCH_REFERENCES_H_

#include <vector>

#include "tools/bench/bench_case.h"
#include "tools/bench/bench_setup.h"

namespace mep_bench {

// Fills st's kA2aD, kA2aC and kA2aDedup (p50, p99).
void MeasureNcclAllToAll(const Setup& s, const Buffers& b, const Traffic& tr,
                         std::vector<double>* st);
// Fills st's kPeer (p50, p99) when there is a peer and bytes to copy.
void MeasurePeerCopy(const Setup& s, const Buffers& b, std::vector<double>* st);

}  // namespace mep_bench

#endif  // MOE_EP_TOOLS_BENCH_BENCH_REFERENCES_H_
