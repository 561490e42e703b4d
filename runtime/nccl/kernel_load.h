/* kernel_load.h: loads a backend's kernels while its group is created.
 * CUDA loads a kernel at its first launch by default, and that load waits
 * for every kernel running on the device. The LL launchers pick their
 * kernel by the call's token count and grid (kernels/ll/ll.h), so a
 * kernel's first launch can come in the middle of a run, where it would
 * wait behind the engine's work, or behind this group's receive of the
 * other micro-batch, which spins until a peer sends. Loading them all at
 * group creation moves that wait to where a group on a communicator of its
 * own waits for the whole device anyway (NCCL's initialisation). */
#ifndef MEP_RUNTIME_NCCL_KERNEL_LOAD_H_
#define MEP_RUNTIME_NCCL_KERNEL_LOAD_H_

#include <stdint.h>

#include "kernels/common/kernels_error.h"
#include "moe_ep.h"
#include "runtime/group.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef mep_kstatus_t (*mep_kernel_load_fn)(void);

/* group_create's step on the nccl backend: on a communicator the group
 * made, loads `mode_load`'s kernels and prepare's layout kernels on
 * `device`, on a thread of its own, waiting for them at most
 * bootstrap.timeout_ms. OK once they are loaded; MOE_EP_ERR_CUDA with the
 * loader's sentence when one failed; MOE_EP_ERR_TIMEOUT when they had not
 * loaded by then (some work on the GPU did not end): the loads go on in
 * the background, on memory the thread owns, and the library stays mapped
 * for the life of the process (an engine's dlclose cannot unmap the
 * thread's code). On the engine's communicator
 * (nccl_comm set) it loads nothing and returns OK: group_create must not
 * wait for the engine's GPU work there, so each kernel loads at its first
 * launch (moe_ep.h, group_create). `what` names the mode ("LL", "HT"). */
moe_ep_status_t mep_nccl_group_load_kernels(const moe_ep_group_t *g, int device,
                                            mep_kernel_load_fn mode_load, const char *what);

#ifdef __cplusplus
}
#endif

#endif /* MEP_RUNTIME_NCCL_KERNEL_LOAD_H_ */
