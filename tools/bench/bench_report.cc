// bench_report.cc: see bench_report.h.
#include "tools/bench/bench_report.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "absl/flags/flag.h"
#include "tools/bench/bench_flags.h"
#include "tools/bench/bench_util.h"

namespace mep_bench {

namespace {

double Gbs(double bytes, double us) { return us > 0 ? bytes / us / 1e3 : 0.0; }
// a / b as "1.23x" (or "45.6%" when pct), "n/a" when either is missing.
std::string Ratio(double a, double b, bool pct) {
  if (a <= 0 || b <= 0) return "n/a";
  return pct ? Fmt("%.1f%%", 100 * a / b) : Fmt("%.2fx", a / b);
}

}  // namespace

void PrintPreamble(const RunInfo& run) {
  printf("moe_ep_bench: moe_ep_run -n %d -- %s\n", run.world, run.cmdline.c_str());
  for (const std::string& d : run.devices) printf("  %s\n", d.c_str());
  printf("  plugin %s (moe_ep %d.%d.%d), NCCL %d (reference communicator), NCCL_NVLS_ENABLE=%s\n",
         run.plugin.c_str(), run.vmaj, run.vmin, run.vpat, run.nccl_version, getenv("NCCL_NVLS_ENABLE"));
  printf("  mode %s, experts %d (%d per rank), top_k %d, tokens %s, hidden %s, transport %s, "
         "seed %llu, %d timed iterations after %d warmup, CUDA events on one stream; times in us\n",
         run.ht ? "ht (high_throughput)" : "ll (low_latency)", run.experts, run.el, run.top_k, [&] {
           std::string s;
           for (int t : run.tokens) s += (s.empty() ? "" : ",") + std::to_string(t);
           return s;
         }().c_str(),
         [&] {
           std::string s;
           for (int h : run.hidden) s += (s.empty() ? "" : ",") + std::to_string(h);
           return s;
         }().c_str(),
         run.transport.c_str(), static_cast<unsigned long long>(run.seed), run.iters, run.warmup);
  if (run.routing_skew > 0.0) {
    printf("  routing skewed: expert weights 1 / (i + 1)^%g (--routing_skew)\n", run.routing_skew);
  }
  if (run.ht) printf("  %s\n", run.ht_dispatch.c_str());
  if (run.iters < 1000) printf("  note: fewer than 1000 timed iterations, p99 is rough\n");
  if (absl::GetFlag(FLAGS_adopt_comm))
    printf("  moe-ep groups adopt the reference communicator (--adopt_comm)\n");
  fflush(stdout);
}

void PrintGroupLine(const std::string& line) {
  printf("  rank 0 %s\n", line.c_str());
  fflush(stdout);
}

void PrintLatencyHeader() {
  printf("\nlatency (us, per rank; %s; dispatch = prepare + dispatch; send/recv = "
         "halves through DEFER_RECV + hook_run)\n",
         absl::GetFlag(FLAGS_graph)
             ? "all iterations in one CUDA graph; the peer-copy ceiling eager"
             : "eager launches");
  printf("combine: %s\n", absl::GetFlag(FLAGS_dispatch_weights)
                               ? "weights given to dispatch: expert-side partials, "
                                 "one row back per (token, rank)"
                               : "weights at combine only: one row back per "
                                 "(token, expert)");
  printf("%-5s %6s %6s %4s | %15s | %15s | %15s | %15s | %15s | %15s | %15s | %8s | "
         "%15s | %8s | %15s | %8s\n",
         "dtype", "hidden", "tokens", "rank", "dispatch p50/99", "combine p50/99",
         "d.send p50/99", "d.recv p50/99", "c.send p50/99", "c.recv p50/99",
         "nccl a2a p50/99", "vs nccl", "a2a dedup p50/99", "vs dedup",
         "nccl comb p50/99", "c vs nccl");
}

void PrintLatencyRows(const Case& c, int world) {
  for (int r = 0; r < world; r++) {
    const double* v = &c.all[static_cast<size_t>(r) * kNumStats];
    std::string cols;
    for (int s2 : {kDisp, kComb, kDSend, kDRecv, kCSend, kCRecv, kA2aD}) {
      cols += Fmt("%7.1f/%7.1f | ", v[2 * s2], v[2 * s2 + 1]);
    }
    std::string ratio = v[kBytesDisp] > 0 && v[2 * kDisp] > 0
                            ? Fmt("%6.2fx", v[2 * kA2aD] / v[2 * kDisp])
                            : std::string("   n/a");
    ratio += Fmt(" | %7.1f/%7.1f | ", v[2 * kA2aDedup], v[2 * kA2aDedup + 1]);
    ratio += v[kBytesDisp] > 0 && v[2 * kDisp] > 0
                 ? Fmt("%6.2fx", v[2 * kA2aDedup] / v[2 * kDisp])
                 : std::string("   n/a");
    ratio += Fmt(" | %7.1f/%7.1f | ", v[2 * kA2aC], v[2 * kA2aC + 1]);
    ratio += v[kBytesComb] > 0 && v[2 * kComb] > 0
                 ? Fmt("%6.2fx", v[2 * kA2aC] / v[2 * kComb])
                 : std::string("   n/a");
    printf("%-5s %6d %6d %4d | %s%s\n", RowsName(c.fp8), c.hidden, c.tokens, r, cols.c_str(),
           ratio.c_str());
  }
  fflush(stdout);
}

void PrintBandwidth(const std::vector<Case>& cases, int world) {
  printf("\nbandwidth (per rank; KB = bytes leaving this rank over NVLink per call; GB/s = "
         "bytes / median; ceiling = cudaMemcpyPeerAsync of the dispatch bytes to the next GPU, "
         "all ranks at once)\n");
  printf("%-5s %6s %6s %4s | %9s %9s %6s | %9s %8s | %9s %9s %8s | %9s %8s | %7s %7s | %8s\n", "dtype",
         "hidden", "tokens", "rank", "disp KB", "dedup KB", "dedup", "disp GB/s", "nccl GB/s",
         "comb KB", "dedup KB", "comb GB/s", "copy us", "ceil GB/s", "disp %", "comb %",
         "vs nccl");
  for (const Case& c : cases) {
    for (int r = 0; r < world; r++) {
      const double* v = &c.all[static_cast<size_t>(r) * kNumStats];
      double disp_bw = Gbs(v[kBytesDisp], v[2 * kDisp]);
      double comb_bw = Gbs(v[kBytesComb], v[2 * kComb]);
      double ceil_bw = Gbs(v[kBytesPeer], v[2 * kPeer]);
      std::string ceil_cols = ceil_bw > 0 ? Fmt("%9.1f %8.1f | %6.1f%% %6.1f%%", v[2 * kPeer], ceil_bw,
                                                100 * disp_bw / ceil_bw, 100 * comb_bw / ceil_bw)
                                          : Fmt("%9s %8s | %7s %7s", "n/a", "n/a", "n/a", "n/a");
      printf("%-5s %6d %6d %4d | %9.1f %9.1f %5.2fx | %9.1f %8.1f | %9.1f %9.1f %8.1f | %s | %7.2fx\n",
             RowsName(c.fp8), c.hidden, c.tokens, r, v[kBytesDisp] / 1e3,
             v[kBytesDispDedup] / 1e3, v[kBytesDispDedup] > 0 ? v[kBytesDisp] / v[kBytesDispDedup] : 0.0,
             disp_bw, Gbs(v[kBytesDisp], v[2 * kA2aD]), v[kBytesComb] / 1e3, v[kBytesCombDedup] / 1e3,
             comb_bw, ceil_cols.c_str(), v[kBytesDisp] > 0 && v[2 * kDisp] > 0 ? v[2 * kA2aD] / v[2 * kDisp] : 0.0);
    }
  }
  printf("\n'disp KB' = algorithmic dispatch bytes, one row per (token, expert on a peer); "
         "'dedup KB' = one row per (token, peer rank), what moe-ep's dispatch actually moves; "
         "'dedup' = their ratio; 'vs nccl' = NCCL all-to-all of the algorithmic bytes / moe_ep "
         "dispatch median (>1: moe_ep faster); 'vs dedup' = the same against an all-to-all of "
         "the dedup bytes; 'c vs nccl' = NCCL all-to-all of the algorithmic combine bytes "
         "(one bf16 row per (token, expert)) / moe_ep combine median; "
         "'disp %%' / 'comb %%' = algorithmic bandwidth as a share of the "
         "peer-copy ceiling bandwidth (can pass 100%% for dispatch: fewer bytes move than "
         "are counted).\n");
  fflush(stdout);
}

void PrintHtHeader(const RunInfo& run) {
  printf("\nhigh-throughput (us, per rank; %s; dispatch = prepare + dispatch, %s; MB = bytes "
         "leaving this rank over NVLink per call; GB/s = MB / p50)\n",
         absl::GetFlag(FLAGS_graph) ? "all iterations in one CUDA graph; the peer-copy ceiling eager"
                                    : "eager launches",
         run.ht_worst_case ? "worst-case outputs, no host sync" : "one host sync each");
  printf("%-5s %6s %6s %4s | %8s %19s %7s %8s | %8s %19s %7s | %9s %9s %9s | %8s %8s | %7s %7s\n",
         "dtype", "hidden", "tokens", "rank", "disp MB", "dispatch p50/p99", "GB/s", "prep p50",
         "comb MB", "combine p50/p99", "GB/s", "a2a d p50", "a2a c p50", "copy p50", "d vs a2a",
         "c vs a2a", "d %ceil", "c %ceil");
  fflush(stdout);
}

void PrintHtRows(const Case& c, int world) {
  for (int r = 0; r < world; r++) {
    const double* v = &c.all[static_cast<size_t>(r) * kNumStats];
    const double disp_bw = Gbs(v[kBytesDisp], v[2 * kDisp]);
    const double comb_bw = Gbs(v[kBytesComb], v[2 * kComb]);
    const double ceil_bw = Gbs(v[kBytesPeer], v[2 * kPeer]);
    printf("%-5s %6d %6d %4d | %8.2f %9.1f/%9.1f %7.1f %8.1f | %8.2f %9.1f/%9.1f %7.1f | %9.1f "
           "%9.1f %9s | %8s %8s | %7s %7s\n",
           RowsName(c.fp8), c.hidden, c.tokens, r, v[kBytesDisp] / 1e6, v[2 * kDisp],
           v[2 * kDisp + 1], disp_bw, v[2 * kPrep], v[kBytesComb] / 1e6, v[2 * kComb],
           v[2 * kComb + 1], comb_bw, v[2 * kA2aD], v[2 * kA2aC],
           v[2 * kPeer] > 0 ? Fmt("%.1f", v[2 * kPeer]).c_str() : "n/a",
           Ratio(v[kBytesDisp] > 0 ? v[2 * kA2aD] : 0, v[2 * kDisp], false).c_str(),
           Ratio(v[kBytesComb] > 0 ? v[2 * kA2aC] : 0, v[2 * kComb], false).c_str(),
           Ratio(disp_bw, ceil_bw, true).c_str(), Ratio(comb_bw, ceil_bw, true).c_str());
  }
  fflush(stdout);
}

void PrintHtLegend() {
  printf("\n'disp MB' = rows this rank sends to other ranks (each token once per rank it "
         "reaches) x row bytes (bf16: 2*hidden; fp8: hidden + 4*hidden/128 of scales; fp8pt: "
         "hidden + 4), without "
         "the rows' K ids and K weights (8*K bytes a row; dispatch_meta_bytes in the JSON); "
         "'comb MB' = rows this rank returns to other ranks (those it received from them) x "
         "2*hidden; 'prep p50' = prepare alone (part of dispatch); 'a2a d' / 'a2a c' = NCCL "
         "all-to-all (ncclSend/ncclRecv) of the same bytes per peer in each direction; 'copy' = "
         "cudaMemcpyPeerAsync of the dispatch bytes to the next GPU, all ranks at once; "
         "'vs a2a' = NCCL p50 / moe-ep p50 (>1: moe-ep faster); '%%ceil' = moe-ep GB/s as a "
         "share of the copy's.\n");
  fflush(stdout);
}

void WriteJson(const std::string& path, const RunInfo& run, const std::vector<Case>& cases) {
  const int world = run.world;
  FILE* f = fopen(path.c_str(), "w");
  if (f == nullptr) Die("cannot write --json=%s: %s", path.c_str(), strerror(errno));
  fprintf(f, "{\n  \"command\": \"%s\",\n  \"mode\": \"%s\",\n  \"world\": %d,\n"
             "  \"nccl_version\": %d,\n",
          JsonEscape("moe_ep_run -n " + std::to_string(world) + " -- " + run.cmdline).c_str(),
          run.ht ? "ht" : "ll", world, run.nccl_version);
  if (run.ht) {
    fprintf(f, "  \"ht_worst_case\": %s,\n  \"ht_dispatch\": \"%s\",\n",
            run.ht_worst_case ? "true" : "false", JsonEscape(run.ht_dispatch).c_str());
  }
  fprintf(f, "  \"plugin_version\": \"%d.%d.%d\",\n  \"devices\": [", run.vmaj, run.vmin, run.vpat);
  for (int r = 0; r < world; r++) fprintf(f, "%s\"%s\"", r ? ", " : "", JsonEscape(run.devices[r]).c_str());
  fprintf(f, "],\n  \"groups_rank0\": [");
  for (size_t i = 0; i < run.group_lines.size(); i++) {
    fprintf(f, "%s\"%s\"", i ? ", " : "", JsonEscape(run.group_lines[i]).c_str());
  }
  fprintf(f, "],\n  \"experts\": %d, \"top_k\": %d, \"iters\": %d, \"warmup\": %d, "
             "\"transport\": \"%s\", \"seed\": %llu, \"routing_skew\": %g, "
             "\"dispatch_weights\": %s,\n"
             "  \"results\": [\n",
          run.experts, run.top_k, run.iters, run.warmup, JsonEscape(run.transport).c_str(),
          static_cast<unsigned long long>(run.seed), run.routing_skew,
          absl::GetFlag(FLAGS_dispatch_weights) ? "true" : "false");
  bool first = true;
  for (const Case& c : cases) {
    for (int r = 0; r < world; r++) {
      const double* v = &c.all[static_cast<size_t>(r) * kNumStats];
      fprintf(f, "%s    {\"dtype\": \"%s\", \"hidden\": %d, \"tokens\": %d, \"rank\": %d", first ? "" : ",\n",
              RowsName(c.fp8), c.hidden, c.tokens, r);
      first = false;
      // The times each mode measures (HT: dispatch includes prepare).
      static const std::vector<int> kLl = {kDisp, kComb, kDSend, kDRecv, kCSend,
                                           kCRecv, kA2aD, kA2aC, kPeer, kA2aDedup};
      static const std::vector<int> kHt = {kDisp, kPrep, kComb, kA2aD, kA2aC, kPeer};
      for (int s2 : run.ht ? kHt : kLl) {
        fprintf(f, ", \"%s_us_p50\": %.3f, \"%s_us_p99\": %.3f", kTimeNames[s2], v[2 * s2],
                kTimeNames[s2], v[2 * s2 + 1]);
      }
      if (run.ht) {
        fprintf(f, ", \"dispatch_bytes\": %.0f, \"dispatch_meta_bytes\": %.0f, "
                   "\"combine_bytes\": %.0f, \"peer_copy_bytes\": %.0f, \"recv_rows\": %.0f, "
                   "\"host_us_per_iter\": %.3f}",
                v[kBytesDisp], v[kBytesMeta], v[kBytesComb], v[kBytesPeer], v[kRowsRecv],
                v[kHostUsFull]);
        continue;
      }
      fprintf(f, ", \"dispatch_bytes\": %.0f, \"dispatch_bytes_dedup\": %.0f, \"combine_bytes\": %.0f, "
                 "\"combine_bytes_dedup\": %.0f, \"peer_copy_bytes\": %.0f, \"host_us_per_iter_full\": %.3f, "
                 "\"host_us_per_iter_halves\": %.3f}",
              v[kBytesDisp], v[kBytesDispDedup], v[kBytesComb], v[kBytesCombDedup], v[kBytesPeer],
              v[kHostUsFull], v[kHostUsHalves]);
    }
  }
  fprintf(f, "\n  ]\n}\n");
  if (fclose(f) != 0) Die("cannot write --json=%s: %s", path.c_str(), strerror(errno));
  printf("wrote %s\n", path.c_str());
}

}  // namespace mep_bench
