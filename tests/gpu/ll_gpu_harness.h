// ll_gpu_harness.h: what the LL kernel test (ll_gpu_test) and the LL kernel
// benchmark (tools/bench/ll_kernel_bench) share: one process per GPU
// spawned by the binary itself, a group of LL buffers on an NCCL window,
// reproducible per-rank inputs, and the kernels' argument blocks.
#ifndef MOE_EP_TESTS_GPU_LL_GPU_HARNESS_H_
#define MOE_EP_TESTS_GPU_LL_GPU_HARNESS_H_

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/ll/ll.h"
#include "runtime/nccl/nccl_setup.h"

namespace mep_ll_gpu {

// This process's rank and the world, from MOE_EP_RANK / MOE_EP_WORLD_SIZE.
extern int g_rank, g_world;
// Every group is sized for these maxima.
constexpr int kMaxTokens = 128, kMaxHidden = 7168, kMaxTopK = 8, kMaxExperts = 256;

uint64_t mix(uint64_t x);
float unit(uint64_t h);  // [0, 1)
uint16_t f2bf(float f);
float bf2f(uint16_t b);

struct Case {
  int hidden, top_k, experts, fp8, scale_mode, idx_bytes;
  std::vector<int> tokens;  // per rank
  uint64_t seed;
  // Hot routing: slot k of every token names expert k, so every slot lands
  // on rank 0's first top_k experts (expert lists of many pieces; on a
  // 1-SM grid, one receive block holds all of them).
  bool hot = false;
  // +-inf and NaN written into the tokens (make_inputs says where).
  bool non_finite = false;
};
int tokens_of(const Case &c, int r);

// Inputs of rank r, reproducible on every rank.
struct Inputs {
  std::vector<uint16_t> x;    // [T, H]
  std::vector<int64_t> topk;  // [T, K]
  std::vector<float> w;       // [T, K]
};
Inputs make_inputs(const Case &c, int r);

// One LL group: the NCCL window and device communicator, the kernels'
// context and error record, a stream, and device buffers for the maxima.
struct Group {
  mep_nccl_t *nccl = nullptr;
  mep_ll_ctx_t ctx = {};
  mep_ll_error_record_t *rec = nullptr;  // host-mapped
  cudaStream_t stream = nullptr;
  void *x = nullptr, *topk = nullptr, *w = nullptr, *recv_x = nullptr, *scales = nullptr,
       *y = nullptr, *out = nullptr;
  int32_t *recv_count = nullptr, *slot_src = nullptr, *src_count = nullptr;
  mep_ll_route_t *route = nullptr;
  int32_t *src_tokens = nullptr;
  size_t slots = 0;
};

// Collective. adopt NULL: a new communicator (its unique id passed through
// a file in MOE_EP_UID_DIR); otherwise a fresh window, device communicator,
// state and buffers on that group's communicator, so a test can break its
// own group's state without touching anyone else's. NULL on failure, with
// the reason on stderr. Release with group_free (collective).
Group *group_create(const Group *adopt);
void group_free(Group *g);

// Copies rank g_rank's inputs into x / topk (int32 or int64) / w. False on
// a CUDA error.
bool upload(const Case &c, const Inputs &in, void *x, void *topk, void *w);
mep_ll_dispatch_args_t dispatch_args(const Case &c, const Group &g, int set, void *x, void *topk,
                                     void *w, int weighted);
mep_ll_combine_args_t combine_args(const Case &c, const Group &g, int set, void *topk, void *w,
                                   int weighted);

// The parent's side: starts MOE_EP_TEST_WORLD (or every GPU) copies of this
// binary with the rank environment, ends them all 30 s after the first
// failure, and returns 0 when all exited 0. `what` names the run.
int spawn_ranks(char **argv, const char *what);

template <typename V>
double median(std::vector<V> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace mep_ll_gpu

#endif  // MOE_EP_TESTS_GPU_LL_GPU_HARNESS_H_
