// bench_setup.h: what the measurements of one rank share: who it is, its
// stream, timer and reference communicator, and its device buffers (sized
// once for the largest case; bench_setup.cc).
#ifndef MOE_EP_TOOLS_BENCH_BENCH_SETUP_H_
#define MOE_EP_TOOLS_BENCH_BENCH_SETUP_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "tools/bench/bench_flags.h"
#include "tools/bench/bench_ref_comm.h"
#include "tools/bench/bench_timer.h"

namespace mep_bench {

struct Setup {
  int rank, world, dev;
  int peer_dev;  // the peer-copy ceiling's target GPU, -1 with one rank
  int el;        // local experts
  int top_k;
  int64_t slots;  // world * max_tokens: rows per local expert
  uint64_t seed;
  int iters;
  bool worst_case;  // HT: dispatches take MOE_EP_FLAG_WORST_CASE (no host sync)
  cudaStream_t stream;
  Timer* timer;
  Ref* ref;
};

// LL sizes its receive tensors [el, slots, H]; HT [slots, H] (world *
// max_tokens rows: what MOE_EP_FLAG_WORST_CASE requires, and never too few).
struct Buffers {
  int64_t* topk = nullptr;        // [max_tokens, top_k]
  uint16_t* x = nullptr;          // [max_tokens, max_hidden] bf16 (HT fp8: its first half)
  float* x_scales = nullptr;      // HT fp8: [max_tokens, max_hidden / 128]
  float* w = nullptr;             // [max_tokens, top_k]
  uint16_t* out = nullptr;        // [max_tokens, max_hidden] bf16
  uint8_t* recv_x = nullptr;      // bf16 or fp8 rows of max_hidden
  float* recv_scales = nullptr;   // a scale per 128 channels of recv_x's rows
  int32_t* recv_count = nullptr;  // [el]
  int32_t* recv_topk_idx = nullptr;  // HT: [slots, top_k]
  float* recv_topk_w = nullptr;      // HT: [slots, top_k]
  uint16_t* y = nullptr;          // bf16 rows of max_hidden, as many as recv_x
  int8_t* a2a_send = nullptr;     // the all-to-all reference's buffers, a2a_max bytes each
  int8_t* a2a_recv = nullptr;
  size_t a2a_max = 0;
  uint8_t* copy_src = nullptr;    // the peer-copy ceiling: here, and on peer_dev
  uint8_t* copy_dst = nullptr;
};

// Every buffer, sized once for the plan's maxima in its mode; returns the
// peer-copy note for this rank's device line.
std::string AllocBuffers(const Setup& s, const Plan& p, Buffers* b);
void FreeBuffers(const Setup& s, const Buffers& b);

}  // namespace mep_bench

#endif  // MOE_EP_TOOLS_BENCH_BENCH_SETUP_H_
