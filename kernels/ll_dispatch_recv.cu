/* ll_dispatch_recv.cu: LL dispatch, receive half. One block per local
 * expert: wait every source rank's count (and, for GIN, its rows), prefix
 * the counts over source ranks, and copy rows into packed slots grouped by
 * source rank then token order. Writes the handle (slot sources, counts). */
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
  int hidden, local_experts, scale_mode;
  uint32_t row_bytes;
};

template <class Tp, bool kFp8>
__global__ void __launch_bounds__(MEP_LL_THREADS, 1)
    ll_dispatch_recv_kernel(const __grid_constant__ MepLLParams p, const RecvArgs a) {
  extern __shared__ int smem[]; /* counts [R], prefix [R + 1] */
  const int R = p.dims.world;
  int *cnt = smem;
  int *prefix = smem + R;
  __shared__ int failed;
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const int cap = R * p.dims.max_tokens; /* slots per local expert */

  for (int le = blockIdx.x; le < a.local_experts; le += gridDim.x) {
    if (threadIdx.x == 0) failed = 0;
    __syncthreads();
    for (int r = threadIdx.x; r < R; r += blockDim.x) {
      const uint32_t cs = mep_ll_sig_disp_cnt(&p.dims, le, r);
      const uint64_t base = p.shadows[cs];
      uint64_t seen = 0;
      int c = 0;
      if (mep_wait_ge(p, [&] { return Tp::read_signal(p, cs); }, base + 1,
                      MEP_LL_OP_DISPATCH_RECV, r, le, &seen)) {
        c = (int)(seen - base - 1);
        /* The sender never counts past max_tokens; a larger count could
         * only come from a corrupt signal: never read past the region. */
        if (c < 0 || c > p.dims.max_tokens) c = c < 0 ? 0 : p.dims.max_tokens;
        if (Tp::kRowSignals) {
          const uint32_t rs = mep_ll_sig_disp_row(&p.dims, le, r);
          const uint64_t rbase = p.shadows[rs];
          uint64_t rseen;
          /* payload put + meta put per row */
          if (mep_wait_ge(p, [&] { return Tp::read_signal(p, rs); }, rbase + 2u * c,
                          MEP_LL_OP_DISPATCH_RECV, r, le, &rseen))
            p.shadows[rs] = rbase + 2u * c;
          else
            failed = 1;
        }
        p.shadows[cs] = seen;
      } else {
        failed = 1;
      }
      cnt[r] = c;
    }
    __syncthreads();
    if (failed) return; /* the record says why; outputs stay as they were */
    if (threadIdx.x == 0) {
      int acc = 0;
      for (int r = 0; r < R; ++r) {
        prefix[r] = acc;
        acc += cnt[r];
      }
      prefix[R] = acc;
      a.recv_count[le] = acc;
    }
    __syncthreads();
    for (int r = threadIdx.x; r < R; r += blockDim.x) a.src_count[le * R + r] = cnt[r];
    const int total = prefix[R];
    for (int j = warp; j < total; j += MEP_LL_THREADS / 32) {
      int r = 0;
      while (r < R - 1 && prefix[r + 1] <= j) ++r; /* slots ascend with r; at most R steps */
      const int i = j - prefix[r];
      const uint64_t src_slot = ((uint64_t)le * R + r) * p.dims.max_tokens + i;
      const uint64_t dst_slot = (uint64_t)le * cap + j;
      const char *row = p.local + p.set_off + p.lay.disp_recv + src_slot * a.row_bytes;
      if (kFp8) {
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
      } else {
        mep_copy_warp((char *)a.recv_x + dst_slot * a.hidden * 2, row, (uint32_t)a.hidden * 2);
      }
      if (lane == 0) {
        const int4 m = __ldcg(reinterpret_cast<const int4 *>(
            p.local + p.set_off + p.lay.disp_meta + src_slot * MEP_LL_META_BYTES));
        a.slot_src[dst_slot] = MEP_LL_SLOT_PACK(r, m.x, m.y);
      }
    }
    __syncthreads(); /* smem reused by the next expert */
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
  k.local_experts = a->num_experts / ctx->dims.world;
  k.scale_mode = a->scale_mode;
  k.row_bytes = (uint32_t)mep_ll_dispatch_row_bytes(a->hidden, a->fp8);
  int grid = mep_ll_grid(ctx);
  if (grid > k.local_experts) grid = k.local_experts;
  const size_t smem = (size_t)(2 * ctx->dims.world + 1) * sizeof(int);
  cudaStream_t s = (cudaStream_t)stream;
  cudaError_t e;
  switch (ctx->transport) {
    case MEP_LL_TRANSPORT_LSA: e = launch_tp<MepLsa>(p, k, a->fp8, grid, smem, s); break;
    case MEP_LL_TRANSPORT_GIN: e = launch_tp<MepGin>(p, k, a->fp8, grid, smem, s); break;
    default: e = launch_tp<MepGinEmu>(p, k, a->fp8, grid, smem, s); break;
  }
  return mep_kernels_cuda_check("dispatch_recv: launch", e);
}
