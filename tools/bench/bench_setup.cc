// bench_setup.cc: see bench_setup.h.
#include "tools/bench/bench_setup.h"

#include <algorithm>

#include "tools/bench/bench_references.h"
#include "tools/bench/bench_util.h"

namespace mep_bench {

std::string AllocBuffers(const Setup& s, const Plan& p, Buffers* b) {
  const size_t T = p.max_tokens, H = p.max_hidden, K = p.top_k, el = s.el;
  const size_t slots = static_cast<size_t>(s.slots), world = s.world;
  // LL receives per local expert; HT packs every received row once.
  const size_t rows = p.ht ? slots : el * slots;
  b->topk = DevAlloc<int64_t>(T * K);
  b->x = DevAlloc<uint16_t>(T * H);
  b->w = DevAlloc<float>(T * K);
  b->out = DevAlloc<uint16_t>(T * H);
  b->recv_x = DevAlloc<uint8_t>(rows * H * 2);
  b->recv_scales = DevAlloc<float>(rows * (H / 128));
  b->recv_count = DevAlloc<int32_t>(el);
  b->y = DevAlloc<uint16_t>(rows * H);
  // y: bf16 0x3F3F (0.74609375) everywhere: its value does not change the
  // timing, and HT checks the combine's sums of it.
  CUDA_CHECK(cudaMemset(b->y, 0x3F, rows * H * 2));
  if (p.ht) {
    b->x_scales = DevAlloc<float>(T * (H / 128));
    b->recv_topk_idx = DevAlloc<int32_t>(slots * K);
    b->recv_topk_w = DevAlloc<float>(slots * K);
  }
  // The most one direction of a reference moves: LL, every (token, expert)
  // on a peer; HT, every token once to each peer.
  b->a2a_max = p.ht ? slots * H * 2 : world * T * K * H * 2;
  b->a2a_send = DevAlloc<int8_t>(b->a2a_max);
  b->a2a_recv = DevAlloc<int8_t>(b->a2a_max);
  const size_t copy = p.ht ? std::max<size_t>(world - 1, 1) * T * H * 2 : T * K * H * 2;
  return PeerCopyTarget(s, copy, b);
}

void FreeBuffers(const Setup& s, const Buffers& b) {
  for (void* ptr : {static_cast<void*>(b.topk), static_cast<void*>(b.x),
                    static_cast<void*>(b.x_scales), static_cast<void*>(b.w),
                    static_cast<void*>(b.out), static_cast<void*>(b.recv_x),
                    static_cast<void*>(b.recv_scales), static_cast<void*>(b.recv_count),
                    static_cast<void*>(b.recv_topk_idx), static_cast<void*>(b.recv_topk_w),
                    static_cast<void*>(b.y), static_cast<void*>(b.a2a_send),
                    static_cast<void*>(b.a2a_recv), static_cast<void*>(b.copy_src)}) {
    CUDA_CHECK(cudaFree(ptr));  // nullptr (a buffer the mode lacks) is fine
  }
  if (b.copy_dst != nullptr) {
    CUDA_CHECK(cudaSetDevice(s.peer_dev));
    CUDA_CHECK(cudaFree(b.copy_dst));
    CUDA_CHECK(cudaSetDevice(s.dev));
  }
}

}  // namespace mep_bench
