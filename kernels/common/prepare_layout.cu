/* prepare_layout.cu: prepare's optional layout outputs on the GPU (tokens per
 * rank, per expert, is_token_in_rank) from the device topk_idx, and their
 * launcher (mep_prepare_layout). Same counting rules as the host backend's
 * prepare and the test oracle (tests/oracle/prepare.cc). */
#include <cuda_runtime.h>

#include "kernels/common/kernels_error.h"
#include "kernels/common/load.cuh"
#include "kernels/common/limits.h"
#include "kernels/common/prepare_layout.h"

namespace {

/* One block: the counts need no cross-block reduction, so no scratch memory,
 * no ticket and no zeroing pass before the launch (one kernel, capturable,
 * and two prepares on two streams never share state). LL calls have at most
 * MEP_MAX_TOKENS_LL * MEP_MAX_TOP_K slots: a few warp steps each. */
constexpr int kThreads = 1024;
/* Per-expert counters held in shared memory per pass (32 KiB, under the
 * 48 KiB a launch gets without opting in): one pass up to 8192 experts,
 * more passes over topk_idx only beyond that. */
constexpr int kExpertChunk = 8192;

/* Block-wide zero of n bytes at p (any alignment): 16-byte stores for the
 * aligned middle, so a [T, R] byte matrix costs T * R / 16 stores. */
__device__ void zero_bytes(uint8_t *p, size_t n) {
  const size_t head = min(n, (size_t)((16u - ((uintptr_t)p & 15u)) & 15u));
  const size_t body = (n - head) / 16;
  for (size_t i = threadIdx.x; i < head; i += blockDim.x) p[i] = 0;
  uint4 *v = reinterpret_cast<uint4 *>(p + head);
  for (size_t i = threadIdx.x; i < body; i += blockDim.x) v[i] = make_uint4(0, 0, 0, 0);
  for (size_t i = head + body * 16 + threadIdx.x; i < n; i += blockDim.x) p[i] = 0;
}

template <typename IdxT>
__global__ void __launch_bounds__(kThreads) prepare_layout_kernel(mep_prepare_layout_args_t a) {
  extern __shared__ int32_t smem[];
  int32_t *rank_count = smem;             /* [world] */
  int32_t *expert_count = smem + a.world; /* [min(num_experts, kExpertChunk)] */
  const int T = a.num_tokens, K = a.top_k, R = a.world, E = a.num_experts;
  const int local = E / R; /* experts live on ranks in contiguous blocks */
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  /* Whole tokens per warp step (lane = group * K + k), so every slot of a
   * token is in one warp and __match_any_sync sees all of them. */
  const int per_warp = 32 / K, group = lane / K, k = lane - group * K;
  const bool ranks = a.num_tokens_per_rank != nullptr || a.is_token_in_rank != nullptr;
  const IdxT *topk = static_cast<const IdxT *>(a.topk_idx);

  for (int i = threadIdx.x; i < R; i += blockDim.x) rank_count[i] = 0;
  if (a.is_token_in_rank != nullptr) zero_bytes(a.is_token_in_rank, (size_t)T * (size_t)R);
  const int chunk = E < kExpertChunk ? E : kExpertChunk;
  const int passes = a.num_tokens_per_expert != nullptr ? (E + chunk - 1) / chunk : 1;
  for (int pass = 0; pass < passes; pass++) {
    const int e0 = pass * chunk, n = E - e0 < chunk ? E - e0 : chunk;
    if (a.num_tokens_per_expert != nullptr)
      for (int i = threadIdx.x; i < n; i += blockDim.x) expert_count[i] = 0;
    __syncthreads(); /* counters and is_token_in_rank zeroed before any count or mark */
    for (int t0 = warp * per_warp; t0 < T; t0 += warps * per_warp) {
      const int t = t0 + group;
      int e = -1;
      if (group < per_warp && t < T) {
        const IdxT raw = topk[(size_t)t * (size_t)K + (size_t)k];
        /* Outside -1..E-1 counts as -1: dispatch drops such a slot (and
         * reports it); the layout must describe what dispatch sends. */
        if (raw >= 0 && raw < (IdxT)E) e = (int)raw;
      }
      if (a.num_tokens_per_expert != nullptr && e >= e0 && e < e0 + n)
        atomicAdd(&expert_count[e - e0], 1);
      if (pass == 0 && ranks) { /* warp-uniform: every lane reaches the match */
        const int r = e >= 0 ? e / local : 0;
        /* Slots of one token on one rank share a key; empty slots get keys
         * of their own. The lowest lane of each key counts the token once. */
        const unsigned key = e >= 0 ? ((unsigned)group << 16) | (unsigned)r : 0x80000000u | lane;
        const unsigned same = __match_any_sync(0xffffffffu, key);
        if (e >= 0 && __ffs(same) - 1 == lane) {
          if (a.num_tokens_per_rank != nullptr) atomicAdd(&rank_count[r], 1);
          if (a.is_token_in_rank != nullptr) a.is_token_in_rank[(size_t)t * R + r] = 1;
        }
      }
    }
    __syncthreads(); /* every count of this pass is in */
    /* Each thread copies out, then (next pass) re-zeroes, the same indices:
     * no other thread's read races the zeroing. */
    if (a.num_tokens_per_expert != nullptr)
      for (int i = threadIdx.x; i < n; i += blockDim.x)
        a.num_tokens_per_expert[e0 + i] = expert_count[i];
  }
  if (a.num_tokens_per_rank != nullptr)
    for (int i = threadIdx.x; i < R; i += blockDim.x) a.num_tokens_per_rank[i] = rank_count[i];
}

}  // namespace

extern "C" mep_kstatus_t mep_prepare_layout_load(void) {
  return mep_kernels_cuda_check(
      "prepare_layout: loading its kernels",
      mep_load_kernels(prepare_layout_kernel<int32_t>, prepare_layout_kernel<int64_t>));
}

extern "C" mep_kstatus_t mep_prepare_layout(const mep_prepare_layout_args_t *a, void *stream) {
  if (a == nullptr)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT, "prepare_layout: args is NULL");
  if (a->num_tokens < 0 || a->num_tokens > MEP_MAX_TOKENS_HT)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "prepare_layout: num_tokens is %d; it must be in 0..%d",
                             a->num_tokens, MEP_MAX_TOKENS_HT);
  if (a->top_k < 1 || a->top_k > MEP_MAX_TOP_K)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "prepare_layout: top_k is %d; it must be in 1..%d", a->top_k,
                             MEP_MAX_TOP_K);
  if (a->world < 1 || a->world > MEP_MAX_RANKS)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "prepare_layout: world is %d; it must be in 1..%d", a->world,
                             MEP_MAX_RANKS);
  if (a->num_experts < 1 || a->num_experts > MEP_MAX_EXPERTS || a->num_experts % a->world != 0)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "prepare_layout: num_experts is %d; it must be a multiple of world "
                             "%d in 1..%d", a->num_experts, a->world, MEP_MAX_EXPERTS);
  if (a->topk_idx_bytes != 4 && a->topk_idx_bytes != 8)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "prepare_layout: topk_idx_bytes is %d; it must be 4 (int32) or 8 "
                             "(int64)", a->topk_idx_bytes);
  if (a->num_tokens_per_rank == nullptr && a->num_tokens_per_expert == nullptr &&
      a->is_token_in_rank == nullptr)
    return MEP_KSTATUS_OK; /* nothing asked for */
  if (a->num_tokens > 0 && a->topk_idx == nullptr)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "prepare_layout: topk_idx is NULL with %d tokens", a->num_tokens);
  const int chunk = a->num_experts < kExpertChunk ? a->num_experts : kExpertChunk;
  const size_t smem = ((size_t)a->world + (a->num_tokens_per_expert ? (size_t)chunk : 0)) * 4u;
  cudaStream_t s = (cudaStream_t)stream;
  const cudaError_t e = a->topk_idx_bytes == 8
                            ? mep_launch(prepare_layout_kernel<int64_t>, 1, kThreads, smem, s, *a)
                            : mep_launch(prepare_layout_kernel<int32_t>, 1, kThreads, smem, s, *a);
  return mep_kernels_cuda_check("prepare_layout: launch", e);
}
