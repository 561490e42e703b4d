/* pinned_pool.h: page-locked, device-mapped host memory the nccl backend
 * keeps for the life of the process. cudaFreeHost (and
 * cudaHostUnregister) wait for all work on the device, the engine's
 * included (tools/probe/hold_probe.cu), so a group's teardown gives its
 * blocks back here instead of freeing them, and a later group_create takes
 * them again. Blocks are reused at their exact size only, so for each size
 * the pool holds as many blocks as were taken at one time (a group takes
 * three small ones). A block whose memory is no longer pinned (a
 * cudaDeviceReset freed it with its context) is dropped, not handed out. */
#ifndef MEP_NCCL_PINNED_POOL_H_
#define MEP_NCCL_PINNED_POOL_H_

#include <stddef.h>

#include "moe_ep.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The status of a CUDA call that failed inside group_create (setup's
 * allocations; `e` a cudaError_t): running out of memory is NO_MEMORY (a
 * smaller config may fit), and CUDA's last error, which is not sticky
 * then, is cleared so the engine's next check after a kernel of its own
 * does not find it; anything else is CUDA. */
moe_ep_status_t mep_setup_cuda_status(int e);

/* At least `bytes` of zeroed pinned memory, mapped for every device
 * (portable), in *host; its device alias in *dev (NULL dev: not wanted).
 * `what` names the use in a failure sentence. */
moe_ep_status_t mep_pinned_take(size_t bytes, void **host, void **dev, const char *what);
/* Back to the pool; no device work may still touch it. Accepts NULL. */
void mep_pinned_give(void *host);

#ifdef __cplusplus
}
#endif

#endif /* MEP_NCCL_PINNED_POOL_H_ */
