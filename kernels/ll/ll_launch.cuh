/* ll_launch.cuh: host-side glue shared by the LL launchers: validating the
 * context, building the kernel parameter block, picking the grid. */
#ifndef MEP_LL_LAUNCH_CUH_
#define MEP_LL_LAUNCH_CUH_

#include <string.h>

#include "kernels/common/kernels_error.h"
#include "kernels/common/launch.cuh"
#include "kernels/common/limits.h"
#include "kernels/ll/ll_signals.cuh"

/* Threads per LL block: 16 warps; one block per SM so spinning warps never
 * wait on a block that cannot become resident. */
#define MEP_LL_THREADS 512
/* The dispatch's wait for its peers' combine (ll_await.cu): one thread per
 * source, in turns. */
#define MEP_LL_AWAIT_THREADS 128

/* This warp's place in a block-minor order over the grid (warp w of block
 * b is b + w * gridDim.x): a loop over work units striding by the grid's
 * warp count hands its first units one per block, so at small batches the
 * loads spread over many SMs' load paths instead of queueing in the first
 * blocks' (EP1, H200, hidden 7168: the per-slot combine's send half at 32
 * tokens 11.1 -> 7.9 us against the block-major order). */
__device__ __forceinline__ int mep_ll_spread_warp() {
  return (int)(threadIdx.x / 32) * (int)gridDim.x + (int)blockIdx.x;
}

static inline mep_kstatus_t mep_ll_check_ctx(const char *op, const mep_ll_ctx_t *ctx,
                                               int set) {
  if (ctx == nullptr || ctx->dev_comm == nullptr || ctx->window == nullptr ||
      ctx->window_local == nullptr || ctx->state == nullptr || ctx->error_dev == nullptr)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "%s: the LL context or one of its pointers is NULL", op);
  if (set < 0 || set >= mep_ll_num_sets(&ctx->dims))
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "%s: buffer_set is %d; the window holds %d set(s)", op, set,
                             mep_ll_num_sets(&ctx->dims));
  if (ctx->transport != MEP_LL_TRANSPORT_LSA && ctx->transport != MEP_LL_TRANSPORT_GIN &&
      ctx->transport != MEP_LL_TRANSPORT_GIN_EMULATED)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "%s: transport is %d; it must be lsa (1), gin (2) or "
                             "gin_emulated (3)", op, ctx->transport);
  if (ctx->transport != MEP_LL_TRANSPORT_GIN && ctx->lsa_base == 0)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "%s: the context's LSA addresses are not resolved; call "
                             "mep_ll_resolve_lsa after setting dev_comm and window", op);
  /* The slot-list words hold local expert + 1 in 16 bits and slot_src a
   * token in 11; the count code must stay below 2^32. */
  if (ctx->dims.max_tokens < 1 || ctx->dims.max_tokens > MEP_MAX_TOKENS_LL ||
      ctx->dims.local_experts < 1 || ctx->dims.local_experts > MEP_MAX_LOCAL_EXPERTS)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "%s: the context's dims hold max_tokens %d and local_experts %d; "
                             "they must be in 1..%d and 1..%d", op, ctx->dims.max_tokens,
                             ctx->dims.local_experts, MEP_MAX_TOKENS_LL, MEP_MAX_LOCAL_EXPERTS);
  /* The slot-list words and slot_src hold the rank in 16 bits; the
   * receive's shared memory grows with the world; top_k and hidden bound
   * the call's own (mep_ll_check_shape) and the rows' strides. */
  if (ctx->dims.world < 1 || ctx->dims.world > MEP_MAX_RANKS || ctx->dims.top_k < 1 ||
      ctx->dims.top_k > MEP_MAX_TOP_K || ctx->dims.hidden < 8 ||
      ctx->dims.hidden > MEP_MAX_HIDDEN || ctx->dims.hidden % 8 != 0)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "%s: the context's dims hold world %d, top_k %d and hidden %d; "
                             "they must be in 1..%d, 1..%d and 8..%d (a multiple of 8)", op,
                             ctx->dims.world, ctx->dims.top_k, ctx->dims.hidden, MEP_MAX_RANKS,
                             MEP_MAX_TOP_K, MEP_MAX_HIDDEN);
  if (ctx->num_sms <= 0)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "%s: num_sms is %d; it must be positive", op, ctx->num_sms);
  if (ctx->window_bytes < mep_ll_buffer_bytes(&ctx->dims))
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "%s: window_bytes %llu is smaller than the LL buffer for its dims",
                             op, (unsigned long long)ctx->window_bytes);
  if (ctx->dims.lsa_only && ctx->transport != MEP_LL_TRANSPORT_LSA)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "%s: the window was laid out without staging (dims.lsa_only), but "
                             "the transport is %s, which stages its sends", op,
                             ctx->transport == MEP_LL_TRANSPORT_GIN ? "gin" : "gin_emulated");
  return MEP_KSTATUS_OK;
}

static inline mep_kstatus_t mep_ll_check_shape(const char *op, const mep_ll_ctx_t *ctx,
                                                 int tokens, int hidden, int top_k,
                                                 int num_experts, int idx_bytes) {
  const mep_ll_dims_t *d = &ctx->dims;
  return mep_check_shape(op, tokens, d->max_tokens, hidden, d->hidden, top_k, d->top_k,
                         num_experts, d->world, d->local_experts, idx_bytes);
}

static inline void mep_ll_make_params(const mep_ll_ctx_t *ctx, int set, MepLLParams *p) {
  memset(p, 0, sizeof *p);
  p->dims = ctx->dims;
  p->lay = mep_ll_set_layout(&ctx->dims);
  p->set_off = (uint64_t)set * p->lay.set_bytes;
  MepXport *x = &p->xp;
  memcpy(&x->comm, ctx->dev_comm, sizeof(ncclDevComm));
  x->win = (ncclWindow_t)ctx->window;
  x->local = ctx->lsa_local != 0 ? (char *)(uintptr_t)ctx->lsa_local : (char *)ctx->window_local;
  x->lsa_base = (char *)(uintptr_t)ctx->lsa_base;
  x->lsa_stride = ctx->lsa_stride;
  x->sig_off = p->set_off; /* the set's signals come first (mep_ll_set_layout) */
  x->gin_sig_base = (uint32_t)(set * p->lay.num_signals);
  x->rank = ctx->rank;
  x->world = ctx->dims.world;
  const mep_ll_state_layout_t s = mep_ll_state_layout(&ctx->dims);
  char *st = (char *)ctx->state;
  MepWaitCtx *w = &p->wc;
  w->timeout_cycles = ctx->timeout_cycles;
  w->abort_flag = (uint32_t *)(st + s.abort_flag);
  w->err = ctx->error_dev;
  w->notice = ctx->notice_dev;
  w->rank = ctx->rank;
  w->set = set;
  p->shadows =
      (uint64_t *)(st + s.shadows) + (uint64_t)set * MEP_LL_SHADOW_SLOTS * p->lay.num_signals;
  p->puts = (uint32_t *)(st + s.puts) + (uint64_t)set * ctx->dims.world;
  p->comb_puts = (uint32_t *)(st + s.comb_puts) + (uint64_t)set * ctx->dims.world;
  p->tags = (uint32_t *)(st + s.tags) +
            (uint64_t)set * MEP_LL_SHADOW_SLOTS * mep_ll_tag_words(ctx->dims.world);
  p->tickets = (uint32_t *)(st + s.tickets + (uint64_t)set * mep_ll_set_counter_bytes(&ctx->dims));
  p->stamps = ctx->stamps;
}

/* The checks every LL launcher starts with: non-NULL arguments, a usable
 * context and buffer set, and a call shape within the context's capacities.
 * Args is mep_ll_dispatch_args_t or mep_ll_combine_args_t. */
template <typename Args>
static inline mep_kstatus_t mep_ll_check_call(const char *op, const mep_ll_ctx_t *ctx,
                                                const Args *a) {
  if (a == nullptr)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT, "%s: args is NULL", op);
  mep_kstatus_t st = mep_ll_check_ctx(op, ctx, a->buffer_set);
  if (st != MEP_KSTATUS_OK) return st;
  return mep_ll_check_shape(op, ctx, a->num_tokens, a->hidden, a->top_k, a->num_experts,
                            a->topk_idx_bytes);
}

/* Calls fn(MepType<Tp>{}) with the transport type the context names, so a
 * launcher instantiates its kernel for it in one place. */
template <typename Fn>
static inline cudaError_t mep_ll_with_transport(int transport, Fn &&fn) {
  switch (transport) {
    case MEP_LL_TRANSPORT_LSA: return fn(MepType<MepLsa>{});
    case MEP_LL_TRANSPORT_GIN: return fn(MepType<MepGin>{});
    default: return fn(MepType<MepGinEmu>{});
  }
}

/* fn(MepType<Tp>{}) for every transport type, LSA, GIN and GIN-emulated,
 * until one fails (the kernels' loads: every instance, whatever the
 * group's transport). */
template <typename Fn>
static inline cudaError_t mep_ll_each_transport(Fn &&fn) {
  cudaError_t e = fn(MepType<MepLsa>{});
  if (e == cudaSuccess) e = fn(MepType<MepGin>{});
  if (e == cudaSuccess) e = fn(MepType<MepGinEmu>{});
  return e;
}

/* Blocks per launch: the caller's SM budget, never more than the device's
 * SM count (co-residency of spinning blocks) or the receive blocks' shadow
 * copies (MEP_LL_SHADOW_SLOTS). */
static inline int mep_ll_grid(const mep_ll_ctx_t *ctx) {
  int sms = mep_device_sms();
  if (sms > MEP_LL_SHADOW_SLOTS) sms = MEP_LL_SHADOW_SLOTS;
  return ctx->num_sms < sms ? ctx->num_sms : sms;
}

/* Blocks for `units` warp-sized work units: enough warps for one unit each,
 * at least one block, at most mep_ll_grid. */
static inline int mep_ll_grid_for(const mep_ll_ctx_t *ctx, int64_t units) {
  const int64_t warps = MEP_LL_THREADS / 32;
  const int64_t want = (units + warps - 1) / warps;
  const int most = mep_ll_grid(ctx);
  return want < 1 ? 1 : (want < most ? (int)want : most);
}

/* Blocks for `units` work units taken in mep_ll_spread_warp order: one
 * block per unit (each unit on its own SM), at least one block, at most
 * `most` (mep_ll_grid) (EP1, H200, hidden 7168: the per-slot combine's receive half
 * at 1 / 32 tokens 7.6 / 8.4 us with mep_ll_grid_for's 16 units per block,
 * 6.7 / 7.4 us with one). */
static inline int mep_ll_grid_spread(int most, int64_t units) {
  return units < 1 ? 1 : (units < most ? (int)units : most);
}

/* Launches a fused (send, then receive) kernel as a cooperative grid: its
 * receive half waits for lists and signals that other blocks of the same
 * launch send, so every block must be resident at once. A cooperative
 * launch guarantees that (or fails) instead of leaving it to whatever else
 * holds SMs. */
template <typename... Params, typename... Args>
static cudaError_t mep_ll_launch_fused(void (*kernel)(Params...), int grid, size_t smem,
                                       cudaStream_t s, Args &&...args) {
  return mep_launch_cooperative(kernel, grid, MEP_LL_THREADS, smem, s,
                                static_cast<Args &&>(args)...);
}

#endif /* MEP_LL_LAUNCH_CUH_ */
