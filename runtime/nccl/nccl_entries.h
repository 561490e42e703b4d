/* nccl_entries.h: the NCCL host functions moe-ep calls, as one X-macro
 * list: nccl_dl.c resolves and forwards each of them, and a test's stand-in
 * NCCL library (tests/gpu/nccl_stall_shim.c) forwards the same set.
 * Include after <nccl.h> and <nccl_device/core.h>. */
#ifndef MEP_NCCL_ENTRIES_H_
#define MEP_NCCL_ENTRIES_H_

/* X(return type, name, parameter list, argument list, value if unloaded) */
#define MEP_NCCL_ENTRIES(X)                                                         \
  X(ncclResult_t, ncclGetVersion, (int *v), (v), ncclSystemError)                   \
  X(ncclResult_t, ncclGetUniqueId, (ncclUniqueId * id), (id), ncclSystemError)      \
  X(ncclResult_t, ncclCommInitRankConfig,                                          \
    (ncclComm_t * c, int n, ncclUniqueId id, int r, ncclConfig_t *f), (c, n, id, r, f), \
    ncclSystemError)                                                                \
  X(ncclResult_t, ncclCommGetAsyncError, (ncclComm_t c, ncclResult_t *e), (c, e),  \
    ncclSystemError)                                                                \
  X(ncclResult_t, ncclCommCount, (const ncclComm_t c, int *n), (c, n), ncclSystemError) \
  X(ncclResult_t, ncclCommUserRank, (const ncclComm_t c, int *r), (c, r), ncclSystemError) \
  X(ncclResult_t, ncclCommFinalize, (ncclComm_t c), (c), ncclSystemError)          \
  X(ncclResult_t, ncclCommDestroy, (ncclComm_t c), (c), ncclSystemError)           \
  X(ncclResult_t, ncclCommAbort, (ncclComm_t c), (c), ncclSystemError)             \
  X(ncclResult_t, ncclMemAlloc, (void **p, size_t n), (p, n), ncclSystemError)      \
  X(ncclResult_t, ncclMemFree, (void *p), (p), ncclSystemError)                    \
  X(ncclResult_t, ncclCommWindowRegister,                                          \
    (ncclComm_t c, void *b, size_t n, ncclWindow_t *w, int f), (c, b, n, w, f),    \
    ncclSystemError)                                                               \
  X(ncclResult_t, ncclCommWindowDeregister, (ncclComm_t c, ncclWindow_t w), (c, w), \
    ncclSystemError)                                                               \
  X(ncclResult_t, ncclDevCommCreate,                                               \
    (ncclComm_t c, ncclDevCommRequirements_t const *q, ncclDevComm_t *d), (c, q, d), \
    ncclSystemError)                                                               \
  X(ncclResult_t, ncclDevCommDestroy, (ncclComm_t c, ncclDevComm_t const *d), (c, d), \
    ncclSystemError)                                                               \
  X(ncclResult_t, ncclAllReduce,                                                   \
    (const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t o, ncclComm_t c, \
     cudaStream_t st),                                                             \
    (s, r, n, t, o, c, st), ncclSystemError)                                       \
  X(ncclResult_t, ncclAllGather,                                                   \
    (const void *s, void *r, size_t n, ncclDataType_t t, ncclComm_t c, cudaStream_t st), \
    (s, r, n, t, c, st), ncclSystemError)                                          \
  X(ncclTeam_t, ncclTeamLsa, (ncclComm_t c), (c), (ncclTeam_t){0})                \
  X(const char *, ncclGetErrorString, (ncclResult_t r), (r), "NCCL is not loaded") \
  X(const char *, ncclGetLastError, (ncclComm_t c), (c), "NCCL is not loaded")

#endif /* MEP_NCCL_ENTRIES_H_ */
