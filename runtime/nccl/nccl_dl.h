/* nccl_dl.h: libmoe_ep.so does not link libnccl: the host backend must load
 * on machines without NCCL (engines' CI, laptops). The NCCL host functions
 * the nccl backend calls are defined, hidden, in nccl_dl.c and forward to a
 * libnccl.so.2 opened on first use (MOE_EP_NCCL_LIBRARY overrides the path). */
#ifndef MEP_NCCL_DL_H_
#define MEP_NCCL_DL_H_

#include "moe_ep.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Opens libnccl.so.2 and resolves every entry once; OK, or MOE_EP_ERR_NCCL
 * with a sentence saying what is missing and how to point at NCCL. */
moe_ep_status_t mep_nccl_dl_load(void);

#ifdef __cplusplus
}
#endif

#endif /* MEP_NCCL_DL_H_ */
