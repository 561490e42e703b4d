// bench_references.h: the two references every case is compared with, on
// the same routing and byte counts: NCCL's host-initiated all-to-all
// (ncclGroupStart + ncclSend/ncclRecv on the bench's own communicator) and
// the peer-copy ceiling (cudaMemcpyPeerAsync to the next GPU, all ranks at
// once).
#ifndef MOE_EP_TOOLS_BENCH_BENCH_REFERENCES_H_
#define MOE_EP_TOOLS_BENCH_BENCH_REFERENCES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "tools/bench/bench_case.h"
#include "tools/bench/bench_setup.h"
#include "tools/bench/bench_timer.h"

namespace mep_bench {

// The peer-copy ceiling's buffers, `bytes` each: a source here, a target on
// peer_dev (peer access enabled where the GPUs allow it). Returns a note
// for this rank's device line.
std::string PeerCopyTarget(const Setup& s, size_t bytes, Buffers* b);

// NCCL's all-to-all of n[rank][p] rows of `row` bytes to each peer p,
// receiving n[p][rank] from it; back: the reverse direction of the same
// rows (a combine). Skips this rank's own rows.
Pct TimeAllToAll(const Setup& s, const Buffers& b, const std::vector<std::vector<int64_t>>& n,
                 size_t row, bool back);
// LL: fills st's kA2aD, kA2aC and kA2aDedup (p50, p99).
void MeasureNcclAllToAll(const Setup& s, const Buffers& b, const Traffic& tr,
                         std::vector<double>* st);
// Fills st's kPeer (p50, p99) when there is a peer and bytes to copy.
void MeasurePeerCopy(const Setup& s, const Buffers& b, std::vector<double>* st);

}  // namespace mep_bench

#endif  // MOE_EP_TOOLS_BENCH_BENCH_REFERENCES_H_
