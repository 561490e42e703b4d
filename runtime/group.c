/* group.c: group lifecycle: rank/world resolution, UCX bootstrap, the
 * cross-rank config check, backend selection, info and SM bounds. */
#include "runtime/group.h"

#include <cuda_runtime_api.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/config.h"
#include "runtime/error.h"
#include "runtime/log.h"
#include "runtime/ucx_quiet.h"
#include "runtime/registry.h"
#include "runtime/validate.h"

#define CANON_BYTES 1024

static moe_ep_status_t env_int(const char *name, int32_t *out) {
  const char *v = getenv(name);
  if (v == NULL || *v == '\0') {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "group_create: params rank/world_size are negative "
                     "(meaning: take them from the environment) but %s is not "
                     "set; start ranks with tools/launcher/moe_ep_run or pass "
                     "them explicitly",
                     name);
  }
  char *end = NULL;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (errno != 0 || end == v || *end != '\0' || x < 0 || x > MEP_MAX_RANKS) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "group_create: %s='%s' is not an integer in [0, %d]",
                     name, v, MEP_MAX_RANKS);
  }
  *out = (int32_t)x;
  return MOE_EP_OK;
}

moe_ep_status_t mep_backend_select(int requested, int mode, const mep_backend_ops_t **ops,
                                   int *resolved) {
  int devices = 0;
  switch (requested) {
    case MOE_EP_BACKEND_AUTO:
      if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
      *resolved = devices > 0 ? MOE_EP_BACKEND_NCCL : MOE_EP_BACKEND_HOST;
      break;
    case MOE_EP_BACKEND_HOST:
    case MOE_EP_BACKEND_NCCL:
      *resolved = requested;
      break;
    default:
      return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                       "config backend=%d is not a moe_ep_backend_t value", requested);
  }
  if (*resolved == MOE_EP_BACKEND_HOST) {
    *ops = &mep_host_backend;
  } else {
    *ops = mode == MOE_EP_MODE_LOW_LATENCY ? &mep_nccl_backend : &mep_nccl_ht_backend;
  }
  return MOE_EP_OK;
}

/* Every rank compares every rank's canonical config, so all of them fail
 * with the same sentence but for the rank that says it (a differing
 * max_tokens_per_rank must not hang). */
static moe_ep_status_t check_configs_agree(moe_ep_group_t *g) {
  char mine[CANON_BYTES];
  memset(mine, 0, sizeof(mine));
  if (mep_config_canonical(&g->cfg, mine, sizeof(mine)) >= sizeof(mine) - 1) {
    return mep_error(MOE_EP_ERR_INTERNAL,
                     "group_create: the canonical config text outgrew %d bytes; it "
                     "could hide a difference between ranks",
                     CANON_BYTES);
  }
  char *all = calloc((size_t)g->world_size, CANON_BYTES);
  if (all == NULL) {
    /* The peers hear it in the exchange's place rather than wait for it. */
    (void)mep_bootstrap_fail_step(g->boot, MOE_EP_ERR_NO_MEMORY);
    return mep_error(MOE_EP_ERR_NO_MEMORY,
                     "group_create on rank %d: cannot allocate %d config texts",
                     g->rank, g->world_size);
  }
  moe_ep_status_t st = mep_bootstrap_allgather(g->boot, mine, all, CANON_BYTES);
  if (st != MOE_EP_OK) {
    mep_error_prefix("group_create: exchanging config hashes");
    free(all);
    return st;
  }
  /* A rank sends its text with the NUL within its block, but the diff
   * below reads up to a NUL: a block without one (another build's) must
   * not lead it into the next rank's block or past the end. */
  for (int r = 0; r < g->world_size; r++) all[(size_t)r * CANON_BYTES + CANON_BYTES - 1] = '\0';
  for (int r = 0; r < g->world_size; r++) {
    const char *theirs = all + (size_t)r * CANON_BYTES;
    if (strncmp(all, theirs, CANON_BYTES) != 0) {
      char diff[256];
      mep_config_describe_diff(all, theirs, diff, sizeof(diff));
      st = mep_error(MOE_EP_ERR_MISMATCH,
                     "group_create on rank %d: ranks disagree on the config: rank 0 "
                     "vs rank %d: %s (every rank must use the same moe_ep "
                     "section)",
                     g->rank, r, diff);
      break;
    }
  }
  free(all);
  return st;
}

/* ranks_per_node against the world, on every backend (the host backend
 * refuses what the nccl backend would): nodes are whole, and HT over lsa /
 * auto, which have no network leg, is one node. LL otherwise ignores the
 * key. `who` starts the sentence ("group_create on rank 3"). */
static moe_ep_status_t check_ranks_per_node(const moe_ep_config_t *cfg,
                                            int32_t world_size,
                                            const char *who) {
  int32_t n = cfg->ranks_per_node;
  if (n == 0) return MOE_EP_OK;
  if (world_size % n != 0) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "%s: ranks_per_node=%d does not divide world_size=%d; "
                     "ranks_per_node is the number of consecutive ranks on "
                     "one node, so the group must be whole nodes (0 = unset)",
                     who, n, world_size);
  }
  int one_node = cfg->transport == MOE_EP_TRANSPORT_LSA ||
                 cfg->transport == MOE_EP_TRANSPORT_AUTO;
  if (cfg->mode == MOE_EP_MODE_HIGH_THROUGHPUT && one_node && n != world_size) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "%s: ranks_per_node=%d with transport '%s' in mode "
                     "'high_throughput' must be 0 or world_size=%d; over "
                     "transport lsa or auto, HT has no network leg, so the "
                     "group is one node (transport gin or gin_emulated "
                     "splits it into nodes)",
                     who, n, mep_transport_name(cfg->transport), world_size);
  }
  return MOE_EP_OK;
}

/* What group_create and buffer_size_hint both refuse for a world size:
 * out of range, experts not dealt evenly, too many experts per rank,
 * ranks_per_node breaking its rules. `who` starts the sentence. */
static moe_ep_status_t check_world(const moe_ep_config_t *cfg, int32_t world_size,
                                   const char *who) {
  if (world_size < 1 || world_size > MEP_MAX_RANKS) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT, "%s: world_size=%d must be in [1, %d]", who,
                     world_size, MEP_MAX_RANKS);
  }
  if (cfg->num_experts % world_size != 0) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "%s: num_experts=%d is not divisible by world_size=%d; every rank must "
                     "hold the same number of experts",
                     who, cfg->num_experts, world_size);
  }
  if (cfg->num_experts / world_size > MEP_MAX_LOCAL_EXPERTS) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "%s: num_experts/world_size=%d local experts exceeds the limit %d", who,
                     cfg->num_experts / world_size, MEP_MAX_LOCAL_EXPERTS);
  }
  return check_ranks_per_node(cfg, world_size, who);
}

/* The backend's own limit on the world size (nccl HT: one warp group per
 * peer in each block). */
static moe_ep_status_t check_backend_world(const mep_backend_ops_t *ops, const moe_ep_config_t *cfg,
                                           int32_t world_size, const char *who) {
  if (ops->max_ranks == 0 || world_size <= ops->max_ranks) return MOE_EP_OK;
  return mep_error(MOE_EP_ERR_UNSUPPORTED,
                   "%s: world_size=%d; mode '%s' on the %s backend takes at most %d ranks", who,
                   world_size, mep_mode_name(cfg->mode), ops->name, ops->max_ranks);
}

static moe_ep_status_t validate_params(const moe_ep_group_params_t *p,
                                       moe_ep_group_t *g) {
  if (!MEP_HAS_FIELD(p, world_size)) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "group_create: params->struct_size=%zu is smaller than "
                     "the v1 minimum %zu; initialise with "
                     "MOE_EP_INIT(moe_ep_group_params_t)",
                     p->struct_size, offsetof(moe_ep_group_params_t, cuda_device));
  }
  /* The rank first: every later failure names it (mep_group_create). */
  g->rank = p->rank;
  g->world_size = p->world_size;
  if (g->rank < 0) MEP_CHECK(env_int("MOE_EP_RANK", &g->rank));
  if (g->world_size < 0) MEP_CHECK(env_int("MOE_EP_WORLD_SIZE", &g->world_size));
  if (p->config == NULL) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "group_create: params->config is NULL; build one with "
                     "config_from_yaml");
  }
  MEP_CHECK(mep_config_import(p->config, &g->cfg));
  char who[48];
  snprintf(who, sizeof(who), "group_create on rank %d", g->rank);
  MEP_CHECK(check_world(&g->cfg, g->world_size, who));
  if (g->rank >= g->world_size) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT, "%s: rank=%d must be in [0, world_size=%d)",
                     who, g->rank, g->world_size);
  }
  g->num_local_experts = g->cfg.num_experts / g->world_size;
  g->cuda_device = MEP_HAS_FIELD(p, cuda_device) ? p->cuda_device : -1;
  g->nccl_comm = MEP_HAS_FIELD(p, nccl_comm) ? p->nccl_comm : NULL;
  return MOE_EP_OK;
}

/* Setup's cleanup of a backend it made: the failed step's sentence stays
 * this thread's last error, not the teardown's. */
static void destroy_failed_backend(moe_ep_group_t *g) {
  mep_error_saved_t failed;
  mep_error_save(&failed);
  (void)g->ops->destroy(g);
  mep_error_restore(&failed);
}

/* After the backend's setup every rank says whether its own succeeded
 * (mep_bootstrap_agree, bounded like every bootstrap wait), and a rank
 * keeps its group only if every rank formed one. A setup's last
 * collective step can complete on one rank after another rank gave up on
 * it (an NCCL barrier the timed-out rank had already joined), and that
 * rank must not go on with a group its peers do not have. A rank that
 * gave up before one of the setup's own bootstrap steps is named to the
 * others as failed there. `mine` is this rank's setup status; its
 * sentence is what a failed rank reports. */
static moe_ep_status_t agree_formed(moe_ep_group_t *g, moe_ep_status_t mine) {
  char kept[MEP_ERROR_MAX] = "";
  if (mine != MOE_EP_OK) snprintf(kept, sizeof kept, "%s", mep_last_error());
  int32_t all[MEP_MAX_RANKS]; /* on the stack: no failure can skip the agreement */
  moe_ep_status_t st = mep_bootstrap_agree(g->boot, (int32_t)mine, all);
  if (mine != MOE_EP_OK) {
    st = mep_error(mine, "%s", kept); /* this rank's own failure is its report */
  } else if (st != MOE_EP_OK) {
    mep_error_prefix("group_create on rank %d: agreeing that every rank formed the group",
                     g->rank);
  } else {
    for (int r = 0; r < g->world_size; r++) {
      if (all[r] == MOE_EP_OK) continue;
      st = mep_error(MOE_EP_ERR_PEER_FAILED,
                     "group_create on rank %d: rank %d's setup failed (%s; its own error "
                     "says why), so no rank keeps the group",
                     g->rank, r, mep_status_string((moe_ep_status_t)all[r]));
      break;
    }
  }
  return st;
}

static moe_ep_status_t group_create(const moe_ep_group_params_t *params,
                                    moe_ep_group_t **out) {
  moe_ep_status_t st;
  /* Setup logs at the group's level once its config is read; every exit
   * gives the thread its own level back. */
  const int level_prev = mep_log_thread_level_now();
  if (params == NULL || out == NULL) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "group_create: %s is NULL", params ? "out" : "params");
  }
  moe_ep_group_t *g = calloc(1, sizeof(*g));
  if (g == NULL) {
    return mep_error(MOE_EP_ERR_NO_MEMORY, "group_create: out of host memory");
  }
  g->rank = -1; /* named by every failure once known (validate_params) */
  MEP_CHECK_GOTO(validate_params(params, g), st, out_free_group);
  const int requested = g->cfg.backend;
  MEP_CHECK_GOTO(mep_backend_select(g->cfg.backend, g->cfg.mode, &g->ops, &g->cfg.backend), st,
                 out_free_group);
  char who[48];
  snprintf(who, sizeof(who), "group_create on rank %d", g->rank);
  MEP_CHECK_GOTO(check_backend_world(g->ops, &g->cfg, g->world_size, who), st, out_free_group);
  /* Only the nccl backend adopts a communicator: a host group would drop
   * the engine's one without a word. */
  if (g->nccl_comm != NULL && g->cfg.backend == MOE_EP_BACKEND_HOST) {
    st = mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                   "group_create on rank %d: params->nccl_comm=%p is set, but the group's "
                   "backend is host (%s); only the nccl backend adopts a communicator",
                   g->rank, g->nccl_comm,
                   requested == MOE_EP_BACKEND_AUTO ? "backend auto found no CUDA device"
                                                    : "config backend host");
    goto out_free_group;
  }
  /* Bootstrap and backend setup log at this group's level. */
  mep_log_thread_level(g->cfg.log_level);

  const char *token = getenv(g->cfg.bootstrap_token_env);
  if (g->world_size > 1 && (token == NULL || token[0] == '\0')) {
    st = mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                   "group_create on rank %d: the environment variable %s "
                   "(bootstrap.token_env) is %s; a group of %d ranks admits "
                   "only processes that prove they hold the job token, so set "
                   "it to one secret shared by every rank (moe_ep_run sets "
                   "MOE_EP_JOB_TOKEN; moe_ep.deep_ep.Buffer agrees one over "
                   "its torch.distributed group)",
                   g->rank, g->cfg.bootstrap_token_env,
                   token == NULL ? "unset" : "empty", g->world_size);
    goto out_free_group;
  }
  if (g->world_size > 1 && strlen(token) < MEP_BS_TOKEN_MIN) {
    st = mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                   "group_create on rank %d: the job token in %s (bootstrap.token_env) is %zu "
                   "characters; a group of %d ranks needs at least %d, since every key derives "
                   "from it and a short one can be guessed offline from one knock seen on the "
                   "network (moe_ep_run and moe_ep.deep_ep.Buffer make 32 random hex digits)",
                   g->rank, g->cfg.bootstrap_token_env, strlen(token), g->world_size,
                   MEP_BS_TOKEN_MIN);
    goto out_free_group;
  }
  mep_bootstrap_params_t bp = {
      .rank = g->rank,
      .world_size = g->world_size,
      .address = g->cfg.bootstrap_address,
      .timeout_ms = g->cfg.bootstrap_timeout_ms,
      .token = token ? token : "",
  };
  MEP_LOG_DEBUG("group", "rank %d: setup: the bootstrap", g->rank);
  MEP_CHECK_GOTO(mep_bootstrap_create(&bp, &g->boot), st, out_free_group);
  MEP_CHECK_GOTO(check_configs_agree(g), st, out_destroy_bootstrap);
  g->config_hash = mep_config_hash(&g->cfg);

  if (pthread_mutex_init(&g->lock, NULL) != 0) {
    /* Still this rank's part of the closing agreement: the peers form
     * their backends meanwhile and then learn that this rank failed. */
    st = agree_formed(g, mep_error(MOE_EP_ERR_INTERNAL,
                                   "group_create on rank %d: pthread_mutex_init failed", g->rank));
    goto out_destroy_bootstrap;
  }
  MEP_LOG_DEBUG("group", "rank %d: setup: the %s backend", g->rank, g->ops->name);
  moe_ep_status_t made = g->ops->create(g);
  /* Registered before the closing agreement, so that failing to register
   * is this rank's part of it: registered after, a failure here would
   * leave the peers with a group this rank gave up. */
  if (made == MOE_EP_OK && !mep_registry_add(g, MEP_OBJ_GROUP, NULL, -1)) {
    made = mep_error(MOE_EP_ERR_NO_MEMORY,
                     "group_create on rank %d: out of host memory registering the group",
                     g->rank);
    g->broken = made; /* no collective teardown step: the peers are in the agreement */
    destroy_failed_backend(g);
  }
  MEP_LOG_DEBUG("group", "rank %d: setup: the closing agreement", g->rank);
  st = agree_formed(g, made);
  if (st != MOE_EP_OK) {
    /* A backend whose own setup failed has released itself; one that
     * formed while a peer did not tears down as a failed group (no
     * collective steps: the peers are not in them). */
    if (made != MOE_EP_OK) goto out_destroy_lock;
    (void)mep_registry_take(g, MEP_OBJ_GROUP);
    g->broken = st;
    goto out_destroy_backend;
  }
  if (g->bytes_allocated == 0) {
    g->bytes_allocated = g->ops->buffer_bytes(&g->cfg, g->world_size);
  }
  MEP_LOG_INFO("group", "rank %d/%d formed: backend %s, %d local experts, %llu "
               "buffer bytes",
               g->rank, g->world_size, g->ops->name, g->num_local_experts,
               (unsigned long long)g->bytes_allocated);
  mep_log_thread_level(level_prev);
  *out = g;
  return MOE_EP_OK;

out_destroy_backend:
  destroy_failed_backend(g);
out_destroy_lock:
  pthread_mutex_destroy(&g->lock);
out_destroy_bootstrap:
  mep_bootstrap_destroy(g->boot);
out_free_group:
  if (g->rank >= 0) mep_error_name_rank(g->rank);
  mep_log_thread_level(level_prev);
  free(g);
  return st;
}

/* The group an entry on this thread works in: its lock held, or its
 * group_destroy running. Entries never nest, so an entry that finds its own
 * group here was called from inside another one: from the engine's
 * logger, which runs inside the entry that logs. The lock is not
 * recursive: taking it again would wait for ever. */
static __thread moe_ep_group_t *held_here;

static moe_ep_status_t called_inside(const moe_ep_group_t *g, const char *entry) {
  return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                   "%s on rank %d: called from inside another entry on the same group on this "
                   "thread, which holds the group's lock (the engine's logger runs inside the "
                   "library's entries and must not call them)",
                   entry, g->rank);
}

/* A free queued on g (mep_group_free): pushed by any thread, without g's
 * lock; the queue is only ever taken whole, by the lock's holder. */
static void push_free(moe_ep_group_t *g, mep_deferred_free_t *link) {
  mep_deferred_free_t *head = __atomic_load_n(&g->frees_pending, __ATOMIC_RELAXED);
  do {
    link->next = head;
  } while (!__atomic_compare_exchange_n(&g->frees_pending, &head, link, 1, __ATOMIC_RELEASE,
                                        __ATOMIC_RELAXED));
}

/* Under g's lock (live: each `then` runs) or in g's destroy (only
 * gathered): takes g's queued frees into frees_taken, for release once the
 * lock is let go. What they report is theirs: the entry's last_error
 * stays. */
static void take_frees(moe_ep_group_t *g, int live) {
  if (__atomic_load_n(&g->frees_pending, __ATOMIC_RELAXED) == NULL) return;
  mep_error_saved_t saved;
  mep_error_save(&saved);
  mep_deferred_free_t *todo;
  /* A `then` may queue more. */
  while ((todo = __atomic_exchange_n(&g->frees_pending, NULL, __ATOMIC_ACQUIRE)) != NULL) {
    while (todo != NULL) {
      mep_deferred_free_t *d = todo;
      todo = d->next;
      if (live && d->then != NULL) d->then(g, d->obj);
      d->next = g->frees_taken;
      g->frees_taken = d;
    }
  }
  mep_error_restore(&saved);
}

static void enter_locked(moe_ep_group_t *g);

static void release_frees(mep_deferred_free_t *d) {
  while (d != NULL) {
    mep_deferred_free_t *next = d->next; /* release frees the link with its object */
    d->release(d->obj);
    d = next;
  }
}

moe_ep_status_t mep_group_create(const moe_ep_group_params_t *params,
                                 moe_ep_group_t **out) {
  mep_ucx_quiet_enter(); /* the bootstrap's and host mesh's UCX calls */
  const moe_ep_status_t st = group_create(params, out);
  mep_ucx_quiet_leave();
  return st;
}

static moe_ep_status_t group_destroy(moe_ep_group_t *group);

moe_ep_status_t mep_group_destroy(moe_ep_group_t *group) {
  mep_ucx_quiet_enter();
  const moe_ep_status_t st = group_destroy(group);
  mep_ucx_quiet_leave();
  return st;
}

static moe_ep_status_t group_destroy(moe_ep_group_t *group) {
  if (group == NULL) return MOE_EP_OK;
  if (!mep_registry_contains(group, MEP_OBJ_GROUP)) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "group_destroy: group=%p is not a live group (already "
                     "destroyed, or not from group_create)",
                     (void *)group);
  }
  if (held_here == group) return called_inside(group, "group_destroy");
  /* Its barrier's and teardown's lines log at the group's level, and an
   * entry the logger calls on it meanwhile is refused (called_inside). */
  moe_ep_group_t *held_prev = held_here;
  const int level_prev = mep_log_thread_level_now();
  held_here = group;
  mep_log_thread_level(group->cfg.log_level);
  /* Collective: wait (bounded) until every rank is done with the data path
   * before closing endpoints, so a fast rank does not look like a dead
   * peer to a slow one. A failed group skips it: peers may be gone. */
  if (group->broken == MOE_EP_OK && mep_bootstrap_barrier(group->boot) != MOE_EP_OK) {
    MEP_LOG_WARN("group", "rank %d: group_destroy's barrier failed (%s); tearing down anyway",
                 group->rank, mep_last_error());
    /* A peer is gone or stuck: the backend must not run collective
     * teardown steps that would wait for it. */
    group->broken = MOE_EP_ERR_PEER_FAILED;
  }
  (void)mep_registry_take(group, MEP_OBJ_GROUP);
  /* Its handles and hooks stay the engine's to free; from now on they
   * belong to no group, so a call that passes one reports the destroyed
   * group, also to a new group at this address. */
  mep_registry_orphan(group);
  /* Pending hooks stay owned by the engine; detach them so a late
   * hook_run reports the destroyed group instead of touching it. */
  pthread_mutex_lock(&group->lock);
  for (int i = 0; i < MEP_NUM_BUFFER_SETS; i++) {
    if (group->pending[i] != NULL) group->pending[i]->group = NULL;
  }
  pthread_mutex_unlock(&group->lock);
  /* The group is gone either way; an error says what the backend had to
   * leave allocated. */
  moe_ep_status_t st = group->ops->destroy(group);
  mep_bootstrap_destroy(group->boot);
  /* Frees the logger asked for meanwhile: of a destroyed group's objects. */
  take_frees(group, 0);
  release_frees(group->frees_taken);
  held_here = held_prev;
  pthread_mutex_destroy(&group->lock);
  free(group);
  mep_log_thread_level(level_prev);
  return st;
}

moe_ep_status_t mep_group_check(const moe_ep_group_t *g, const char *entry) {
  if (g == NULL || !mep_registry_contains(g, MEP_OBJ_GROUP)) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "%s: group=%p is not a live group", entry, (const void *)g);
  }
  return MOE_EP_OK;
}

/* Entry guard: a live, unbroken group. */
moe_ep_status_t mep_group_broken_error(const moe_ep_group_t *g, const char *entry) {
  if (g->broken == MOE_EP_OK) return MOE_EP_OK;
  return mep_error(g->broken, "%s: the group failed earlier: %s", entry, g->broken_msg);
}

moe_ep_status_t mep_group_lock(moe_ep_group_t *g, const char *entry) {
  MEP_CHECK(mep_group_check(g, entry));
  if (held_here == g) return called_inside(g, entry);
  pthread_mutex_lock(&g->lock);
  enter_locked(g);
  return MOE_EP_OK;
}

/* g's lock just taken by this thread: it works in g now, after the frees
 * queued meanwhile (a hook freed from another group's logger no longer
 * holds its buffer set against this entry). */
static void enter_locked(moe_ep_group_t *g) {
  mep_ucx_quiet_enter();
  g->held_prev = held_here;
  g->level_prev = mep_log_thread_level_now();
  held_here = g;
  mep_log_thread_level(g->cfg.log_level);
  take_frees(g, 1);
}

void mep_group_unlock(moe_ep_group_t *g) {
  take_frees(g, 1);
  mep_deferred_free_t *taken = g->frees_taken;
  g->frees_taken = NULL;
  held_here = g->held_prev;
  mep_log_thread_level(g->level_prev);
  pthread_mutex_unlock(&g->lock);
  release_frees(taken);
  mep_ucx_quiet_leave();
}

void mep_group_free(void *obj, mep_obj_kind_t kind, mep_deferred_free_t *link,
                    const char *entry, void (*then)(moe_ep_group_t *g, void *obj),
                    void (*release)(void *obj)) {
  void *owner = NULL;
  if (obj == NULL || !mep_registry_owner(obj, kind, &owner, NULL)) return;
  moe_ep_group_t *g = owner; /* NULL: the group was destroyed */
  /* Inside an entry on this thread (the engine's logger, or a garbage
   * collector running in it), a free never waits for a lock: its own
   * group's would be this thread's (not recursive), and another group's
   * may be held by a thread waiting for this one's. So too inside the
   * logger where this thread holds no group's lock (group_create's lines,
   * the library's own threads): the thread holding the other group's lock
   * may be waiting, in its own logger, for a lock this logger holds.
   * Unless that lock is free now, the object is taken here and queued on
   * its group, whose next lock holder (maybe the entry holding it now)
   * finishes it; this thread does not touch that group again. */
  if (g != NULL && (held_here != NULL || mep_log_in_callback())) {
    const int live = mep_registry_contains(g, MEP_OBJ_GROUP);
    if (!live && g != held_here) {
      /* Its group_destroy is under way: nothing may be queued on it. */
      if (mep_registry_take(obj, kind)) release(obj);
      return;
    }
    if (g != held_here && pthread_mutex_trylock(&g->lock) == 0) {
      enter_locked(g);
    } else {
      if (!mep_registry_take(obj, kind)) return; /* another thread freed it */
      *link = (mep_deferred_free_t){obj, then, release, NULL};
      push_free(g, link);
      return;
    }
  } else if (!mep_registry_contains(g, MEP_OBJ_GROUP) || mep_group_lock(g, entry) != MOE_EP_OK) {
    if (mep_registry_take(obj, kind)) release(obj); /* its group is gone */
    return;
  }
  const int taken = mep_registry_take(obj, kind);
  if (taken && then != NULL) then(g, obj);
  mep_group_unlock(g);
  if (taken) release(obj);
}

moe_ep_status_t mep_owner_group(const void *obj, mep_obj_kind_t kind, const char *entry,
                                moe_ep_group_t **group) {
  /* The owner comes from the registry, not from the object: another thread
   * may be freeing it, and only its group's lock orders the two. */
  void *owner = NULL;
  int rank = -1;
  const char *what = kind == MEP_OBJ_HOOK ? "hook" : "handle";
  if (obj == NULL || !mep_registry_owner(obj, kind, &owner, &rank)) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT, "%s: %s=%p is not a live %s (freed, or not from %s)",
                     entry, what, obj, what,
                     kind == MEP_OBJ_HOOK ? "dispatch/combine" : "prepare");
  }
  if (!mep_registry_contains(owner, MEP_OBJ_GROUP)) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "%s: %s=%p belongs to rank %d's group, which was destroyed", entry, what,
                     obj, rank);
  }
  *group = owner;
  return MOE_EP_OK;
}

moe_ep_status_t mep_handle_check(moe_ep_group_t *g, moe_ep_handle_t *h,
                                    const char *entry) {
  void *owner = NULL;
  if (h == NULL || !mep_registry_owner(h, MEP_OBJ_HANDLE, &owner, NULL)) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "%s: handle=%p is not a live handle (freed, or not from "
                     "prepare)",
                     entry, (void *)h);
  }
  /* The registry's owner, not h->group: that pointer outlives its group,
   * and a later group may sit at the same address. */
  if (owner == NULL) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "%s: handle=%p was prepared on a group that has been destroyed; "
                     "free it and prepare on this group",
                     entry, (void *)h);
  }
  if (owner != g) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "%s: handle=%p was prepared on another group", entry,
                     (void *)h);
  }
  return MOE_EP_OK;
}

int mep_group_device(const moe_ep_group_t *g) {
  return g->cfg.backend == MOE_EP_BACKEND_HOST ? MEP_DEVICE(MOE_EP_DEVICE_CPU, -1)
                                               : MEP_DEVICE(MOE_EP_DEVICE_CUDA, g->cuda_device);
}

int mep_status_is_fatal(moe_ep_status_t st) {
  /* MISMATCH from an operation: the ranks are out of step (host backend). */
  return st == MOE_EP_ERR_PEER_FAILED || st == MOE_EP_ERR_TIMEOUT || st == MOE_EP_ERR_MISMATCH ||
         st == MOE_EP_ERR_UCX || st == MOE_EP_ERR_CUDA ||
         st == MOE_EP_ERR_NCCL || st == MOE_EP_ERR_INTERNAL;
}

/* What the kernels use: set_num_sms, or the backend's default (every SM
 * unless it names fewer); the host backend uses none. */
static int32_t sms_used(const moe_ep_group_t *g) {
  if (g->cfg.backend == MOE_EP_BACKEND_HOST) return 0;
  if (g->num_sms > 0) return g->num_sms;
  return g->default_sms > 0 ? g->default_sms : g->max_sms;
}

static moe_ep_status_t group_info_locked(const moe_ep_group_t *g, moe_ep_group_info_t *info) {
  if (info == NULL || !MEP_HAS_FIELD(info, config_hash)) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "group_info: info is NULL or info->struct_size is below "
                     "the v1 minimum; use MOE_EP_INIT(moe_ep_group_info_t)");
  }
  /* Refused before anything is written: a failed call leaves info as it was. */
  if (MEP_HAS_FIELD(info, peer_transports_len) && info->peer_transports != NULL &&
      info->peer_transports_len < g->world_size) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "group_info: peer_transports_len=%d is smaller than "
                     "world_size=%d",
                     info->peer_transports_len, g->world_size);
  }
  info->rank = g->rank;
  info->world_size = g->world_size;
  info->num_local_experts = g->num_local_experts;
  info->backend = g->cfg.backend;
  info->mode = g->cfg.mode;
  info->num_sms = sms_used(g);
  info->bytes_allocated = g->bytes_allocated;
  info->config_hash = g->config_hash;
  if (MEP_HAS_FIELD(info, peer_transports_len) && info->peer_transports != NULL) {
    for (int p = 0; p < g->world_size; p++) {
      info->peer_transports[p] = g->ops->peer_transport(g, p);
    }
  }
  return MOE_EP_OK;
}

moe_ep_status_t mep_group_info(const moe_ep_group_t *cg, moe_ep_group_info_t *info) {
  moe_ep_group_t *g = (moe_ep_group_t *)cg;
  MEP_LOCKED_ENTRY(g, "group_info", group_info_locked(g, info));
}

moe_ep_status_t mep_group_break(moe_ep_group_t *g, moe_ep_status_t st) {
  if (g->broken == MOE_EP_OK) {
    g->broken = st;
    strncpy(g->broken_msg, mep_last_error(), sizeof(g->broken_msg) - 1);
    MEP_LOG_ERROR("group", "rank %d: %s", g->rank, g->broken_msg);
  }
  return st;
}

moe_ep_status_t mep_group_poll_error(moe_ep_group_t *g) {
  MEP_CHECK(mep_group_lock(g, "group_poll_error"));
  moe_ep_status_t st = g->broken;
  if (st == MOE_EP_OK) {
    st = g->ops->poll_error(g);
    /* A routing notice (INVALID_ARGUMENT) is reported, not fatal. */
    if (mep_status_is_fatal(st)) mep_group_break(g, st);
  } else {
    mep_error(st, "%s", g->broken_msg);
  }
  if (st != MOE_EP_OK) mep_error_name_rank(g->rank);
  mep_group_unlock(g);
  return st;
}

static moe_ep_status_t set_num_sms_locked(moe_ep_group_t *g, int32_t num_sms) {
  if (num_sms < 0 && g->max_sms == 0) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "set_num_sms: num_sms=%d must be >= 0 (the %s backend uses no SMs and "
                     "records any count; 0 = the backend's default)",
                     num_sms, g->ops->name);
  }
  if (num_sms < 0 || (g->max_sms > 0 && num_sms > g->max_sms)) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "set_num_sms: num_sms=%d must be in [0, %d] (0 = the "
                     "backend's default)",
                     num_sms, g->max_sms);
  }
  if (num_sms == 1 && g->max_sms > 0 && g->cfg.mode == MOE_EP_MODE_HIGH_THROUGHPUT) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "set_num_sms: num_sms=1 is below the 2 SMs a high_throughput group uses at "
                     "least (each channel is a sender and a receiver block); pass 0 (the "
                     "backend's default) or 2..%d",
                     g->max_sms);
  }
  g->num_sms = num_sms;
  return MOE_EP_OK;
}

moe_ep_status_t mep_group_set_num_sms(moe_ep_group_t *g, int32_t num_sms) {
  MEP_LOCKED_ENTRY(g, "set_num_sms", set_num_sms_locked(g, num_sms));
}

static moe_ep_status_t max_sms_used_locked(const moe_ep_group_t *g, int32_t *num_sms) {
  if (num_sms == NULL) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT, "max_sms_used: num_sms is NULL");
  }
  *num_sms = sms_used(g);
  return MOE_EP_OK;
}

/* const in the table (it changes nothing the engine sees), but it takes the
 * group's lock like every entry. */
moe_ep_status_t mep_group_max_sms_used(const moe_ep_group_t *cg, int32_t *num_sms) {
  moe_ep_group_t *g = (moe_ep_group_t *)cg;
  MEP_LOCKED_ENTRY(g, "max_sms_used", max_sms_used_locked(g, num_sms));
}

moe_ep_status_t mep_buffer_size_hint(const moe_ep_config_t *config,
                                     int32_t world_size, uint64_t *bytes) {
  moe_ep_config_t cfg;
  if (config == NULL || bytes == NULL) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "buffer_size_hint: %s is NULL", config ? "bytes" : "config");
  }
  MEP_CHECK(mep_config_import(config, &cfg));
  MEP_CHECK(check_world(&cfg, world_size, "buffer_size_hint"));
  const mep_backend_ops_t *ops;
  int resolved;
  MEP_CHECK(mep_backend_select(cfg.backend, cfg.mode, &ops, &resolved));
  MEP_CHECK(check_backend_world(ops, &cfg, world_size, "buffer_size_hint"));
  *bytes = ops->buffer_bytes(&cfg, world_size);
  return MOE_EP_OK;
}
