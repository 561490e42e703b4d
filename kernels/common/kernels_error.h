/* kernels_error.h: the launchers' thread-local error sentence (kernels/ does
 * not depend on runtime/; the runtime copies this text into its own). */
#ifndef MEP_KERNELS_ERROR_H_
#define MEP_KERNELS_ERROR_H_

#include "kernels/common/kernels_types.h"

#ifdef __cplusplus
extern "C" {
#endif

mep_kstatus_t mep_kernels_error(mep_kstatus_t st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* MEP_KSTATUS_OK for cudaSuccess, else MEP_KSTATUS_CUDA with the CUDA
 * error's text. */
mep_kstatus_t mep_kernels_cuda_check(const char *what, int cuda_error);
const char *mep_kernels_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* MEP_KERNELS_ERROR_H_ */
