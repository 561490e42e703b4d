// bench_flags.cc: the flags' definitions, defaults and help text.
#include "tools/bench/bench_flags.h"

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, plugin, "libmoe_ep.so", "path of libmoe_ep.so");
ABSL_FLAG(std::vector<std::string>, tokens, std::vector<std::string>({"1", "8", "32", "128", "256"}),
          "tokens per rank, comma list; the largest is the group's max_tokens_per_rank");
ABSL_FLAG(std::vector<std::string>, hidden, std::vector<std::string>({"7168"}),
          "hidden sizes, comma list (e.g. 7168,4096); the largest is the group's hidden");
ABSL_FLAG(int32_t, top_k, 8, "experts per token");
ABSL_FLAG(int32_t, experts, 256, "global expert count (a multiple of the rank count)");
ABSL_FLAG(std::string, dtype, "all", "dispatch dtype: fp8, bf16 or all");
ABSL_FLAG(int32_t, iters, 1000, "timed iterations per measurement");
ABSL_FLAG(int32_t, warmup, 100, "untimed iterations before each measurement (>= 1)");
ABSL_FLAG(std::string, transport, "auto", "auto, lsa or gin_emulated");
ABSL_FLAG(std::string, json, "", "also write the results as JSON to this path (rank 0)");
ABSL_FLAG(uint64_t, seed, 1, "seed of routing and inputs");
ABSL_FLAG(bool, sync_each_iter, false,
          "synchronize the stream after every iteration (diagnosis; times then include launch "
          "latency)");
ABSL_FLAG(bool, graph, false,
          "time the iterations as one CUDA graph (captured once, replayed) instead of eager "
          "launches: what a decode step under CUDA graphs sees, without the host's per-launch "
          "cost; the references are captured the same way");
ABSL_FLAG(bool, adopt_comm, false,
          "create the moe-ep groups on the bench's own NCCL communicator (group params "
          "nccl_comm: the engine-provided communicator path) instead of letting moe-ep make "
          "one; the references keep using it after each group is destroyed");
ABSL_FLAG(bool, dispatch_weights, true,
          "pass topk_weights to dispatch (combine then pre-reduces on the expert side and "
          "returns one row per (token, rank)); false: weights at combine only, one row back "
          "per (token, expert)");
ABSL_FLAG(int32_t, num_sms, 0,
          "SMs the moe-ep kernels may use (set_num_sms; 0: the group's default, every SM): "
          "what an engine that overlaps compute gives the communication kernels");
ABSL_FLAG(int32_t, id_wait_s, 120, "how long ranks > 0 wait for rank 0's NCCL id file");
