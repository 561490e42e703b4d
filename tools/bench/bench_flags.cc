// bench_flags.cc: the flags' definitions, defaults and help text, and
// their check (ParseFlags).
#include "tools/bench/bench_flags.h"

#include <algorithm>

#include "absl/flags/flag.h"
#include "tools/bench/bench_ht.h"
#include "tools/bench/bench_util.h"

ABSL_FLAG(std::string, plugin, "libmoe_ep.so", "path of libmoe_ep.so");
ABSL_FLAG(std::string, mode, "ll",
          "ll: low-latency (decode) groups; ht: high-throughput (prefill) groups, whose "
          "defaults are tokens 512,1024,2048,4096,8192, hidden 7168, top-8, 256 experts, "
          "dtype bf16, 200 iterations after 50 warmup");
ABSL_FLAG(std::vector<std::string>, tokens, std::vector<std::string>(),
          "tokens per rank, comma list; the largest is the group's max_tokens_per_rank "
          "(default: 1,8,32,128,256 in ll mode, at most 1024; 512,1024,2048,4096,8192 in ht "
          "mode, at most 65536)");
ABSL_FLAG(std::vector<std::string>, hidden, std::vector<std::string>({"7168"}),
          "hidden sizes, comma list (e.g. 7168,4096); the largest is the group's hidden");
ABSL_FLAG(int32_t, top_k, 8, "experts per token");
ABSL_FLAG(int32_t, experts, 256, "global expert count (a multiple of the rank count)");
ABSL_FLAG(std::string, dtype, "",
          "dispatch dtype: fp8, bf16 or all (default: all in ll mode, bf16 in ht mode). ht "
          "fp8 dispatches x already quantised (fp8 e4m3 with one f32 scale per 128 channels, "
          "moe-ep 0.3), ht fp8_per_token with one f32 scale per token (moe-ep 0.5); combine "
          "is always bf16");
ABSL_FLAG(int32_t, iters, 0,
          "timed iterations per measurement (0: 1000 in ll mode, 200 in ht mode)");
ABSL_FLAG(int32_t, warmup, 0,
          "untimed iterations before each measurement (0: 100 in ll mode, 50 in ht mode)");
ABSL_FLAG(std::string, transport, "auto", "auto, lsa or gin_emulated");
ABSL_FLAG(std::string, json, "", "also write the results as JSON to this path (rank 0)");
ABSL_FLAG(uint64_t, seed, 1, "seed of routing and inputs");
ABSL_FLAG(double, routing_skew, 0.0,
          "how unevenly tokens pick experts: 0 picks each token's top_k distinct experts "
          "uniformly; s > 0 (at most 2) weights the experts as a Zipf law of exponent s over an "
          "order drawn from --seed, the same hot experts on every rank (at 256 experts and "
          "top-8, 0.25 picks the hottest expert ~3x as often as the mean, 0.5 ~8x)");
ABSL_FLAG(bool, sync_each_iter, false,
          "synchronize the stream after every iteration (diagnosis; times then include launch "
          "latency)");
ABSL_FLAG(bool, graph, false,
          "time the iterations as one CUDA graph (captured once, replayed) instead of eager "
          "launches: what a decode step under CUDA graphs sees, without the host's per-launch "
          "cost; the references are captured the same way (ht mode: only with "
          "MOE_EP_FLAG_WORST_CASE, since a plain HT dispatch synchronises)");
ABSL_FLAG(bool, adopt_comm, false,
          "create the moe-ep groups on the bench's own NCCL communicator (group params "
          "nccl_comm: the engine-provided communicator path) instead of letting moe-ep make "
          "one; the references keep using it after each group is destroyed");
ABSL_FLAG(bool, dispatch_weights, true,
          "ll mode: pass topk_weights to dispatch (combine then pre-reduces on the expert side "
          "and returns one row per (token, rank)); false: weights at combine only (over LSA "
          "pushed to the experts' ranks, which pre-reduce the same; over staged transports one "
          "row back per (token, expert)). ht dispatch always takes the weights");
ABSL_FLAG(int32_t, num_sms, 0,
          "SMs the moe-ep kernels may use (set_num_sms; 0: the group's default, every SM in ll "
          "mode, 24 in ht mode): what an engine that overlaps compute gives the communication "
          "kernels");
ABSL_FLAG(int32_t, id_wait_s, 120, "how long ranks > 0 wait for rank 0's NCCL id file");

namespace mep_bench {

Plan ParseFlags(int world) {
  Plan p;
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode != "ll" && mode != "ht") Die("--mode=%s: allowed ll, ht", mode.c_str());
  p.ht = mode == "ht";
  std::vector<std::string> tokens = absl::GetFlag(FLAGS_tokens);
  if (tokens.empty()) {
    tokens = p.ht ? std::vector<std::string>{"512", "1024", "2048", "4096", "8192"}
                  : std::vector<std::string>{"1", "8", "32", "128", "256"};
  }
  // The library's max_tokens_per_rank bounds (kernels/common/limits.h).
  p.tokens = IntList(tokens, "tokens", 1, p.ht ? 65536 : 1024);
  p.hidden = IntList(absl::GetFlag(FLAGS_hidden), "hidden", 128, 65536);
  p.top_k = absl::GetFlag(FLAGS_top_k);
  p.experts = absl::GetFlag(FLAGS_experts);
  p.iters = absl::GetFlag(FLAGS_iters);
  p.warmup = absl::GetFlag(FLAGS_warmup);
  if (p.iters == 0) p.iters = p.ht ? 200 : 1000;
  if (p.warmup == 0) p.warmup = p.ht ? 50 : 100;
  p.seed = absl::GetFlag(FLAGS_seed);
  p.routing_skew = absl::GetFlag(FLAGS_routing_skew);
  // NaN fails both comparisons, so it is refused too.
  if (!(p.routing_skew >= 0.0 && p.routing_skew <= 2.0)) {
    Die("--routing_skew=%g must be in [0, 2] (0: uniform routing)", p.routing_skew);
  }
  p.transport = absl::GetFlag(FLAGS_transport);
  std::string dtype = absl::GetFlag(FLAGS_dtype);
  if (dtype.empty()) dtype = p.ht ? "bf16" : "all";
  if (p.top_k < 1 || p.top_k > 32) Die("--top_k=%d must be in [1, 32]", p.top_k);
  if (p.experts < p.top_k || p.experts % world != 0) {
    Die("--experts=%d must be >= top_k=%d and a multiple of the rank count %d", p.experts, p.top_k,
        world);
  }
  if (p.iters < 1 || p.iters > 1000000) Die("--iters=%d must be in [1, 1000000] (0: the mode's default)", p.iters);
  // >= 1: the results are checked against the routing after the warmup.
  if (p.warmup < 1) Die("--warmup=%d must be >= 1 (0: the mode's default)", p.warmup);
  if (p.transport != "auto" && p.transport != "lsa" && p.transport != "gin_emulated") {
    Die("--transport=%s: allowed auto, lsa, gin_emulated", p.transport.c_str());
  }
  if (absl::GetFlag(FLAGS_num_sms) < 0) Die("--num_sms=%d must be >= 0", absl::GetFlag(FLAGS_num_sms));
  if (dtype == "fp8" || dtype == "all") p.dtypes.push_back(kRowsFp8);
  if (dtype == "bf16" || dtype == "all") p.dtypes.push_back(kRowsBf16);
  if (dtype == "fp8_per_token") {
    if (!p.ht) Die("--dtype=fp8_per_token is ht mode only: an LL dispatch quantises per 128 channels");
    p.dtypes.push_back(kRowsFp8PerToken);
  }
  if (p.dtypes.empty()) Die("--dtype=%s: allowed fp8, bf16, all, fp8_per_token (ht)", dtype.c_str());
  for (int h : p.hidden) {
    if (h % 128 != 0) Die("--hidden=%d must be a multiple of 128 (fp8 scales cover 128 channels)", h);
  }
  if (p.ht) CheckHtFlags(p, dtype);
  p.max_tokens = *std::max_element(p.tokens.begin(), p.tokens.end());
  p.max_hidden = *std::max_element(p.hidden.begin(), p.hidden.end());
  return p;
}

}  // namespace mep_bench
