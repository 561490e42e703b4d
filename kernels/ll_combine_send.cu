/* ll_combine_send.cu: LL combine, send half. Every valid slot's expert
 * output row goes back to its source rank, into the (token, k) row of the
 * source's combine region; then the last block to finish sends one count
 * signal per source rank. */
#include "kernels/ll_launch.cuh"

namespace {

struct CSendArgs {
  const __nv_bfloat16 *y;
  const int32_t *recv_count, *slot_src, *src_count;
  int hidden, top_k, local_experts;
};

template <class Tp>
__global__ void __launch_bounds__(MEP_LL_THREADS, 1)
    ll_combine_send_kernel(const __grid_constant__ MepLLParams p, const CSendArgs a) {
  const int lane = threadIdx.x & 31;
  const int nwarps = gridDim.x * (MEP_LL_THREADS / 32);
  const int gwarp = blockIdx.x * (MEP_LL_THREADS / 32) + threadIdx.x / 32;
  const int R = p.dims.world, cap = R * p.dims.max_tokens;
  const uint32_t row_bytes = (uint32_t)a.hidden * 2u;
  const uint32_t row_sig = mep_ll_sig_comb_row(&p.dims, p.rank);

  /* Slots are visited slot-index-major (u = s * E_local + le), so the first
   * pass of the grid covers the first few rows of every expert, where the
   * valid rows are: one row per warp instead of several valid rows landing
   * on the same warp (expert-major order with a stride of the warp count). */
  const int EL = a.local_experts;
  for (int u = gwarp; u < EL * cap; u += nwarps) {
    const int s = u / EL, le = u - s * EL;
    const int j = le * cap + s;
    if (s >= __ldg(a.recv_count + le)) continue;
    const int v = __ldg(a.slot_src + j);
    const int r = MEP_LL_SLOT_RANK(v), t = MEP_LL_SLOT_TOKEN(v), k = MEP_LL_SLOT_K(v);
    const __nv_bfloat16 *yrow = a.y + (size_t)j * a.hidden;
    const uint64_t stage_off = p.set_off + p.lay.stage + (uint64_t)j * row_bytes;
    if (Tp::kStaged) {
      /* GIN reads its source from the window */
      mep_copy_warp(p.local + stage_off, yrow, row_bytes);
      __syncwarp();
    }
    Tp::put_warp(p, r, p.set_off + p.lay.comb_recv + (uint64_t)(t * a.top_k + k) * row_bytes,
                 yrow, stage_off, row_bytes, row_sig);
  }

  if (mep_last_block(&p.tickets[MEP_LL_TICKET_COMBINE_SEND])) {
    for (int r = threadIdx.x / 32; r < R; r += MEP_LL_THREADS / 32) {
      int count = 0;
      for (int le = lane; le < a.local_experts; le += 32) count += __ldg(a.src_count + le * R + r);
#pragma unroll
      for (int m = 16; m >= 1; m >>= 1) count += __shfl_xor_sync(0xffffffffu, count, m);
      if (lane == 0) Tp::signal(p, r, mep_ll_sig_comb_cnt(&p.dims, p.rank), (uint64_t)count + 1);
    }
  }
  Tp::flush_warp(p);
}

}  // namespace

extern "C" moe_ep_status_t mep_ll_combine_check(const char *op, const mep_ll_ctx_t *ctx,
                                                const mep_ll_combine_args_t *a) {
  if (a == nullptr)
    return mep_kernels_error(MOE_EP_ERR_INVALID_ARGUMENT, "%s: args is NULL", op);
  moe_ep_status_t st = mep_ll_check_ctx(op, ctx, a->buffer_set);
  if (st != MOE_EP_OK) return st;
  st = mep_ll_check_shape(op, ctx, a->num_tokens, a->hidden, a->top_k, a->num_experts,
                          a->topk_idx_bytes);
  if (st != MOE_EP_OK) return st;
  if (a->recv_count == nullptr || a->slot_src == nullptr || a->src_count == nullptr)
    return mep_kernels_error(MOE_EP_ERR_INVALID_ARGUMENT,
                             "%s: the handle arrays (recv_count, slot_src, src_count) must not "
                             "be NULL", op);
  return MOE_EP_OK;
}

extern "C" moe_ep_status_t mep_ll_combine_send(const mep_ll_ctx_t *ctx,
                                               const mep_ll_combine_args_t *a, void *stream) {
  moe_ep_status_t st = mep_ll_combine_check("combine_send", ctx, a);
  if (st != MOE_EP_OK) return st;
  if (a->y == nullptr)
    return mep_kernels_error(MOE_EP_ERR_INVALID_ARGUMENT, "combine_send: y is NULL");
  MepLLParams p;
  mep_ll_make_params(ctx, a->buffer_set, &p);
  CSendArgs k;
  k.y = (const __nv_bfloat16 *)a->y;
  k.recv_count = a->recv_count;
  k.slot_src = a->slot_src;
  k.src_count = a->src_count;
  k.hidden = a->hidden;
  k.top_k = a->top_k;
  k.local_experts = a->num_experts / ctx->dims.world;
  const int grid = mep_ll_grid(ctx);
  cudaStream_t s = (cudaStream_t)stream;
  switch (ctx->transport) {
    case MEP_LL_TRANSPORT_LSA:
      ll_combine_send_kernel<MepLsa><<<grid, MEP_LL_THREADS, 0, s>>>(p, k);
      break;
    case MEP_LL_TRANSPORT_GIN:
      ll_combine_send_kernel<MepGin><<<grid, MEP_LL_THREADS, 0, s>>>(p, k);
      break;
    default:
      ll_combine_send_kernel<MepGinEmu><<<grid, MEP_LL_THREADS, 0, s>>>(p, k);
      break;
  }
  return mep_kernels_cuda_check("combine_send: launch", cudaGetLastError());
}
