/* lsa_link.h: whether the peers of an NCCL LSA team reach each other over
 * NVLink. NCCL's LSA team is every peer that load/store can reach, which
 * includes GPUs joined only by PCIe peer-to-peer; the LL combine's line
 * partials rely on NVLink delivering a warp's aligned 128-byte store
 * whole (kernels/ll/PROTOCOL.md, section 5), which PCIe does not promise.
 * Each rank describes its GPU (host and PCI bus id), the ranks swap the
 * descriptions, and each asks NVML (opened at run time; the library never
 * links it) whether its GPU and each same-host peer's GPU share NVLink. A
 * peer on another host inside the LSA team is a multi-node NVLink peer.
 * Plain C, no CUDA or NCCL: the caller does the exchange. */
#ifndef MEP_LSA_LINK_H_
#define MEP_LSA_LINK_H_

#include <stdint.h>

#include "moe_ep.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One rank's GPU, as swapped between the ranks. */
typedef struct mep_lsa_gpu {
  char host[48]; /* boot id of the machine (hostname where unreadable) */
  char bus[32];  /* PCI bus id, "0000:3B:00.0" (cudaDeviceGetPCIBusId) */
} mep_lsa_gpu_t;

/* What is known of a link, worst first: a team is worth its worst link
 * (the smallest value), so ranks agree by a min-reduction. */
typedef enum mep_lsa_link {
  MEP_LSA_LINK_PCIE = 0,
  MEP_LSA_LINK_UNKNOWN = 1, /* NVML missing or could not tell */
  MEP_LSA_LINK_NVLINK = 2,
} mep_lsa_link_t;

/* How the check runs: MOE_EP_LSA_LINK (unset or "detect": ask NVML;
 * "nvlink": trust that every LSA peer is on NVLink, for machines without
 * NVML; "pcie": treat every peer as PCIe). */
typedef enum mep_lsa_link_policy {
  MEP_LSA_LINK_DETECT = 0,
  MEP_LSA_LINK_ASSUME_NVLINK = 1,
  MEP_LSA_LINK_ASSUME_PCIE = 2,
} mep_lsa_link_policy_t;

/* Parses MOE_EP_LSA_LINK's value (NULL or "" means detect); an unknown
 * value is INVALID_ARGUMENT naming the variable, the value and the choices. */
moe_ep_status_t mep_lsa_link_policy_parse(const char *value, mep_lsa_link_policy_t *out);
/* The same for the value MOE_EP_LSA_LINK holds now. */
moe_ep_status_t mep_lsa_link_policy_env(mep_lsa_link_policy_t *out);

/* Whether MOE_EP_LSA_LINK is "pcie": then no LSA team is on NVLink, which
 * buffer_size_hint can know before any group forms. */
int mep_lsa_link_env_is_pcie(void);

/* *out = this machine's boot id and the PCI bus id `bus` (as CUDA gives it). */
void mep_lsa_gpu_describe(const char *bus, mep_lsa_gpu_t *out);

/* The link between this rank's GPU and a peer's, under the policy (NVML
 * is asked only for peers on the same host, under DETECT). */
mep_lsa_link_t mep_lsa_link_between(const mep_lsa_gpu_t *self, const mep_lsa_gpu_t *peer,
                                    mep_lsa_link_policy_t policy);

/* A link's name in messages: "PCIe", "unknown", "NVLink". */
const char *mep_lsa_link_name(mep_lsa_link_t link);

#ifdef __cplusplus
}
#endif

#endif /* MEP_LSA_LINK_H_ */
