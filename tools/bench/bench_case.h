// bench_case.h: one measured (dispatch dtype, hidden, tokens) case: the
// deterministic routing of every rank, the bytes it moves between ranks,
// the rows each local expert must receive, and the per-rank numbers
// gathered to rank 0 (laid out by Stat).
#ifndef MOE_EP_TOOLS_BENCH_BENCH_CASE_H_
#define MOE_EP_TOOLS_BENCH_BENCH_CASE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace mep_bench {

// Per-rank numbers of one case: kTimes (p50, p99) pairs, then bytes, then
// host microseconds per iteration, then the HT counts. Both modes share the
// layout (one gather size); each fills the entries it measures.
enum Stat {
  kDisp, kComb, kDSend, kDRecv, kCSend, kCRecv, kA2aD, kA2aC, kPeer, kA2aDedup,  // p50, p99
  kPrep,  // HT: prepare alone (kDisp includes it)
  kTimes = 11,
  kBytesDisp = 2 * kTimes, kBytesDispDedup, kBytesComb, kBytesCombDedup, kBytesPeer,
  kHostUsFull, kHostUsHalves,
  kBytesMeta,  // HT: the dispatch rows' K ids and K weights to other ranks
  kRowsRecv,   // HT: rows this rank receives (N_recv), its own included
  kNumStats
};
extern const char* const kTimeNames[kTimes];

struct Case {
  int fp8, hidden, tokens;
  std::vector<double> all;  // [world][kNumStats]
};

// Deterministic random numbers (splitmix64: the same on every machine).
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed) {}
  uint64_t Next();
  double Uniform();
  uint32_t Below(uint32_t n);
};
uint64_t Mix(uint64_t a, uint64_t b, uint64_t c);
uint16_t ToBf16(float f);

// Top-k distinct experts per token, for rank `rank`: uniform when skew is
// 0, else drawn without replacement with expert weights 1 / (i + 1)^skew,
// i the expert's place in an order drawn from the seed alone (the same hot
// experts on every rank). Skew 0 gives the routing every earlier result
// was measured with.
std::vector<int64_t> Routing(uint64_t seed, int rank, int tokens, int top_k, int experts,
                             double skew = 0.0);

// A case's rows (Plan::dtypes, Case::fp8): bf16, fp8 with one f32 scale
// per 128 channels, or (HT only) fp8 with one f32 scale per token.
enum RowKind { kRowsBf16 = 0, kRowsFp8 = 1, kRowsFp8PerToken = 2 };
const char* RowsName(int rows);

// What one case moves, known to every rank from the seed.
struct Traffic {
  size_t row_disp = 0, row_comb = 0;         // bytes of one dispatch / combine row
  std::vector<std::vector<int64_t>> routes;  // [rank][tokens * top_k]
  // pairs[q][p]: (token, k) pairs rank q sends to rank p; toks: tokens.
  std::vector<std::vector<int64_t>> pairs, toks;
  std::vector<int32_t> want_count;  // [local experts]: rows this rank receives
};
Traffic MakeTraffic(uint64_t seed, int rank, int world, int tokens, int hidden, int top_k,
                    int experts, int rows, double skew = 0.0);
// The byte counts of `rank` into st (kBytes*).
void AddByteStats(const Traffic& tr, int rank, std::vector<double>* st);
// The same for an HT case, whose rows travel once per (token, rank): the
// dispatch rows this rank sends to other ranks, the combine rows it returns
// to them (those it received), their ids and weights, and N_recv.
void AddHtByteStats(const Traffic& tr, int rank, int top_k, std::vector<double>* st);

}  // namespace mep_bench

#endif  // MOE_EP_TOOLS_BENCH_BENCH_CASE_H_
