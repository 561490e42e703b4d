// bench_case.cc: see bench_case.h.
#include "tools/bench/bench_case.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <utility>

namespace mep_bench {

const char* const kTimeNames[kTimes] = {"dispatch", "combine", "dispatch_send", "dispatch_recv",
                                        "combine_send", "combine_recv", "nccl_a2a_dispatch",
                                        "nccl_a2a_combine", "peer_copy",
                                        "nccl_a2a_dispatch_dedup", "prepare"};

uint64_t Rng::Next() {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
double Rng::Uniform() { return static_cast<double>(Next() >> 11) / 9007199254740992.0; }
uint32_t Rng::Below(uint32_t n) { return static_cast<uint32_t>(Uniform() * n); }

uint64_t Mix(uint64_t a, uint64_t b, uint64_t c) {
  Rng r(a * 0x2545F4914F6CDD1Dull ^ b * 0x9E3779B97F4A7C15ull ^ c * 0xD1B54A32D192ED03ull);
  r.Next();
  return r.Next();
}

uint16_t ToBf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

namespace {

// Each expert's weight 1 / (i + 1)^skew, i its place in an order drawn
// from the seed alone.
std::vector<double> SkewWeights(uint64_t seed, int experts, double skew) {
  std::vector<int> order(static_cast<size_t>(experts));
  for (int e = 0; e < experts; e++) order[static_cast<size_t>(e)] = e;
  Rng r(Mix(seed, 4000037ull, static_cast<uint64_t>(experts)));
  for (int i = experts - 1; i > 0; i--) {  // Fisher-Yates
    std::swap(order[static_cast<size_t>(i)], order[r.Below(static_cast<uint32_t>(i + 1))]);
  }
  std::vector<double> w(static_cast<size_t>(experts));
  for (int i = 0; i < experts; i++) {
    w[static_cast<size_t>(order[static_cast<size_t>(i)])] = std::pow(i + 1.0, -skew);
  }
  return w;
}

// Weighted draws without replacement (Efraimidis and Spirakis): every
// expert gets the key -log(u) / w, and the token takes the top_k smallest,
// in key order. Exact for any weights, with no rejection loop.
void SkewedRow(Rng* r, const std::vector<double>& w, int top_k, int64_t* row) {
  std::vector<std::pair<double, int>> keys(w.size());
  for (size_t e = 0; e < w.size(); e++) {
    // 1 - Uniform() is in (0, 1]: the log is finite
    keys[e] = {-std::log(1.0 - r->Uniform()) / w[e], static_cast<int>(e)};
  }
  std::partial_sort(keys.begin(), keys.begin() + top_k, keys.end());
  for (int k = 0; k < top_k; k++) row[k] = keys[static_cast<size_t>(k)].second;
}

}  // namespace

std::vector<int64_t> Routing(uint64_t seed, int rank, int tokens, int top_k, int experts,
                             double skew) {
  Rng r(Mix(seed, 1000003ull + rank, tokens));
  std::vector<int64_t> idx(static_cast<size_t>(tokens) * top_k);
  if (skew > 0.0) {
    const std::vector<double> w = SkewWeights(seed, experts, skew);
    for (int t = 0; t < tokens; t++) SkewedRow(&r, w, top_k, &idx[static_cast<size_t>(t) * top_k]);
    return idx;
  }
  for (int t = 0; t < tokens; t++) {
    int64_t* row = &idx[static_cast<size_t>(t) * top_k];
    for (int k = 0; k < top_k; k++) {
      int64_t e;
      do {
        e = r.Below(static_cast<uint32_t>(experts));
      } while (std::find(row, row + k, e) != row + k);
      row[k] = e;
    }
  }
  return idx;
}

const char* RowsName(int rows) {
  return rows == kRowsFp8PerToken ? "fp8pt" : rows == kRowsFp8 ? "fp8" : "bf16";
}

Traffic MakeTraffic(uint64_t seed, int rank, int world, int T, int H, int top_k, int experts,
                    int rows, double skew) {
  const int R = world, el = experts / world;
  Traffic tr;
  tr.row_disp = rows == kRowsBf16 ? static_cast<size_t>(H) * 2
                : static_cast<size_t>(H) + (rows == kRowsFp8PerToken ? 1 : H / 128) * 4;
  tr.row_comb = static_cast<size_t>(H) * 2;
  // Routing of every rank (deterministic from the seed), so each rank
  // knows what it receives from each peer.
  tr.routes.resize(R);
  for (int q = 0; q < R; q++) tr.routes[q] = Routing(seed, q, T, top_k, experts, skew);
  tr.pairs.assign(R, std::vector<int64_t>(R, 0));
  tr.toks = tr.pairs;
  for (int q = 0; q < R; q++) {
    for (int t = 0; t < T; t++) {
      std::set<int> dst;
      for (int k = 0; k < top_k; k++) {
        int p = static_cast<int>(tr.routes[q][static_cast<size_t>(t) * top_k + k] / el);
        tr.pairs[q][p]++;
        dst.insert(p);
      }
      for (int p : dst) tr.toks[q][p]++;
    }
  }
  tr.want_count.assign(el, 0);
  for (int q = 0; q < R; q++) {
    for (int64_t e : tr.routes[q]) {
      if (e / el == rank) tr.want_count[e % el]++;
    }
  }
  return tr;
}

void AddByteStats(const Traffic& tr, int rank, std::vector<double>* st) {
  std::vector<double>& s = *st;
  for (int p = 0; p < static_cast<int>(tr.pairs.size()); p++) {
    if (p == rank) continue;
    s[kBytesDisp] += tr.pairs[rank][p] * static_cast<double>(tr.row_disp);
    s[kBytesDispDedup] += tr.toks[rank][p] * static_cast<double>(tr.row_disp);
    s[kBytesComb] += tr.pairs[rank][p] * static_cast<double>(tr.row_comb);
    s[kBytesCombDedup] += tr.toks[rank][p] * static_cast<double>(tr.row_comb);
  }
  s[kBytesPeer] = s[kBytesDisp];
}

void AddHtByteStats(const Traffic& tr, int rank, int top_k, std::vector<double>* st) {
  std::vector<double>& s = *st;
  for (int p = 0; p < static_cast<int>(tr.toks.size()); p++) {
    s[kRowsRecv] += static_cast<double>(tr.toks[p][rank]);
    if (p == rank) continue;
    s[kBytesDisp] += tr.toks[rank][p] * static_cast<double>(tr.row_disp);
    s[kBytesMeta] += tr.toks[rank][p] * 8.0 * top_k;  // int32 ids, f32 weights
    s[kBytesComb] += tr.toks[p][rank] * static_cast<double>(tr.row_comb);
  }
  s[kBytesPeer] = s[kBytesDisp];
}

}  // namespace mep_bench
