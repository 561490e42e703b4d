/* ht_launch.cuh: host-side glue of the HT launchers: argument checks, the
 * parameter block, the channel count and the cooperative launch. */
#ifndef MEP_HT_LAUNCH_CUH_
#define MEP_HT_LAUNCH_CUH_

#include <string.h>

#include "kernels/common/kernels_error.h"
#include "kernels/common/launch.cuh"
#include "kernels/ht/ht_device.cuh"
#include "kernels/ht/ht_layout.h"

/* Channels: one sender and one receiver block each, within the SM budget
 * and the device (every block of the cooperative grid must be resident). */
static inline int mep_ht_channels_for(int num_sms) {
  int c = num_sms / 2;
  const int dev = mep_device_sms() / 2;
  if (c > dev) c = dev;
  if (c > MEP_HT_MAX_CHANNELS) c = MEP_HT_MAX_CHANNELS;
  return c < 1 ? 1 : c;
}

static inline mep_kstatus_t mep_ht_check_ctx(const char *op, const mep_ht_ctx_t *ctx) {
  if (ctx == nullptr || ctx->dev_comm == nullptr || ctx->window == nullptr ||
      ctx->state == nullptr || ctx->error_dev == nullptr || ctx->lsa_base == 0)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "%s: the HT context or one of its pointers (dev_comm, window, "
                             "state, error record, LSA base) is NULL", op);
  const mep_ht_dims_t *d = &ctx->dims;
  if (d->world < 1 || d->world > MEP_HT_MAX_RANKS)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "%s: world is %d; high-throughput mode takes 1..%d ranks", op,
                             d->world, MEP_HT_MAX_RANKS);
  if (d->local_experts < 1 || d->local_experts > MEP_MAX_LOCAL_EXPERTS ||
      d->max_tokens < 0 || d->max_tokens > MEP_MAX_TOKENS_HT)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "%s: the context's dims hold local_experts %d and max_tokens %d; "
                             "they must be in 1..%d and 0..%d", op, d->local_experts,
                             d->max_tokens, MEP_MAX_LOCAL_EXPERTS, MEP_MAX_TOKENS_HT);
  const bool net = ctx->transport == MEP_HT_TRANSPORT_GIN ||
                   ctx->transport == MEP_HT_TRANSPORT_GIN_EMULATED;
  if (net ? d->node_ranks < 1 || d->world % d->node_ranks != 0 : d->node_ranks != 0)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "%s: transport %d with node_ranks %d (world %d): the network "
                             "transports need node_ranks dividing world, LSA needs 0", op,
                             ctx->transport, d->node_ranks, d->world);
  if (ctx->num_sms <= 0)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "%s: num_sms is %d; it must be positive", op, ctx->num_sms);
  if (ctx->window_bytes < mep_ht_buffer_bytes(d))
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "%s: window_bytes %llu is smaller than the HT buffer for its dims",
                             op, (unsigned long long)ctx->window_bytes);
  return MEP_KSTATUS_OK;
}

static inline mep_kstatus_t mep_ht_check_shape(const char *op, const mep_ht_ctx_t *ctx,
                                               int tokens, int hidden, int top_k,
                                               int num_experts, int idx_bytes, int set) {
  const mep_ht_dims_t *d = &ctx->dims;
  const mep_kstatus_t st = mep_check_shape(op, tokens, d->max_tokens, hidden, d->hidden, top_k,
                                           d->top_k, num_experts, d->world, d->local_experts,
                                           idx_bytes);
  if (st != MEP_KSTATUS_OK) return st;
  if (set < 0 || set >= MEP_NUM_BUFFER_SETS)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "%s: buffer_set is %d; it must be in 0..%d", op, set,
                             MEP_NUM_BUFFER_SETS - 1);
  return MEP_KSTATUS_OK;
}

/* What every HT launcher checks first: non-NULL arguments, a usable
 * context, a call shape within its capacities and a buffer set `set`. Args
 * is mep_ht_dispatch_args_t or mep_ht_combine_args_t. */
template <typename Args>
static inline mep_kstatus_t mep_ht_check_call(const char *op, const mep_ht_ctx_t *ctx,
                                              const Args *a, int set) {
  if (a == nullptr) return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT, "%s: args is NULL", op);
  mep_kstatus_t st = mep_ht_check_ctx(op, ctx);
  if (st != MEP_KSTATUS_OK) return st;
  return mep_ht_check_shape(op, ctx, a->num_tokens, a->hidden, a->top_k, a->num_experts,
                            a->topk_idx_bytes, set);
}

static inline mep_kstatus_t mep_ht_check_dispatch(const mep_ht_ctx_t *ctx,
                                                  const mep_ht_dispatch_args_t *a) {
  const char *op = "ht dispatch";
  mep_kstatus_t st = mep_ht_check_call(op, ctx, a, a != nullptr ? a->buffer_set : 0);
  if (st != MEP_KSTATUS_OK) return st;
  /* The scale layouts a count word can describe (row_desc.h). */
  if (a->fp8 && (a->hidden % MEP_HIDDEN_ALIGN != 0 || a->scale_mode < MEP_FP8_SCALE_F32 ||
                 a->scale_mode > MEP_FP8_SCALE_PER_TOKEN ||
                 a->scale_words != mep_fp8_scale_words(a->hidden, a->scale_mode)))
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "%s: fp8 rows need hidden a multiple of %d (hidden %d), scale_mode "
                             "0..3 (got %d) and its scale words per row: hidden/128 for f32 "
                             "storage, ceil(hidden/512) packed, 1 per token (got %d)", op, MEP_HIDDEN_ALIGN,
                             a->hidden, a->scale_mode, a->scale_words);
  if (a->num_tokens > 0 && (a->x == nullptr || a->topk_idx == nullptr ||
                            a->topk_weights == nullptr || (a->fp8 && a->x_scales == nullptr)))
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "%s: x, x_scales (fp8), topk_idx or topk_weights is NULL with %d "
                             "tokens", op, a->num_tokens);
  if (a->recv_capacity < 0 || (a->recv_capacity > 0 &&
                               (a->recv_x == nullptr || a->recv_topk_idx == nullptr ||
                                a->recv_topk_weights == nullptr ||
                                (a->fp8 && a->recv_scales == nullptr))) ||
      a->recv_count == nullptr)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "%s: an output (recv_x, recv_scales for fp8, recv_topk_idx, "
                             "recv_topk_weights, recv_count) is NULL or recv_capacity %lld < 0",
                             op, (long long)a->recv_capacity);
  if (!a->pad && a->num_recv == nullptr)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "%s: num_recv is NULL without pad: the received row count, or the "
                             "refusal of a call whose sources' rows differ, has nowhere to go",
                             op);
  return MEP_KSTATUS_OK;
}

static inline mep_kstatus_t mep_ht_check_combine(const mep_ht_ctx_t *ctx,
                                                 const mep_ht_combine_args_t *a) {
  const char *op = "ht combine";
  mep_kstatus_t st = mep_ht_check_call(op, ctx, a, a != nullptr ? a->layout_set : 0);
  if (st != MEP_KSTATUS_OK) return st;
  if (a->channels < 1 || a->channels > MEP_HT_MAX_CHANNELS)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "%s: channels is %d; it must be the dispatch's (1..%d)", op,
                             a->channels, MEP_HT_MAX_CHANNELS);
  if (a->num_tokens > 0 && (a->topk_idx == nullptr || a->out == nullptr))
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "%s: topk_idx or out is NULL with %d tokens", op, a->num_tokens);
  return MEP_KSTATUS_OK;
}

static inline void mep_ht_make_params(const mep_ht_ctx_t *ctx, int set, int chan,
                                      MepHtParams *p) {
  memset(p, 0, sizeof *p);
  memcpy(&p->xp.comm, ctx->dev_comm, sizeof(ncclDevComm));
  p->xp.win = (ncclWindow_t)ctx->window;
  p->xp.local = ctx->lsa_local != 0 ? (char *)(uintptr_t)ctx->lsa_local : (char *)ctx->window_local;
  p->xp.lsa_base = (char *)(uintptr_t)ctx->lsa_base;
  p->xp.lsa_stride = ctx->lsa_stride;
  p->xp.rank = ctx->rank;
  p->xp.world = ctx->dims.world;
  p->dims = ctx->dims;
  p->win = mep_ht_window_layout(&ctx->dims);
  /* GIN-emulated keeps its signals in the window; GIN's ids start at 0. */
  p->xp.sig_off = p->win.sig;
  p->xp.gin_sig_base = 0;
  p->st = mep_ht_state_layout(&ctx->dims);
  p->state = (char *)ctx->state;
  p->chan = chan;
  p->wc.timeout_cycles = ctx->timeout_cycles;
  p->wc.abort_flag = (uint32_t *)(p->state + p->st.abort_flag);
  p->wc.err = ctx->error_dev;
  p->wc.notice = ctx->notice_dev;
  p->wc.rank = ctx->rank;
  p->wc.set = set;
}

/* Every block waits on blocks of the same launch (a receiver on senders
 * that may be its neighbours), so all must be resident: cooperative. */
template <typename Kernel, typename... Args>
static cudaError_t mep_ht_launch(Kernel kernel, int grid, cudaStream_t s, Args &&...args) {
  return mep_launch_cooperative(kernel, grid, MEP_HT_THREADS, 0, s, static_cast<Args &&>(args)...);
}

/* launch(Tp{}) with the transport type of `transport` (MEP_HT_TRANSPORT_*):
 * one kernel instance per transport, picked once here for both kernels. */
template <typename Launch>
static cudaError_t mep_ht_for_transport(int transport, Launch launch) {
  switch (transport) {
    case MEP_HT_TRANSPORT_GIN: return launch(MepGin{});
    case MEP_HT_TRANSPORT_GIN_EMULATED: return launch(MepGinEmu{});
    default: return launch(MepLsa{});
  }
}

#endif /* MEP_HT_LAUNCH_CUH_ */
