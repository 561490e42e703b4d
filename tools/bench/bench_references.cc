// bench_references.cc: see bench_references.h.
#include "tools/bench/bench_references.h"

#include <functional>

#include "tools/bench/bench_util.h"

namespace mep_bench {

std::string PeerCopyTarget(const Setup& s, size_t bytes, Buffers* b) {
  b->copy_src = DevAlloc<uint8_t>(bytes);
  b->copy_dst = nullptr;
  if (s.peer_dev < 0) return "";
  std::string note;
  int can = 0;
  CUDA_CHECK(cudaDeviceCanAccessPeer(&can, s.dev, s.peer_dev));
  if (can) {
    cudaError_t e = cudaDeviceEnablePeerAccess(s.peer_dev, 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled) {
      (void)cudaGetLastError();
    } else {
      CUDA_CHECK(e);
    }
  } else {
    note = " (no peer access: staged copies, not a ceiling)";
  }
  CUDA_CHECK(cudaSetDevice(s.peer_dev));
  CUDA_CHECK(cudaMalloc(&b->copy_dst, bytes));
  CUDA_CHECK(cudaSetDevice(s.dev));
  return note;
}

Pct TimeAllToAll(const Setup& s, const Buffers& b, const std::vector<std::vector<int64_t>>& n,
                 size_t row, bool back) {
  const int R = s.world, rank = s.rank;
  cudaStream_t stream = s.stream;
  std::vector<size_t> sc(R), rc(R), so(R + 1, 0), ro(R + 1, 0);
  for (int p2 = 0; p2 < R; p2++) {
    // Forward (dispatch): I send my rows to p2, receive p2's rows for me;
    // back (combine): the reverse direction of the same rows.
    int64_t out_rows = back ? n[p2][rank] : n[rank][p2];
    int64_t in_rows = back ? n[rank][p2] : n[p2][rank];
    sc[p2] = p2 == rank ? 0 : out_rows * row;
    rc[p2] = p2 == rank ? 0 : in_rows * row;
    so[p2 + 1] = so[p2] + sc[p2];
    ro[p2 + 1] = ro[p2] + rc[p2];
  }
  if (so[R] > b.a2a_max || ro[R] > b.a2a_max) Die("internal: all-to-all buffers too small");
  // int8 counts: any byte count goes.
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
  return Percentiles(s.timer->Run(2, a2a, nullptr, nullptr)[0]);
}

void MeasureNcclAllToAll(const Setup& s, const Buffers& b, const Traffic& tr,
                         std::vector<double>* st) {
  // The dispatch (and the combine) bytes per peer, one row per (token,
  // expert): what a plain all-to-all dispatch moves; then the dispatch rows
  // once per (token, destination rank), the bytes moe-ep's dispatch moves
  // since it deduplicates.
  SetTime(st, kA2aD, TimeAllToAll(s, b, tr.pairs, tr.row_disp, false));
  SetTime(st, kA2aC, TimeAllToAll(s, b, tr.pairs, tr.row_comb, true));
  SetTime(st, kA2aDedup, TimeAllToAll(s, b, tr.toks, tr.row_disp, false));
}

void MeasurePeerCopy(const Setup& s, const Buffers& b, std::vector<double>* stats) {
  // This rank's dispatch bytes to the next GPU, every rank at once.
  const double bytes = (*stats)[kBytesPeer];
  if (s.peer_dev < 0 || bytes <= 0) return;
  const size_t n = static_cast<size_t>(bytes);
  auto copy = [&](int, const std::function<void(int)>& rec) {
    rec(0);
    CUDA_CHECK(cudaMemcpyPeerAsync(b.copy_dst, s.peer_dev, b.copy_src, s.dev, n, s.stream));
    rec(1);
  };
  // Peer copies to another process's memory cannot be captured: the
  // ceiling is always timed with eager launches.
  SetTime(stats, kPeer, Percentiles(s.timer->Run(2, copy, nullptr, nullptr, false)[0]));
}

}  // namespace mep_bench
