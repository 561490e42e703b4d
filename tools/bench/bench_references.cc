// bench_references.cc: see bench_references.h.
#include "tools/bench/bench_references.h"

#include <functional>

#include "tools/bench/bench_util.h"

namespace mep_bench {

void MeasureNcclAllToAll(const Setup& s, const Buffers& b, const Traffic& tr,
                         std::vector<double>* stats) {
  std::vector<double>& st = *stats;
  const int R = s.world, rank = s.rank;
  cudaStream_t stream = s.stream;
  // NCCL all-to-all of the dispatch (and the combine) bytes per peer, one
  // row per (token, expert): what a plain all-to-all dispatch moves; int8
  // counts. which == 2: the dispatch rows once per (token, destination
  // rank), the bytes moe-ep's dispatch moves since it deduplicates.
  for (int which = 0; which < 3; which++) {
    const size_t row = which == 1 ? tr.row_comb : tr.row_disp;
    const std::vector<std::vector<int64_t>>& n = which == 2 ? tr.toks : tr.pairs;
    std::vector<size_t> sc(R), rc(R), so(R + 1, 0), ro(R + 1, 0);
    for (int p2 = 0; p2 < R; p2++) {
      // dispatch: I send my rows to p2, receive p2's rows for me;
      // combine: the reverse direction of the same pairs.
      int64_t out_pairs = which != 1 ? n[rank][p2] : n[p2][rank];
      int64_t in_pairs = which != 1 ? n[p2][rank] : n[rank][p2];
      sc[p2] = p2 == rank ? 0 : out_pairs * row;
      rc[p2] = p2 == rank ? 0 : in_pairs * row;
      so[p2 + 1] = so[p2] + sc[p2];
      ro[p2 + 1] = ro[p2] + rc[p2];
    }
    if (so[R] > b.a2a_max || ro[R] > b.a2a_max) Die("internal: all-to-all buffers too small");
    auto a2a = [&](int, const std::function<void(int)>& rec) {
      rec(0);
      NCCL_CHECK(ncclGroupStart());
      for (int p2 = 0; p2 < R; p2++) {
        if (sc[p2]) NCCL_CHECK(ncclSend(b.a2a_send + so[p2], sc[p2], ncclInt8, p2, s.ref->comm, stream));
        if (rc[p2]) NCCL_CHECK(ncclRecv(b.a2a_recv + ro[p2], rc[p2], ncclInt8, p2, s.ref->comm, stream));
      }
      NCCL_CHECK(ncclGroupEnd());
      rec(1);
    };
    auto seg = s.timer->Run(2, a2a, nullptr, nullptr);
    Pct p = Percentiles(seg[0]);
    int k = which == 0 ? kA2aD : which == 1 ? kA2aC : kA2aDedup;
    st[2 * k] = p.p50;
    st[2 * k + 1] = p.p99;
  }
}

void MeasurePeerCopy(const Setup& s, const Buffers& b, std::vector<double>* stats) {
  std::vector<double>& st = *stats;
  // This rank's dispatch bytes to the next GPU, every rank at once.
  if (s.peer_dev < 0 || st[kBytesPeer] <= 0) return;
  const size_t n = static_cast<size_t>(st[kBytesPeer]);
  auto copy = [&](int, const std::function<void(int)>& rec) {
    rec(0);
    CUDA_CHECK(cudaMemcpyPeerAsync(b.copy_dst, s.peer_dev, b.copy_src, s.dev, n, s.stream));
    rec(1);
  };
  // Peer copies to another process's memory cannot be captured: the
  // ceiling is always timed with eager launches.
  auto seg = s.timer->Run(2, copy, nullptr, nullptr, false);
  Pct p = Percentiles(seg[0]);
  st[2 * kPeer] = p.p50;
  st[2 * kPeer + 1] = p.p99;
}

}  // namespace mep_bench
