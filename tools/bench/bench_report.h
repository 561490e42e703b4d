// bench_report.h: what rank 0 prints (the run's description, the latency
// table row by row as cases finish, the bandwidth table at the end; in HT
// mode one table of both) and the --json file. The device scripts grep
// these rows: keep their format.
#ifndef MOE_EP_TOOLS_BENCH_BENCH_REPORT_H_
#define MOE_EP_TOOLS_BENCH_BENCH_REPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "tools/bench/bench_case.h"

namespace mep_bench {

// What the report says about the run besides the cases.
struct RunInfo {
  bool ht = false;                       // --mode=ht
  bool ht_worst_case = false;            // HT: dispatch took MOE_EP_FLAG_WORST_CASE
  std::string ht_dispatch;               // HT: the sentence saying so
  std::string cmdline;
  int world = 1;
  std::vector<std::string> devices;      // one line per rank
  std::string plugin;
  int vmaj = 0, vmin = 0, vpat = 0;      // plugin version
  int nccl_version = 0;
  int experts = 0, el = 0, top_k = 0;
  std::vector<int> tokens, hidden;
  std::string transport;
  uint64_t seed = 0;
  double routing_skew = 0.0;
  int iters = 0, warmup = 0;
  std::vector<std::string> group_lines;  // rank 0's line per group
};

void PrintPreamble(const RunInfo& run);
void PrintGroupLine(const std::string& line);
// The latency table's header, printed before the first case's rows.
void PrintLatencyHeader();
void PrintLatencyRows(const Case& c, int world);
void PrintBandwidth(const std::vector<Case>& cases, int world);
// HT mode's one table (a row per case and rank, printed as cases finish;
// rows start with the dtype as the LL rows do) and its legend.
void PrintHtHeader(const RunInfo& run);
void PrintHtRows(const Case& c, int world);
void PrintHtLegend();
void WriteJson(const std::string& path, const RunInfo& run, const std::vector<Case>& cases);

}  // namespace mep_bench

#endif  // MOE_EP_TOOLS_BENCH_BENCH_REPORT_H_
