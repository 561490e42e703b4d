/* ll_dispatch_recv.cu: LL dispatch, receive half. Every block waits for
 * every source rank's count signal (and, for staged transports, its puts),
 * then handles local experts: for each source rank in order, a block-wide
 * stable compaction of that source's slot list gives the expert's slots
 * (source rank, then token, then k: deterministic), and warps copy the
 * source's token rows into them. Writes the handle (slot sources, counts).
 * The last block to finish advances the signal shadows. */
#include "kernels/ll_launch.cuh"

extern "C" moe_ep_status_t mep_ll_dispatch_check(const char *op, const mep_ll_ctx_t *ctx,
                                                 const mep_ll_dispatch_args_t *a);

namespace {

struct RecvArgs {
  void *recv_x;
  void *recv_scales;
  int32_t *recv_count;
  int32_t *slot_src;
  int32_t *src_count;
  int hidden, top_k, local_experts, scale_mode;
  uint32_t row_bytes;
};

constexpr int kWarps = MEP_LL_THREADS / 32;

/* Row `src_row` of the receive area into recv_x slot dst_slot (and its
 * scales, converted to the caller's format). Whole warp. */
template <bool kFp8>
__device__ __forceinline__ void copy_row(const RecvArgs &a, const char *row, uint64_t dst_slot) {
  const int lane = threadIdx.x & 31;
  if (!kFp8) {
    mep_copy_warp((char *)a.recv_x + dst_slot * a.hidden * 2, row, (uint32_t)a.hidden * 2);
    return;
  }
  mep_copy_warp((char *)a.recv_x + dst_slot * a.hidden, row, (uint32_t)a.hidden);
  const float *sc = reinterpret_cast<const float *>(row + a.hidden);
  const int groups = a.hidden / 128;
  if (a.scale_mode == MOE_EP_FP8_SCALE_UE8M0_PACKED) {
    const int words = (groups + 3) / 4;
    int32_t *dst = (int32_t *)a.recv_scales + dst_slot * words;
    for (int w = lane; w < words; w += 32) {
      uint32_t v = 0;
      for (int b = 0; b < 4 && w * 4 + b < groups; ++b)
        v |= ((__float_as_uint(__ldcg(sc + w * 4 + b)) >> 23) & 0xffu) << (8 * b);
      dst[w] = (int32_t)v;
    }
  } else {
    float *dst = (float *)a.recv_scales + dst_slot * groups;
    for (int g = lane; g < groups; g += 32) dst[g] = __ldcg(sc + g);
  }
}

template <class Tp, bool kFp8>
__global__ void __launch_bounds__(MEP_LL_THREADS, 1)
    ll_dispatch_recv_kernel(const __grid_constant__ MepLLParams p, const RecvArgs a) {
  extern __shared__ int smem[]; /* tokens [R], puts [R] per source */
  __shared__ int warp_hits[kWarps];
  __shared__ int failed;
  const int R = p.dims.world, M = p.dims.max_tokens, K = a.top_k;
  int *tokens = smem;
  int *puts = smem + R;
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const int cap = R * M; /* slots per local expert */
  const uint64_t list_bytes = mep_ll_align16((uint64_t)M * p.dims.top_k * 4u);

  if (threadIdx.x == 0) failed = 0;
  __syncthreads();
  for (int r = threadIdx.x; r < R; r += blockDim.x) {
    const uint32_t cs = mep_ll_sig_disp_cnt(&p.dims, r);
    const uint64_t base = p.shadows[cs];
    uint64_t seen = 0;
    int n = 0, q = 0;
    if (mep_wait_ge(p, [&] { return Tp::read_signal(p, cs); }, base + 1,
                    MEP_LL_OP_DISPATCH_RECV, r, -1, &seen)) {
      const uint64_t code = seen - base - 1;
      /* A sender never sends more than max_tokens tokens or max_tokens + 1
       * puts; anything else is a corrupt signal: never read past the area. */
      n = (int)(code % (uint64_t)(M + 1));
      q = (int)(code / (uint64_t)(M + 1) <= (uint64_t)(M + 1) ? code / (uint64_t)(M + 1) : 0);
      if (Tp::kRowSignals && q > 0) {
        const uint32_t rs = mep_ll_sig_disp_row(&p.dims, r);
        uint64_t rseen;
        if (!mep_wait_ge(p, [&] { return Tp::read_signal(p, rs); }, p.shadows[rs] + (uint64_t)q,
                         MEP_LL_OP_DISPATCH_RECV, r, -1, &rseen))
          failed = 1;
      }
    } else {
      failed = 1;
    }
    tokens[r] = n;
    puts[r] = q;
  }
  __syncthreads();
  if (failed) return; /* the record says why; outputs stay as they were */

  for (int le = blockIdx.x; le < a.local_experts; le += gridDim.x) {
    int32_t *slots = a.slot_src + (size_t)le * cap;
    int filled = 0; /* block-uniform */
    for (int r = 0; r < R; ++r) {
      const int n = tokens[r] * K;
      const int32_t *list = reinterpret_cast<const int32_t *>(
          p.local + p.set_off + p.lay.disp_list + (uint64_t)r * list_bytes);
      int hits = 0; /* block-uniform: this expert's entries of source r so far */
      for (int i0 = 0; i0 < n; i0 += MEP_LL_THREADS) {
        const int i = i0 + threadIdx.x;
        const bool hit = i < n && __ldcg(list + i) == le;
        const unsigned ball = __ballot_sync(0xffffffffu, hit);
        if (lane == 0) warp_hits[warp] = __popc(ball);
        __syncthreads();
        int before = 0, all = 0;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) {
          const int v = warp_hits[w];
          before += w < warp ? v : 0;
          all += v;
        }
        const int pos = hits + before + __popc(ball & ((1u << lane) - 1u));
        /* more than max_tokens hits from one source only happens with an
         * expert repeated within a token: the excess is dropped */
        if (hit && pos < M) slots[filled + pos] = MEP_LL_SLOT_PACK(r, i / K, i % K);
        hits += all;
        __syncthreads(); /* warp_hits is reused */
      }
      if (hits > M) hits = M;
      if (threadIdx.x == 0) a.src_count[le * R + r] = hits;
      filled += hits;
    }
    if (threadIdx.x == 0) a.recv_count[le] = filled;
    __syncthreads(); /* this expert's slot sources are written */
    for (int j = warp; j < filled; j += kWarps) {
      const int v = slots[j];
      const uint64_t src_row = (uint64_t)MEP_LL_SLOT_RANK(v) * M + MEP_LL_SLOT_TOKEN(v);
      copy_row<kFp8>(a, p.local + p.set_off + p.lay.disp_recv + src_row * a.row_bytes,
                     (uint64_t)le * cap + j);
    }
  }

  /* Shadows advance once every block has read them. */
  if (mep_last_block(&p.tickets[MEP_LL_TICKET_DISPATCH_RECV])) {
    for (int r = threadIdx.x; r < R; r += blockDim.x) {
      p.shadows[mep_ll_sig_disp_cnt(&p.dims, r)] += mep_ll_disp_code(tokens[r], puts[r], M);
      if (Tp::kRowSignals) p.shadows[mep_ll_sig_disp_row(&p.dims, r)] += (uint64_t)puts[r];
    }
  }
}

template <class Tp>
cudaError_t launch_tp(const MepLLParams &p, const RecvArgs &a, bool fp8, int grid, size_t smem,
                      cudaStream_t s) {
  if (fp8)
    ll_dispatch_recv_kernel<Tp, true><<<grid, MEP_LL_THREADS, smem, s>>>(p, a);
  else
    ll_dispatch_recv_kernel<Tp, false><<<grid, MEP_LL_THREADS, smem, s>>>(p, a);
  return cudaGetLastError();
}

}  // namespace

extern "C" moe_ep_status_t mep_ll_dispatch_recv(const mep_ll_ctx_t *ctx,
                                                const mep_ll_dispatch_args_t *a, void *stream) {
  moe_ep_status_t st = mep_ll_dispatch_check("dispatch_recv", ctx, a);
  if (st != MOE_EP_OK) return st;
  if (a->recv_x == nullptr || a->recv_count == nullptr || a->slot_src == nullptr ||
      a->src_count == nullptr || (a->fp8 && a->recv_scales == nullptr))
    return mep_kernels_error(MOE_EP_ERR_INVALID_ARGUMENT,
                             "dispatch_recv: recv_x, recv_count, slot_src, src_count (and "
                             "recv_scales for fp8) must not be NULL");
  MepLLParams p;
  mep_ll_make_params(ctx, a->buffer_set, &p);
  RecvArgs k;
  k.recv_x = a->recv_x;
  k.recv_scales = a->recv_scales;
  k.recv_count = a->recv_count;
  k.slot_src = a->slot_src;
  k.src_count = a->src_count;
  k.hidden = a->hidden;
  k.top_k = a->top_k;
  k.local_experts = a->num_experts / ctx->dims.world;
  k.scale_mode = a->scale_mode;
  k.row_bytes = (uint32_t)mep_ll_dispatch_row_bytes(a->hidden, a->fp8);
  int grid = mep_ll_grid(ctx);
  if (grid > k.local_experts) grid = k.local_experts;
  const size_t smem = (size_t)(2 * ctx->dims.world) * sizeof(int);
  cudaStream_t s = (cudaStream_t)stream;
  cudaError_t e;
  switch (ctx->transport) {
    case MEP_LL_TRANSPORT_LSA: e = launch_tp<MepLsa>(p, k, a->fp8, grid, smem, s); break;
    case MEP_LL_TRANSPORT_GIN: e = launch_tp<MepGin>(p, k, a->fp8, grid, smem, s); break;
    default: e = launch_tp<MepGinEmu>(p, k, a->fp8, grid, smem, s); break;
  }
  return mep_kernels_cuda_check("dispatch_recv: launch", e);
}
