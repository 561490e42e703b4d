/* ll_host.cu: host-side helpers of the LL path: loading every kernel,
 * buffer/state sizing, timeout conversion, the abort reset and LSA address
 * resolution. */
#include <cuda_runtime.h>
#include <nccl.h>
#include <nccl_device.h>
#include <stddef.h>
#include <string.h>

#include "kernels/common/kernels_error.h"
#include "kernels/common/limits.h"
#include "kernels/ll/ll.h"
#include "kernels/transport/wait.cuh"

extern "C" cudaError_t mep_ll_export_layout_load(void);
extern "C" cudaError_t mep_ll_await_load(void);

extern "C" mep_kstatus_t mep_ll_load(void) {
  mep_kstatus_t st = mep_ll_dispatch_load();
  if (st == MEP_KSTATUS_OK) st = mep_ll_combine_load();
  if (st == MEP_KSTATUS_OK)
    st = mep_kernels_cuda_check("export_layout: loading its kernel", mep_ll_export_layout_load());
  if (st == MEP_KSTATUS_OK)
    st = mep_kernels_cuda_check("await_combine: loading its kernels", mep_ll_await_load());
  return st;
}

extern "C" uint64_t mep_ll_buffer_bytes(const mep_ll_dims_t *dims) {
  return (uint64_t)mep_ll_num_sets(dims) * mep_ll_set_layout(dims).set_bytes;
}

extern "C" uint64_t mep_ll_state_bytes(const mep_ll_dims_t *dims) {
  return mep_ll_state_layout(dims).bytes;
}

extern "C" mep_kstatus_t mep_ll_timeout_cycles(int dev, int32_t kernel_ms, uint64_t *cycles) {
  if (kernel_ms <= 0 || kernel_ms > MEP_MAX_TIMEOUT_MS)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "timeout: kernel_ms is %d; it must be in 1..%d", kernel_ms,
                             MEP_MAX_TIMEOUT_MS);
  int khz = 0;
  mep_kstatus_t st = mep_kernels_cuda_check(
      "timeout: cudaDeviceGetAttribute(ClockRate)",
      cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, dev));
  if (st != MEP_KSTATUS_OK) return st;
  /* Peak clock: the real clock is lower or equal, so a wait never ends
   * early; it can last longer than kernel_ms by the clock ratio. */
  *cycles = (uint64_t)khz * (uint64_t)kernel_ms;
  return MEP_KSTATUS_OK;
}

extern "C" mep_kstatus_t mep_ll_clear_abort(const mep_ll_ctx_t *ctx, void *stream) {
  if (ctx == nullptr || ctx->state == nullptr)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT, "clear_abort: ctx/state is NULL");
  mep_ll_state_layout_t s = mep_ll_state_layout(&ctx->dims);
  /* Blocks that gave up returned without their ticket (or with their help
   * words published): the put counters, the tickets, the help words and
   * the abort flag (contiguous) start again from zero. */
  return mep_kernels_cuda_check(
      "clear_abort: cudaMemsetAsync",
      cudaMemsetAsync((char *)ctx->state + s.puts, 0, s.abort_flag + 4 - s.puts,
                      (cudaStream_t)stream));
}

extern "C" mep_kstatus_t mep_ll_raise_abort(const mep_ll_ctx_t *ctx, void *stream) {
  if (ctx == nullptr || ctx->state == nullptr)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT, "raise_abort: ctx/state is NULL");
  const mep_ll_state_layout_t s = mep_ll_state_layout(&ctx->dims);
  return mep_kernels_cuda_check(
      "raise_abort: cudaMemcpyAsync",
      mep_raise_abort_flag((uint32_t *)((char *)ctx->state + s.abort_flag), (cudaStream_t)stream));
}

/* NCCL 2.28's device API computes a peer's LSA address as the window's
 * lsaFlatBase plus peer * stride4G * 4 GiB (ncclGetLsaPointer,
 * nccl_device/impl/core__funcs.h), from the window's device-side
 * descriptor; the kernels use the same rule (base + rank * stride). The
 * fields are read on the host from a copy of the descriptor's first bytes:
 * no kernel, since a kernel's first launch loads its module, and a module
 * load waits for everything running on the device, the engine's work too.
 * The loaded NCCL's version equals the headers' (the runtime checks), so
 * the layout is the one compiled here. */
extern "C" size_t mep_ll_window_desc_bytes(void) {
  return offsetof(ncclWindow_vidmem, stride4G) + sizeof(uint32_t);
}

extern "C" mep_kstatus_t mep_ll_lsa_from_desc(const void *desc, uint64_t *base, uint64_t *stride,
                                              uint64_t *local) {
  if (desc == nullptr || base == nullptr || stride == nullptr || local == nullptr)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "resolve_lsa: desc, base, stride or local is NULL");
  ncclWindow_vidmem w;
  memset(&w, 0, sizeof w);
  memcpy(&w, desc, mep_ll_window_desc_bytes());
  /* LSA rank 0 alone may have no stride (a team of one); any other rank
   * with none would alias rank 0's window */
  if (w.lsaFlatBase == nullptr || w.lsaRank < 0 || (w.lsaRank > 0 && w.stride4G == 0))
    return mep_kernels_error(MEP_KSTATUS_CUDA,
                             "resolve_lsa: the window's descriptor is not usable (LSA base %p, "
                             "LSA rank %d, stride %u x 4 GiB)",
                             static_cast<void *>(w.lsaFlatBase), w.lsaRank, w.stride4G);
  *base = (uint64_t)(uintptr_t)w.lsaFlatBase;
  *stride = (uint64_t)w.stride4G << 32;
  /* the kernels' own rule, base + rank * stride (add4G in unsigned 64-bit) */
  *local = *base + (uint64_t)w.lsaRank * *stride;
  return MEP_KSTATUS_OK;
}

extern "C" mep_kstatus_t mep_ll_resolve_lsa(mep_ll_ctx_t *ctx) {
  if (ctx == nullptr || ctx->window == nullptr)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT, "resolve_lsa: ctx or window is NULL");
  ncclWindow_vidmem w;
  mep_kstatus_t st = mep_kernels_cuda_check(
      "resolve_lsa: cudaMemcpy",
      cudaMemcpy(&w, ctx->window, mep_ll_window_desc_bytes(), cudaMemcpyDeviceToHost));
  return st == MEP_KSTATUS_OK
             ? mep_ll_lsa_from_desc(&w, &ctx->lsa_base, &ctx->lsa_stride, &ctx->lsa_local)
             : st;
}
