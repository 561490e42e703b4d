// bench_setup.h: what the measurements of one rank share: who it is, its
// stream, timer and reference communicator, and its device buffers (sized
// once for the largest case).
#ifndef MOE_EP_TOOLS_BENCH_BENCH_SETUP_H_
#define MOE_EP_TOOLS_BENCH_BENCH_SETUP_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

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
  cudaStream_t stream;
  Timer* timer;
  Ref* ref;
};

struct Buffers {
  int64_t* topk;        // [max_tokens, top_k]
  uint16_t* x;          // [max_tokens, max_hidden] bf16
  float* w;             // [max_tokens, top_k]
  uint16_t* out;        // [max_tokens, max_hidden] bf16
  uint8_t* recv_x;      // [el, slots, max_hidden] bf16 or fp8
  float* recv_scales;   // [el, slots, max_hidden / 128]
  int32_t* recv_count;  // [el]
  uint16_t* y;          // [el, slots, max_hidden] bf16
  int8_t* a2a_send;     // the all-to-all reference's buffers, a2a_max bytes each
  int8_t* a2a_recv;
  size_t a2a_max;
  uint8_t* copy_src;    // the peer-copy ceiling: here, and on peer_dev
  uint8_t* copy_dst;
};

}  // namespace mep_bench

#endif  // MOE_EP_TOOLS_BENCH_BENCH_SETUP_H_
