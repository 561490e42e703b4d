/* nccl_setup.c: NCCL communicator, symmetric window and device communicator
 * for the nccl backend (see nccl_setup.h). Every failure names the NCCL or
 * CUDA call and its reason; nothing prints (each step goes to the library's
 * logger at debug level). */
#include "runtime/nccl/nccl_setup.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* core.h is C-compatible except for host/device inline helpers it only
 * defines for C++: declare them as plain (unused) prototypes here, since C
 * warns about inline functions that are never defined. */
#include <nccl_device/utility.h>
#undef NCCL_HOST_DEVICE_INLINE
#define NCCL_HOST_DEVICE_INLINE
#include <nccl_device/core.h>

#include "kernels/common/limits.h"
#include "runtime/error.h"
#include "runtime/nccl/nccl_context.h"
#include "runtime/log.h"
#include "runtime/nccl/graph_watch.h"
#include "runtime/nccl/lsa_link.h"
#include "runtime/nccl/nccl_dl.h"
#include "runtime/nccl/nccl_wait.h"
#include "runtime/nccl/pinned_pool.h"

struct mep_nccl {
  ncclComm_t comm;
  int owns_comm;
  int32_t timeout_ms;  /* each collective step's bound (params' timeout_ms) */
  /* The setup collectives' own stream; the backends' device memory is
   * allocated and freed in its order too (mep_nccl_alloc_zeroed). */
  cudaStream_t stream;
  /* The device's default memory pool, which the stream-ordered allocations
   * come from (not whichever pool the engine made current); NULL on a
   * device without memory pools, where cudaMalloc and cudaFree serve. */
  cudaMemPool_t pool;
  /* The setup collectives' device buffer. Freed only once they are known
   * to be done (drained, or their communicator aborted): a collective a
   * lost peer never joins does not end. */
  void *scratch;
  /* Pinned staging for the setup's host <-> device copies (setup_copy),
   * as large as scratch; from the process's pool (pinned_pool.h). */
  void *host_scratch;
  size_t scratch_bytes;
  int has_devcomm;
  int has_win;
  /* A setup step on an adopted communicator did not end within its bound
   * (adopted_step_stuck): it stays in flight on the engine's communicator
   * until the engine aborts that; or the group's kernels had not ended at
   * teardown (mep_nccl_abandon). What they may still touch is left
   * allocated. */
  int stuck;
  void *buf;
  ncclWindow_t win;
  uint64_t bytes;
  int32_t world;
  int32_t rank;
  int32_t lsa_size;
  int32_t *peer_transport;
  int32_t *peer_nvlink; /* 1 where the peer is in this rank's LSA team (in peer_transport's block) */
  int32_t lsa_link;     /* mep_lsa_link_t: the group's worst LSA team link */
  int32_t lsa_link_peer; /* this rank's peer over that link, -1 if another rank's */
  mep_graph_watch_t *graphs; /* the captures and graphs holding the group's calls */
  _Alignas(16) unsigned char devcomm[MEP_DEVCOMM_BYTES] /* kernels/common/limits.h */;
};

/* Setup runs only inside group_create (mep_setup_cuda_status). */
static moe_ep_status_t cuda_fail(const char *call, cudaError_t e) {
  return mep_error(mep_setup_cuda_status(e), "%s failed: %s", call, cudaGetErrorString(e));
}

/* Each setup step at debug level, before it starts: where a setup that
 * takes long is waiting. */
static void log_step(const mep_nccl_t *n, const char *step) {
  MEP_LOG_DEBUG("nccl", "rank %d: setup: %s", n->rank, step);
}

/* Setup's own device work (zeroing, host <-> device copies) runs on the
 * setup stream, nonblocking, and is waited for within the bound:
 * cudaMemset, cudaMemcpy and launches on the legacy default stream queue
 * behind the engine's work on every blocking stream, and
 * cudaDeviceSynchronize behind all of it, so a busy or stuck engine
 * kernel would hold group_create with no bound; and work on the legacy
 * stream is not ordered before an engine's nonblocking stream
 * (tools/probe/hold_probe.cu measures which calls wait). */
static moe_ep_status_t setup_wait(mep_nccl_t *n, const char *step) {
  return mep_nccl_local_wait(n->stream, step, n->timeout_ms);
}

/* bytes (at most scratch_bytes) between host memory and device memory,
 * through the pinned staging, then waited for. */
static moe_ep_status_t setup_copy(mep_nccl_t *n, void *dst, const void *src, size_t bytes,
                                  int to_device, const char *step) {
  if (bytes > n->scratch_bytes)
    return mep_error(MOE_EP_ERR_INTERNAL, "%s: %zu bytes, more than the setup staging's %zu",
                     step, bytes, n->scratch_bytes);
  cudaError_t e;
  if (to_device) {
    memcpy(n->host_scratch, src, bytes);
    e = cudaMemcpyAsync(dst, n->host_scratch, bytes, cudaMemcpyHostToDevice, n->stream);
  } else {
    e = cudaMemcpyAsync(n->host_scratch, src, bytes, cudaMemcpyDeviceToHost, n->stream);
  }
  if (e != cudaSuccess) return cuda_fail(step, e);
  MEP_CHECK(setup_wait(n, step));
  if (!to_device) memcpy(dst, n->host_scratch, bytes);
  return MOE_EP_OK;
}

static moe_ep_status_t check_version(void) {
  int v = 0;
  ncclResult_t r = ncclGetVersion(&v);
  if (r != ncclSuccess) return mep_nccl_error(NULL, "ncclGetVersion", r);
  if (v != NCCL_VERSION_CODE)
    return mep_error(MOE_EP_ERR_MISMATCH,
                     "the NCCL library loaded at run time is version %d but moe-ep was built "
                     "against NCCL headers version %d; the device communicator is shared "
                     "between them, so load the matching libnccl.so.2 (LD_LIBRARY_PATH)",
                     v, NCCL_VERSION_CODE);
  return MOE_EP_OK;
}

static moe_ep_status_t init_comm(const mep_nccl_params_t *p, ncclComm_t *comm) {
  ncclUniqueId id;
  ncclResult_t r;
  memset(&id, 0, sizeof id);
  if (p->exchange == NULL)
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "nccl: exchange callback is NULL and no communicator was given to adopt");
  if (p->rank == 0 && (r = ncclGetUniqueId(&id)) != ncclSuccess)
    return mep_nccl_error(NULL, "ncclGetUniqueId", r);
  MEP_CHECK(p->exchange(p->exchange_user, p->rank, p->world, &id, sizeof id));
  /* Nonblocking: no setup step on this communicator can wait for a peer
   * without a bound (nccl_wait.h). */
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  *comm = NULL;
  r = ncclCommInitRankConfig(comm, p->world, id, p->rank, &config);
  if (*comm == NULL) return mep_nccl_error(NULL, "ncclCommInitRankConfig", r);
  moe_ep_status_t st = mep_nccl_settle(*comm, r, "ncclCommInitRankConfig", p->timeout_ms);
  if (st != MOE_EP_OK) {
    ncclCommAbort(*comm);
    *comm = NULL;
  }
  return st;
}

/* This rank's LSA team. When NCCL's device runtime failed to start,
 * ncclTeamLsa returns an empty team (stride 0; the failure surfaces only
 * in a later call), which must not reach in_lsa_team's division. */
static moe_ep_status_t lsa_team_of(mep_nccl_t *n, ncclTeam_t *lsa) {
  *lsa = ncclTeamLsa(n->comm);
  if (lsa->nRanks >= 1 && lsa->stride >= 1 && lsa->rank >= 0 && lsa->rank < lsa->nRanks)
    return MOE_EP_OK;
  return mep_nccl_error(n->comm, "ncclTeamLsa (NCCL's device runtime did not start)",
                        ncclInternalError);
}

/* World ranks of the LSA team are an arithmetic progression through us. */
static int in_lsa_team(ncclTeam_t lsa, int self, int peer) {
  if (lsa.stride < 1) return peer == self;
  const int first = self - lsa.rank * lsa.stride;
  const int d = peer - first;
  return d >= 0 && d % lsa.stride == 0 && d / lsa.stride < lsa.nRanks;
}

/* A setup step's bounded wait on an adopted communicator timed out: the
 * step may still run (a nonblocking communicator's call in progress, or a
 * collective queued on its stream), and only the engine can end it (an
 * owned communicator is aborted), so what it may touch stays allocated. */
static moe_ep_status_t adopted_step_stuck(mep_nccl_t *n, moe_ep_status_t st) {
  if (st != MOE_EP_ERR_TIMEOUT || n->owns_comm) return st;
  n->stuck = 1;
  return mep_error_suffix(st,
                          "the step stays in flight on the engine's communicator (adopted), "
                          "which the engine must abort (ncclCommAbort) before using it again");
}

/* A setup collective just enqueued on n->stream (its call returned r):
 * settled and drained within the bound. */
static moe_ep_status_t run_collective(mep_nccl_t *n, ncclResult_t r, const char *step) {
  MEP_CHECK(adopted_step_stuck(n, mep_nccl_settle(n->comm, r, step, n->timeout_ms)));
  return adopted_step_stuck(n, mep_nccl_stream_wait(n->comm, n->stream, step, n->timeout_ms));
}

/* The LSA link check (params' lsa_link_check): every rank describes its
 * GPU, the descriptions go round (an all-gather), each rank finds its
 * worst link to its LSA team, and a min-reduction gives every rank the
 * group's worst (lsa_link.h), so all of them choose alike. Collective;
 * every rank calls it with the same params. */
static moe_ep_status_t check_lsa_links(mep_nccl_t *n, const mep_nccl_params_t *p) {
  n->lsa_link = MEP_LSA_LINK_NVLINK;
  n->lsa_link_peer = -1;
  if (!p->lsa_link_check ||
      (p->transport != MOE_EP_TRANSPORT_LSA && p->transport != MOE_EP_TRANSPORT_AUTO))
    return MOE_EP_OK;
  log_step(n, "the LSA link check");
  ncclTeam_t lsa;
  MEP_CHECK(lsa_team_of(n, &lsa));
  const size_t rec = sizeof(mep_lsa_gpu_t);
  mep_lsa_gpu_t *gpus = calloc((size_t)p->world, rec);
  if (gpus == NULL) return mep_error(MOE_EP_ERR_NO_MEMORY, "nccl_create: out of host memory");
  moe_ep_status_t st = MOE_EP_OK;
  char bus[32] = {0};
  int dev = 0;
  void *buf = n->scratch;
  cudaError_t e;
  ncclResult_t r;
  if ((e = cudaGetDevice(&dev)) != cudaSuccess ||
      (e = cudaDeviceGetPCIBusId(bus, (int)sizeof bus, dev)) != cudaSuccess) {
    st = cuda_fail("cudaDeviceGetPCIBusId (LSA link check)", e);
    goto out;
  }
  mep_lsa_gpu_describe(bus, &gpus[p->rank]);
  if ((st = setup_copy(n, (char *)buf + (size_t)p->rank * rec, &gpus[p->rank], rec, 1,
                       "cudaMemcpyAsync (LSA link check)")) != MOE_EP_OK)
    goto out;
  r = ncclAllGather((char *)buf + (size_t)p->rank * rec, buf, rec, ncclUint8, n->comm, n->stream);
  if ((st = run_collective(n, r, "ncclAllGather (LSA link check)")) != MOE_EP_OK) goto out;
  if ((st = setup_copy(n, gpus, buf, (size_t)p->world * rec, 0,
                       "cudaMemcpyAsync (LSA link check)")) != MOE_EP_OK)
    goto out;
  int32_t worst = MEP_LSA_LINK_NVLINK;
  for (int q = 0; q < p->world; ++q) {
    if (q == p->rank || !in_lsa_team(lsa, p->rank, q)) continue;
    gpus[q].host[sizeof gpus[q].host - 1] = gpus[q].bus[sizeof gpus[q].bus - 1] = '\0';
    const int32_t l = (int32_t)mep_lsa_link_between(&gpus[p->rank], &gpus[q],
                                                    (mep_lsa_link_policy_t)p->lsa_link_policy);
    if (l < worst) {
      worst = l;
      n->lsa_link_peer = q;
    }
  }
  if ((st = setup_copy(n, buf, &worst, sizeof worst, 1, "cudaMemcpyAsync (LSA link check)")) !=
      MOE_EP_OK)
    goto out;
  r = ncclAllReduce(buf, buf, 1, ncclInt32, ncclMin, n->comm, n->stream);
  if ((st = run_collective(n, r, "ncclAllReduce (LSA link check)")) != MOE_EP_OK) goto out;
  if ((st = setup_copy(n, &n->lsa_link, buf, sizeof n->lsa_link, 0,
                       "cudaMemcpyAsync (LSA link check)")) != MOE_EP_OK)
    goto out;
  if (n->lsa_link != worst) n->lsa_link_peer = -1; /* another rank's link */
out:
  free(gpus);
  return st;
}

/* need_gin: a peer needs GIN (a NIC); need_staging: the window needs the
 * staged transports' size (GIN, or gin_emulated taken by auto). */
static moe_ep_status_t choose_transports(mep_nccl_t *n, const mep_nccl_params_t *p,
                                         int *need_gin, int *need_staging) {
  ncclTeam_t lsa;
  MEP_CHECK(lsa_team_of(n, &lsa));
  n->lsa_size = lsa.nRanks;
  *need_gin = *need_staging = 0;
  const int nvlink = n->lsa_link == MEP_LSA_LINK_NVLINK;
  if (!nvlink && p->transport == MOE_EP_TRANSPORT_LSA) {
    char peer[64] = "between other ranks of the group";
    if (n->lsa_link_peer >= 0) snprintf(peer, sizeof peer, "to rank %d", n->lsa_link_peer);
    return mep_error(MOE_EP_ERR_UNSUPPORTED,
                     "nccl: transport lsa needs NVLink between the GPUs of the LSA team (the "
                     "LL combine's line partials rely on whole 128-byte stores), but rank %d's "
                     "group has a link that is %s (%s); use transport gin_emulated, or auto, "
                     "which takes it there; MOE_EP_LSA_LINK=nvlink where NVML cannot tell",
                     p->rank, n->lsa_link == MEP_LSA_LINK_PCIE ? "PCIe" : "not known to be NVLink",
                     peer);
  }
  for (int q = 0; q < p->world; ++q) {
    const int near = in_lsa_team(lsa, p->rank, q);
    n->peer_nvlink[q] = near;
    int t;
    switch (p->transport) {
      case MOE_EP_TRANSPORT_LSA:
      case MOE_EP_TRANSPORT_GIN_EMULATED:
        if (!near)
          return mep_error(MOE_EP_ERR_UNSUPPORTED,
                           "nccl: transport %s needs every peer in the LSA team, but "
                           "rank %d is outside rank %d's team of %d",
                           p->transport == MOE_EP_TRANSPORT_LSA ? "lsa" : "gin_emulated", q,
                           p->rank, lsa.nRanks);
        t = p->transport;
        break;
      case MOE_EP_TRANSPORT_GIN:
        t = MOE_EP_TRANSPORT_GIN;
        *need_gin = 1;
        break;
      default: /* auto: the team over load/store, on NVLink unless checked otherwise */
        t = !near ? MOE_EP_TRANSPORT_GIN
                  : nvlink ? MOE_EP_TRANSPORT_LSA : MOE_EP_TRANSPORT_GIN_EMULATED;
        if (!near) *need_gin = 1;
        if (t != MOE_EP_TRANSPORT_LSA) *need_staging = 1;
        break;
    }
    n->peer_transport[q] = t;
  }
  if (*need_gin) *need_staging = 1;
  return MOE_EP_OK;
}

/* A tiny all-reduce: nobody signals into a window before its owner zeroed it. */
static moe_ep_status_t barrier(mep_nccl_t *n) {
  ncclResult_t r = ncclAllReduce(n->scratch, n->scratch, 1, ncclInt32, ncclSum, n->comm, n->stream);
  return run_collective(n, r, "ncclAllReduce (barrier)");
}

static cudaError_t find_pool(mep_nccl_t *n) {
  int device = 0, pools = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess)
    e = cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device);
  if (e == cudaSuccess && pools) e = cudaDeviceGetDefaultMemPool(&n->pool, device);
  return e;
}

/* In the setup stream's order; usable on every stream once that stream
 * has reached it (the callers wait for it: setup_wait). */
static cudaError_t stream_alloc(mep_nccl_t *n, void **dev, size_t bytes) {
  if (n->pool == NULL) return cudaMalloc(dev, bytes);
  return cudaMallocFromPoolAsync(dev, bytes, n->pool, n->stream);
}

/* Releases what create made, in reverse, and n itself. abort (a failed
 * create, or a failed group, whose ranks are out of step): an owned
 * communicator is aborted, which ends its collectives and releases its
 * windows and device communicators without waiting for peers. Otherwise
 * (and always for an adopted communicator, which is the engine's) the
 * collective teardown runs, each step bounded where the communicator is
 * nonblocking; an owned communicator whose step fails is aborted. Quiet:
 * the error a caller is reporting stays the last one. */
static int teardown(mep_nccl_t *n, int abort) {
  /* stuck (see mep_nccl.stuck): the communicator, window, scratch and
   * staging stay as they are. */
  if (!n->stuck && n->comm != NULL && abort && n->owns_comm) {
    ncclCommAbort(n->comm);
  } else if (!n->stuck && n->comm != NULL) {
    /* Each step is tried whatever the one before it gave: a communicator
     * keeps an earlier step's error, and the window must not be freed
     * while still registered on a communicator that lives on (adopted). */
    int ok = 1;
    const ncclDevComm_t *dev = (const ncclDevComm_t *)(const void *)n->devcomm;
    if (n->has_devcomm)
      ok &= mep_nccl_settled(n->comm, ncclDevCommDestroy(n->comm, dev), n->timeout_ms);
    if (n->has_win)
      ok &= mep_nccl_settled(n->comm, ncclCommWindowDeregister(n->comm, n->win), n->timeout_ms);
    if (n->owns_comm) {
      if (ok) ok = mep_nccl_settled(n->comm, ncclCommFinalize(n->comm), n->timeout_ms);
      if (ok)
        ncclCommDestroy(n->comm);
      else
        ncclCommAbort(n->comm);
    } else if (!ok) {
      /* The engine's communicator may still hold the window's
       * registration (or a device communicator over it): freeing it would
       * leave that pointing at freed memory. */
      n->stuck = 1;
    }
  }
  /* The setup collectives have ended: drained, or aborted with their
   * communicator. The setup's own work (zeroing, copies) may still be
   * queued where a create gave up waiting for it: until it drains, what
   * it writes stays, as when stuck. */
  if (!n->stuck && n->stream != NULL && !mep_nccl_stream_drained(n->stream, n->timeout_ms))
    n->stuck = 1;
  if (!n->stuck) {
    mep_nccl_free(n, n->scratch); /* in stream order: cudaFree would wait for the device */
    if (n->stream != NULL) cudaStreamDestroy(n->stream);
    mep_pinned_give(n->host_scratch);
    if (n->buf != NULL) ncclMemFree(n->buf);
  }
  const int released = !n->stuck;
  mep_graph_watch_drop(n->graphs);
  free(n->peer_transport);
  free(n);
  return released;
}

moe_ep_status_t mep_nccl_create(const mep_nccl_params_t *p, mep_nccl_t **out) {
  moe_ep_status_t st;
  ncclResult_t r;
  cudaError_t e;
  int need_gin = 0, need_staging = 0;
  if (p == NULL || out == NULL)
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT, "nccl_create: params and out must not be NULL");
  if (p->world <= 0 || p->rank < 0 || p->rank >= p->world)
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "nccl_create: rank %d / world %d; need 0 <= rank < world", p->rank,
                     p->world);
  if (p->window_bytes == 0)
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT, "nccl_create: window_bytes is 0");
  if (p->timeout_ms <= 0)
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "nccl_create: timeout_ms is %d; every setup wait needs a bound > 0",
                     (int)p->timeout_ms);
  MEP_CHECK(mep_nccl_dl_load());
  MEP_CHECK(check_version());
  if (p->cuda_device >= 0) MEP_CHECK(mep_nccl_make_current(p->cuda_device));

  mep_nccl_t *n = calloc(1, sizeof *n);
  if (n == NULL) return mep_error(MOE_EP_ERR_NO_MEMORY, "nccl_create: out of host memory");
  n->world = p->world;
  n->rank = p->rank;
  n->timeout_ms = p->timeout_ms;
  /* One allocation: peer_nvlink is its second half (freed with it). */
  n->peer_transport = calloc(2u * (size_t)p->world, sizeof(int32_t));
  n->graphs = mep_graph_watch_create();
  if (n->peer_transport == NULL || n->graphs == NULL) {
    st = mep_error(MOE_EP_ERR_NO_MEMORY, "nccl_create: out of host memory");
    goto fail;
  }
  n->peer_nvlink = n->peer_transport + p->world;
  /* the link check's all-gather and the barrier's word; the staging also
   * carries the backends' read-backs (MEP_NCCL_SCRATCH_MIN) */
  n->scratch_bytes = (size_t)p->world * sizeof(mep_lsa_gpu_t) + 16;
  if (n->scratch_bytes < MEP_NCCL_SCRATCH_MIN) n->scratch_bytes = MEP_NCCL_SCRATCH_MIN;
  if ((e = cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking)) != cudaSuccess ||
      (e = find_pool(n)) != cudaSuccess ||
      (e = stream_alloc(n, &n->scratch, n->scratch_bytes)) != cudaSuccess) {
    n->scratch = NULL;
    st = cuda_fail("cudaStreamCreate/cudaMallocFromPoolAsync (setup)", e);
    goto fail;
  }
  MEP_CHECK_GOTO(mep_pinned_take(n->scratch_bytes, &n->host_scratch, NULL,
                                 "nccl_create: the setup's staging"),
                 st, fail);
  if (p->adopt_comm != NULL) {
    int count = 0, rank = 0;
    n->comm = (ncclComm_t)p->adopt_comm;
    if ((r = ncclCommCount(n->comm, &count)) != ncclSuccess ||
        (r = ncclCommUserRank(n->comm, &rank)) != ncclSuccess) {
      st = mep_nccl_error(n->comm, "ncclCommCount/ncclCommUserRank (adopted comm)", r);
      goto fail;
    }
    if (count != p->world || rank != p->rank) {
      st = mep_error(MOE_EP_ERR_MISMATCH,
                     "nccl_create: the adopted communicator has rank %d of %d, but the group "
                     "is rank %d of %d", rank, count, p->rank, p->world);
      goto fail;
    }
  } else {
    log_step(n, "ncclCommInitRankConfig");
    MEP_CHECK_GOTO(init_comm(p, &n->comm), st, fail);
    n->owns_comm = 1;
  }
  MEP_CHECK_GOTO(check_lsa_links(n, p), st, fail);
  MEP_CHECK_GOTO(choose_transports(n, p, &need_gin, &need_staging), st, fail);

  /* LSA teams partition the world and the link check is group-wide, so
   * every rank of a group draws the same need_staging and allocates the
   * same size (a symmetric window). */
  n->bytes = need_staging && p->window_bytes_gin != 0 ? p->window_bytes_gin : p->window_bytes;
  log_step(n, "ncclMemAlloc (window)");
  if ((r = ncclMemAlloc(&n->buf, n->bytes)) != ncclSuccess) {
    n->buf = NULL;
    st = mep_nccl_error(n->comm, "ncclMemAlloc", r);
    goto fail;
  }
  MEP_CHECK_GOTO(mep_nccl_zero(n, n->buf, n->bytes, "cudaMemsetAsync (window)"), st, fail);
  log_step(n, "ncclCommWindowRegister");
  r = ncclCommWindowRegister(n->comm, n->buf, n->bytes, &n->win, NCCL_WIN_COLL_SYMMETRIC);
  MEP_CHECK_GOTO(adopted_step_stuck(
                     n, mep_nccl_settle(n->comm, r, "ncclCommWindowRegister(NCCL_WIN_COLL_SYMMETRIC)",
                                        n->timeout_ms)),
                 st, fail);
  n->has_win = 1;

  {
    ncclDevCommRequirements_t req;
    memset(&req, 0, sizeof req); /* no initializer macro in 2.28.9 */
    req.lsaBarrierCount = 1;
    if (need_gin) {
      req.ginContextCount = 1;
      req.ginSignalCount = p->gin_signal_count;
      req.ginForceEnable = p->transport == MOE_EP_TRANSPORT_GIN;
    }
    log_step(n, "ncclDevCommCreate");
    r = ncclDevCommCreate(n->comm, &req, (ncclDevComm_t *)(void *)n->devcomm);
    MEP_CHECK_GOTO(adopted_step_stuck(n, mep_nccl_settle(n->comm, r,
                                                         need_gin ? "ncclDevCommCreate (with GIN)"
                                                                  : "ncclDevCommCreate",
                                                         n->timeout_ms)),
                   st, fail);
    n->has_devcomm = 1;
  }
  log_step(n, "the closing barrier");
  MEP_CHECK_GOTO(barrier(n), st, fail);
  log_step(n, "done");
  *out = n;
  return MOE_EP_OK;

fail:
  /* The ranks are out of step now (this one stops here, the others may
   * not): no collective teardown for a communicator of our own. */
  teardown(n, 1);
  /* NCCL's sentences name no rank; the engine's log needs it. */
  mep_error_prefix("NCCL setup on rank %d", p->rank);
  return st;
}

moe_ep_status_t mep_nccl_zero(mep_nccl_t *n, void *dev, size_t bytes, const char *what) {
  log_step(n, what);
  cudaError_t e = cudaMemsetAsync(dev, 0, bytes, n->stream);
  if (e != cudaSuccess) return cuda_fail(what, e);
  return setup_wait(n, what);
}

moe_ep_status_t mep_nccl_read_back(mep_nccl_t *n, void *host, const void *dev, size_t bytes,
                                   const char *what) {
  log_step(n, what);
  return setup_copy(n, host, dev, bytes, 0, what);
}

int mep_nccl_destroy(mep_nccl_t *n, int abort) {
  if (n == NULL) return 1;
  return teardown(n, abort);
}

void mep_nccl_abandon(mep_nccl_t *n) {
  if (n == NULL) return;
  n->stuck = 1;
  (void)teardown(n, 0);
}

moe_ep_status_t mep_nccl_alloc_zeroed(mep_nccl_t *n, void **dev, uint64_t bytes,
                                      const char *what) {
  cudaError_t e = stream_alloc(n, dev, bytes);
  if (e != cudaSuccess) {
    *dev = NULL;
    return cuda_fail(what, e);
  }
  return mep_nccl_zero(n, *dev, bytes, what);
}

void mep_nccl_free(mep_nccl_t *n, void *dev) {
  if (dev == NULL) return;
  if (n->pool != NULL)
    cudaFreeAsync(dev, n->stream);
  else
    cudaFree(dev);
}

void *mep_nccl_comm(const mep_nccl_t *n) { return n->comm; }
const void *mep_nccl_dev_comm(const mep_nccl_t *n) { return n->devcomm; }
void *mep_nccl_window(const mep_nccl_t *n) { return n->win; }
void *mep_nccl_window_local(const mep_nccl_t *n) { return n->buf; }
uint64_t mep_nccl_bytes_allocated(const mep_nccl_t *n) { return n->bytes; }
mep_graph_watch_t *mep_nccl_graphs(const mep_nccl_t *n) { return n->graphs; }
int32_t mep_nccl_lsa_size(const mep_nccl_t *n) { return n->lsa_size; }
int32_t mep_nccl_lsa_link(const mep_nccl_t *n) { return n->lsa_link; }

void mep_nccl_peer_transports(const mep_nccl_t *n, int32_t *out, int32_t len) {
  for (int32_t i = 0; i < len && i < n->world; ++i) out[i] = n->peer_transport[i];
}

void mep_nccl_peer_nvlink(const mep_nccl_t *n, int32_t *out, int32_t len) {
  for (int32_t i = 0; i < len && i < n->world; ++i) out[i] = n->peer_nvlink[i];
}
