/* kernels_error.cu: the launchers' thread-local error sentence
 * (kernels_error.h). */
#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdio.h>

#include "kernels/common/kernels_error.h"

static thread_local char g_kernels_error[512] = "";

extern "C" mep_kstatus_t mep_kernels_error(mep_kstatus_t st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_kernels_error, sizeof g_kernels_error, fmt, ap);
  va_end(ap);
  return st;
}

extern "C" mep_kstatus_t mep_kernels_cuda_check(const char *what, int err) {
  if (err == cudaSuccess) return MEP_KSTATUS_OK;
  return mep_kernels_error(MEP_KSTATUS_CUDA, "%s: CUDA error %d (%s)", what, err,
                           cudaGetErrorString((cudaError_t)err));
}

extern "C" const char *mep_kernels_last_error(void) { return g_kernels_error; }
