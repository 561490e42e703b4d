/* ll_host.cu: host-side helpers of the LL path: buffer/state sizing, timeout
 * conversion, the abort reset and LSA address resolution (one tiny
 * kernel). */
#include <cuda_runtime.h>
#include <nccl.h>
#include <nccl_device.h>
#include <string.h>

#include "kernels/common/kernels_error.h"
#include "kernels/common/limits.h"
#include "kernels/ll/ll.h"

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

namespace {

/* The window's LSA address of rank 0, the distance between consecutive
 * LSA ranks and this rank's own. The kernels compute every peer's address
 * as base + rank * stride, so every LSA rank's address is checked against
 * that (out[3]: the first LSA rank where it fails, or -1). */
__global__ void resolve_lsa_kernel(const ncclDevComm comm, ncclWindow_t win, uint64_t *out) {
  const ncclTeam lsa = ncclTeamLsa(comm);
  const char *r0 = static_cast<const char *>(ncclGetLsaPointer(win, 0, 0));
  const uint64_t stride =
      lsa.nRanks > 1
          ? (uint64_t)(static_cast<const char *>(ncclGetLsaPointer(win, 0, 1)) - r0)
          : 0;
  out[0] = (uint64_t)(uintptr_t)r0;
  out[1] = stride;
  out[2] = (uint64_t)(uintptr_t)ncclGetLsaPointer(win, 0, lsa.rank);
  out[3] = (uint64_t)(int64_t)-1;
  for (int i = 2; i < lsa.nRanks; ++i) {
    if (static_cast<const char *>(ncclGetLsaPointer(win, 0, i)) != r0 + (uint64_t)i * stride) {
      out[3] = (uint64_t)i;
      break;
    }
  }
}

}  // namespace

extern "C" mep_kstatus_t mep_ll_resolve_lsa(mep_ll_ctx_t *ctx) {
  if (ctx == nullptr || ctx->dev_comm == nullptr || ctx->window == nullptr)
    return mep_kernels_error(MEP_KSTATUS_INVALID_ARGUMENT,
                             "resolve_lsa: ctx, dev_comm or window is NULL");
  uint64_t *d = nullptr, h[4] = {0, 0, 0, 0};
  ncclDevComm comm;
  memcpy(&comm, ctx->dev_comm, sizeof comm);
  mep_kstatus_t st = mep_kernels_cuda_check("resolve_lsa: cudaMalloc", cudaMalloc(&d, sizeof h));
  if (st != MEP_KSTATUS_OK) return st;
  resolve_lsa_kernel<<<1, 1>>>(comm, (ncclWindow_t)ctx->window, d);
  st = mep_kernels_cuda_check("resolve_lsa: launch", cudaGetLastError());
  if (st == MEP_KSTATUS_OK)
    st = mep_kernels_cuda_check("resolve_lsa: cudaMemcpy",
                                cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
  cudaFree(d);
  if (st != MEP_KSTATUS_OK) return st;
  if (h[3] != (uint64_t)(int64_t)-1)
    return mep_kernels_error(MEP_KSTATUS_CUDA,
                             "resolve_lsa: the window's LSA addresses are not evenly spaced "
                             "(LSA rank %llu is not at rank 0's address + %llu * %llu bytes); "
                             "the kernels address peers by that rule",
                             (unsigned long long)h[3], (unsigned long long)h[3],
                             (unsigned long long)h[1]);
  ctx->lsa_base = h[0];
  ctx->lsa_stride = h[1];
  ctx->lsa_local = h[2];
  return MEP_KSTATUS_OK;
}
