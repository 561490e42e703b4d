/* ll_combine_recv.cu: LL combine, receive half. Every block waits all
 * peers' counts (and GIN rows), then warps reduce (token, chunk) units:
 * out[t] = sum_k w[t,k] * y_k in f32, k ascending (deterministic), bf16 out.
 * The last block to finish advances the signal shadows. */
#include "kernels/ll_launch.cuh"

extern "C" moe_ep_status_t mep_ll_combine_check(const char *op, const mep_ll_ctx_t *ctx,
                                                const mep_ll_combine_args_t *a);

namespace {

struct CRecvArgs {
  const void *topk;
  const float *weights;
  __nv_bfloat16 *out;
  int tokens, hidden, top_k, num_experts;
};

template <class Tp, typename IdxT>
__global__ void __launch_bounds__(MEP_LL_THREADS, 1)
    ll_combine_recv_kernel(const __grid_constant__ MepLLParams p, const CRecvArgs a) {
  extern __shared__ int cnt[]; /* [R] */
  __shared__ int failed;
  const int R = p.dims.world;
  const int lane = threadIdx.x & 31;
  if (threadIdx.x == 0) failed = 0;
  __syncthreads();
  for (int r = threadIdx.x; r < R; r += blockDim.x) {
    const uint32_t cs = mep_ll_sig_comb_cnt(&p.dims, r);
    const uint64_t base = p.shadows[cs];
    uint64_t seen = 0;
    int c = 0;
    if (mep_wait_ge(p, [&] { return Tp::read_signal(p, cs); }, base + 1, MEP_LL_OP_COMBINE_RECV,
                    r, -1, &seen)) {
      c = (int)(seen - base - 1);
      if (Tp::kRowSignals) {
        const uint32_t rs = mep_ll_sig_comb_row(&p.dims, r);
        uint64_t rseen;
        if (!mep_wait_ge(p, [&] { return Tp::read_signal(p, rs); }, p.shadows[rs] + c,
                         MEP_LL_OP_COMBINE_RECV, r, -1, &rseen))
          failed = 1;
      }
    } else {
      failed = 1;
    }
    cnt[r] = c;
  }
  __syncthreads();
  if (failed) return;

  /* Work unit = (token, 256-channel chunk): T * ceil(H / 256) units spread
   * over every warp of the grid (not one warp per token), and each unit
   * issues the loads of up to 8 slots' rows before the first FMA. No
   * shuffles: every branch below may diverge safely (a hidden that is not a
   * multiple of 256 leaves some lanes of the last chunk idle). */
  const int nwarps = gridDim.x * (MEP_LL_THREADS / 32);
  const int gwarp = blockIdx.x * (MEP_LL_THREADS / 32) + threadIdx.x / 32;
  const int K = a.top_k;
  const uint32_t row_elems = (uint32_t)a.hidden;
  const int nchunks = (a.hidden + 255) / 256;
  const __nv_bfloat16 *region =
      reinterpret_cast<const __nv_bfloat16 *>(p.local + p.set_off + p.lay.comb_recv);
  const IdxT *topk = reinterpret_cast<const IdxT *>(a.topk);
  for (int u = gwarp; u < a.tokens * nchunks; u += nwarps) {
    const int t = u / nchunks;
    const int c = (u - t * nchunks) * 256 + lane * 8;
    const bool valid = c < a.hidden;
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    for (int k0 = 0; k0 < K; k0 += 8) {
      uint4 v[8];
      float w[8];
      bool use[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int k = k0 + i;
        const int e = k < K ? (int)topk[t * K + k] : -1;
        w[i] = k < K ? a.weights[t * K + k] : 0.f;
        use[i] = valid && e >= 0 && e < a.num_experts;
        v[i] = use[i] ? __ldcg(reinterpret_cast<const uint4 *>(
                            region + (size_t)(t * K + k) * row_elems + c))
                      : make_uint4(0u, 0u, 0u, 0u);
      }
      /* k ascending, one fmaf per slot: the documented (deterministic)
       * order, unchanged. */
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        if (!use[i]) continue;
        const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&v[i]);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float2 f = __bfloat1622float2(h[j]);
          acc[2 * j] = fmaf(w[i], f.x, acc[2 * j]);
          acc[2 * j + 1] = fmaf(w[i], f.y, acc[2 * j + 1]);
        }
      }
    }
    if (valid) {
      uint4 o;
      __nv_bfloat162 *ob = reinterpret_cast<__nv_bfloat162 *>(&o);
#pragma unroll
      for (int j = 0; j < 4; ++j) ob[j] = __floats2bfloat162_rn(acc[2 * j], acc[2 * j + 1]);
      *reinterpret_cast<uint4 *>(a.out + (size_t)t * a.hidden + c) = o;
    }
  }

  /* Shadows advance once every block has read them. */
  if (mep_last_block(&p.tickets[MEP_LL_TICKET_COMBINE_RECV])) {
    for (int r = threadIdx.x; r < R; r += blockDim.x) {
      p.shadows[mep_ll_sig_comb_cnt(&p.dims, r)] += (uint64_t)cnt[r] + 1;
      if (Tp::kRowSignals) p.shadows[mep_ll_sig_comb_row(&p.dims, r)] += (uint64_t)cnt[r];
    }
  }
}

template <class Tp>
cudaError_t launch_tp(const MepLLParams &p, const CRecvArgs &a, int idx_bytes, int grid,
                      size_t smem, cudaStream_t s) {
  if (idx_bytes == 8)
    ll_combine_recv_kernel<Tp, int64_t><<<grid, MEP_LL_THREADS, smem, s>>>(p, a);
  else
    ll_combine_recv_kernel<Tp, int32_t><<<grid, MEP_LL_THREADS, smem, s>>>(p, a);
  return cudaGetLastError();
}

}  // namespace

extern "C" moe_ep_status_t mep_ll_combine_recv(const mep_ll_ctx_t *ctx,
                                               const mep_ll_combine_args_t *a, void *stream) {
  moe_ep_status_t st = mep_ll_combine_check("combine_recv", ctx, a);
  if (st != MOE_EP_OK) return st;
  if (a->topk_idx == nullptr || a->topk_weights == nullptr ||
      (a->num_tokens > 0 && a->out == nullptr))
    return mep_kernels_error(MOE_EP_ERR_INVALID_ARGUMENT,
                             "combine_recv: topk_idx, topk_weights and out must not be NULL");
  MepLLParams p;
  mep_ll_make_params(ctx, a->buffer_set, &p);
  CRecvArgs k;
  k.topk = a->topk_idx;
  k.weights = a->topk_weights;
  k.out = (__nv_bfloat16 *)a->out;
  k.tokens = a->num_tokens;
  k.hidden = a->hidden;
  k.top_k = a->top_k;
  k.num_experts = a->num_experts;
  /* units: (token, 256-channel chunk), one per warp */
  const int grid = mep_ll_grid_for(ctx, (int64_t)a->num_tokens * ((a->hidden + 255) / 256));
  const size_t smem = (size_t)ctx->dims.world * sizeof(int);
  cudaStream_t s = (cudaStream_t)stream;
  cudaError_t e;
  switch (ctx->transport) {
    case MEP_LL_TRANSPORT_LSA: e = launch_tp<MepLsa>(p, k, a->topk_idx_bytes, grid, smem, s); break;
    case MEP_LL_TRANSPORT_GIN: e = launch_tp<MepGin>(p, k, a->topk_idx_bytes, grid, smem, s); break;
    default: e = launch_tp<MepGinEmu>(p, k, a->topk_idx_bytes, grid, smem, s); break;
  }
  return mep_kernels_cuda_check("combine_recv: launch", e);
}
