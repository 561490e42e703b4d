/* moe_ep_demo.c: a small C example engine. It dlopens libmoe_ep.so through
 * moe_ep_loader.h, reads an engine YAML with a moe_ep: section, and runs a
 * decode loop: two micro-batches per step, each routed (random router
 * scores -> top-k -> softmax weights), dispatched, run through per-expert
 * layers, and combined, interleaved through hooks; optionally verified
 * against the oracle. Prints a latency/throughput table per rank. */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "integration/demo_device.h"
#include "integration/demo_verify.h"
#include "moe_ep.h"
#include "moe_ep_loader.h"

#define MAX_STEPS 100000

typedef struct micro_batch {
  int tokens;
  /* .host is what the engine's CPU code reads; .dev what the plugin sees */
  demo_buf_t b_x, b_topk, b_w, b_recv_x, b_recv_scales, b_recv_count, b_y, b_out;
  uint16_t *x;
  int64_t *topk;
  float *w;
  uint8_t *recv_x;
  float *recv_scales;
  int32_t *recv_count;
  uint16_t *y, *out;
  moe_ep_tensor_t t_topk, t_x, t_rx, t_rs, t_rc, t_y, t_w, t_out;
  int64_t s_topk[2], s_x[2], s_rx[3], s_rs[3], s_rc[1], s_y[3], s_w[2], s_out[2];
  moe_ep_handle_t *handle;
  double t_dispatch, t_combine;
} micro_batch_t;

typedef struct demo {
  const moe_ep_plugin_v1_t *ep;
  moe_ep_group_t *group;
  moe_ep_group_info_t info;
  moe_ep_config_t *cfg;
  int fp8, verify, steps;
  int gpu; /* nccl backend: tensors live on the GPU */
  uint64_t rng;
  double *disp_us, *comb_us;
  long n_lat, verified, failed;
  double bytes;
} demo_t;

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static double rnd(demo_t *d) { /* xorshift64*, uniform in [0, 1) */
  d->rng ^= d->rng >> 12;
  d->rng ^= d->rng << 25;
  d->rng ^= d->rng >> 27;
  return (double)((d->rng * 2685821657736338717ull) >> 11) / 9007199254740992.0;
}

static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static int tensor_device = MOE_EP_DEVICE_CPU;
static int tensor_device_id = 0; /* the group's GPU (nccl backend) */

static void tensor(moe_ep_tensor_t *t, int64_t *shape, void *data, int code, int bits,
                   int ndim, int64_t a, int64_t b, int64_t c) {
  shape[0] = a;
  if (ndim > 1) shape[1] = b;
  if (ndim > 2) shape[2] = c;
  *t = (moe_ep_tensor_t){.data = data, .device = {tensor_device, tensor_device_id}, .ndim = ndim,
                         .dtype = {(uint8_t)code, (uint8_t)bits, 1}, .shape = shape};
}

static int mb_alloc(demo_t *d, micro_batch_t *mb) {
  const moe_ep_config_t *c = d->cfg;
  size_t el = (size_t)d->info.num_local_experts;
  size_t slots = (size_t)d->info.world_size * (size_t)c->max_tokens_per_rank;
  size_t H = (size_t)c->hidden, T = (size_t)c->max_tokens_per_rank, K = (size_t)c->top_k;
  int gpu = d->gpu;
  if (!demo_buf_alloc(&mb->b_x, T * H * 2, gpu) || !demo_buf_alloc(&mb->b_topk, T * K * 8, gpu) ||
      !demo_buf_alloc(&mb->b_w, T * K * 4, gpu) ||
      !demo_buf_alloc(&mb->b_recv_x, el * slots * H * 2, gpu) ||
      !demo_buf_alloc(&mb->b_recv_scales, el * slots * (H / 128) * 4 + 4, gpu) ||
      !demo_buf_alloc(&mb->b_recv_count, el * 4, gpu) ||
      !demo_buf_alloc(&mb->b_y, el * slots * H * 2, gpu) ||
      !demo_buf_alloc(&mb->b_out, T * H * 2, gpu)) {
    return 0;
  }
  mb->x = mb->b_x.host;
  mb->topk = mb->b_topk.host;
  mb->w = mb->b_w.host;
  mb->recv_x = mb->b_recv_x.host;
  mb->recv_scales = mb->b_recv_scales.host;
  mb->recv_count = mb->b_recv_count.host;
  mb->y = mb->b_y.host;
  mb->out = mb->b_out.host;
  return 1;
}

/* Router: random scores per expert, top-k by score, softmax over the k. */
static void route(demo_t *d, micro_batch_t *mb) {
  const moe_ep_config_t *c = d->cfg;
  int E = c->num_experts, K = c->top_k, H = c->hidden;
  mb->tokens = c->max_tokens_per_rank;
  double *score = malloc(sizeof(double) * (size_t)E);
  for (int t = 0; t < mb->tokens; t++) {
    for (int h = 0; h < H; h++) mb->x[(size_t)t * H + h] = to_bf16((float)(rnd(d) * 4.0 - 2.0));
    for (int e = 0; e < E; e++) score[e] = rnd(d) * 4.0;
    double sum = 0;
    for (int k = 0; k < K; k++) {
      int best = 0;
      for (int e = 1; e < E; e++) best = score[e] > score[best] ? e : best;
      mb->topk[(size_t)t * K + k] = best;
      mb->w[(size_t)t * K + k] = (float)exp(score[best]);
      sum += exp(score[best]);
      score[best] = -1.0;
    }
    for (int k = 0; k < K; k++) mb->w[(size_t)t * K + k] = (float)(mb->w[(size_t)t * K + k] / sum);
  }
  free(score);
  int64_t el = d->info.num_local_experts, slots = (int64_t)d->info.world_size * c->max_tokens_per_rank;
  tensor(&mb->t_topk, mb->s_topk, mb->b_topk.dev, MOE_EP_DTYPE_INT, 64, 2, mb->tokens, K, 0);
  tensor(&mb->t_x, mb->s_x, mb->b_x.dev, MOE_EP_DTYPE_BFLOAT, 16, 2, mb->tokens, H, 0);
  tensor(&mb->t_rx, mb->s_rx, mb->b_recv_x.dev, d->fp8 ? MOE_EP_DTYPE_FLOAT8_E4M3FN : MOE_EP_DTYPE_BFLOAT,
         d->fp8 ? 8 : 16, 3, el, slots, H);
  tensor(&mb->t_rs, mb->s_rs, mb->b_recv_scales.dev, MOE_EP_DTYPE_FLOAT, 32, 3, el, slots, H / 128);
  tensor(&mb->t_rc, mb->s_rc, mb->b_recv_count.dev, MOE_EP_DTYPE_INT, 32, 1, el, 0, 0);
  tensor(&mb->t_y, mb->s_y, mb->b_y.dev, MOE_EP_DTYPE_BFLOAT, 16, 3, el, slots, H);
  tensor(&mb->t_w, mb->s_w, mb->b_w.dev, MOE_EP_DTYPE_FLOAT, 32, 2, mb->tokens, K, 0);
  tensor(&mb->t_out, mb->s_out, mb->b_out.dev, MOE_EP_DTYPE_BFLOAT, 16, 2, mb->tokens, H, 0);
  if (!demo_upload(&mb->b_x) || !demo_upload(&mb->b_topk) || !demo_upload(&mb->b_w)) {
    fprintf(stderr, "rank %d: upload failed: %s\n", d->info.rank, demo_device_error());
    exit(1);
  }
}

/* Bytes this rank's tokens move off-rank: one row per remote destination
 * rank on dispatch, one bf16 row per remote (token, k) on combine. */
static double bytes_moved(demo_t *d, const micro_batch_t *mb) {
  int K = d->cfg->top_k, H = d->cfg->hidden, el = d->info.num_local_experts;
  double row = d->fp8 ? H + H / 128 * 4 : H * 2, total = 0;
  for (int t = 0; t < mb->tokens; t++) {
    for (int r = 0; r < d->info.world_size; r++) {
      int hit = 0;
      for (int k = 0; k < K; k++) {
        int dst = (int)(mb->topk[(size_t)t * K + k] / el);
        if (dst == r && r != d->info.rank) total += H * 2, hit = 1;
      }
      if (hit) total += row;
    }
  }
  return total;
}

#define CHECK(call)                                                            \
  do {                                                                         \
    moe_ep_status_t st_ = (call);                                              \
    if (st_ != MOE_EP_OK) {                                                    \
      fprintf(stderr, "rank %d: %s failed: %s: %s\n", d->info.rank, #call,    \
              d->ep->status_string(st_), d->ep->last_error());                 \
      return 1;                                                                \
    }                                                                          \
  } while (0)

static int dispatch_send(demo_t *d, micro_batch_t *mb, moe_ep_hook_t **hook) {
  moe_ep_prepare_params_t pp = MOE_EP_INIT(moe_ep_prepare_params_t);
  pp.topk_idx = &mb->t_topk;
  pp.num_tokens = mb->tokens;
  pp.top_k = d->cfg->top_k;
  CHECK(d->ep->prepare(d->group, &pp, &mb->handle));
  moe_ep_dispatch_params_t dp = MOE_EP_INIT(moe_ep_dispatch_params_t);
  dp.flags = MOE_EP_FLAG_DEFER_RECV;
  dp.hidden = d->cfg->hidden;
  dp.x = &mb->t_x;
  dp.recv_x = &mb->t_rx;
  dp.recv_scales = d->fp8 ? &mb->t_rs : NULL;
  dp.recv_count = &mb->t_rc;
  double t0 = now_us();
  CHECK(d->ep->dispatch(d->group, mb->handle, &dp, hook));
  mb->t_dispatch = now_us() - t0;
  return 0;
}

/* Receive, run the experts, send the combine. */
static int experts_and_combine(demo_t *d, micro_batch_t *mb, moe_ep_hook_t *hook,
                               moe_ep_hook_t **combine_hook) {
  int H = d->cfg->hidden, el = d->info.num_local_experts;
  int64_t slots = (int64_t)d->info.world_size * d->cfg->max_tokens_per_rank;
  double t0 = now_us();
  CHECK(d->ep->hook_run(hook, NULL));
  if (!demo_download(&mb->b_recv_count) || !demo_download(&mb->b_recv_x) ||
      !demo_download(&mb->b_recv_scales)) {
    fprintf(stderr, "rank %d: download failed: %s\n", d->info.rank, demo_device_error());
    return 1;
  }
  mb->t_dispatch += now_us() - t0;
  d->ep->hook_free(hook);
  float *row = malloc(sizeof(float) * (size_t)H);
  for (int e = 0; e < el; e++) {
    for (int i = 0; i < mb->recv_count[e]; i++) {
      size_t flat = (size_t)e * (size_t)slots + (size_t)i;
      demo_received_row(mb->recv_x + flat * (size_t)H * (d->fp8 ? 1 : 2),
                        mb->recv_scales + flat * (size_t)(H / 128), H, d->fp8, row);
      demo_expert_row(d->info.rank * el + e, row, H, mb->y + flat * (size_t)H);
    }
  }
  free(row);
  if (!demo_upload(&mb->b_y)) {
    fprintf(stderr, "rank %d: upload failed: %s\n", d->info.rank, demo_device_error());
    return 1;
  }
  moe_ep_combine_params_t cp = MOE_EP_INIT(moe_ep_combine_params_t);
  cp.flags = MOE_EP_FLAG_DEFER_RECV;
  cp.hidden = H;
  cp.y = &mb->t_y;
  cp.topk_weights = &mb->t_w;
  cp.out = &mb->t_out;
  t0 = now_us();
  CHECK(d->ep->combine(d->group, mb->handle, &cp, combine_hook));
  mb->t_combine = now_us() - t0;
  return 0;
}

static int finish(demo_t *d, micro_batch_t *mb, moe_ep_hook_t *hook) {
  double t0 = now_us();
  CHECK(d->ep->hook_run(hook, NULL));
  if (!demo_download(&mb->b_out)) {
    fprintf(stderr, "rank %d: download failed: %s\n", d->info.rank, demo_device_error());
    return 1;
  }
  mb->t_combine += now_us() - t0;
  d->ep->hook_free(hook);
  d->disp_us[d->n_lat] = mb->t_dispatch;
  d->comb_us[d->n_lat++] = mb->t_combine;
  d->bytes += bytes_moved(d, mb);
  if (d->verify) {
    char why[512];
    if (demo_verify_combine(d->info.rank, d->cfg->hidden, d->cfg->top_k,
                            d->info.num_local_experts, d->fp8, mb->tokens, mb->x,
                            mb->topk, mb->w, mb->out, why, sizeof why)) {
      d->verified++;
    } else {
      d->failed++;
      fprintf(stderr, "rank %d: step verification failed: %s\n", d->info.rank, why);
    }
  }
  d->ep->handle_free(mb->handle);
  mb->handle = NULL;
  return 0;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double pct(double *v, long n, double p) {
  qsort(v, (size_t)n, sizeof(double), cmp_double);
  long i = (long)(p * (double)(n - 1) + 0.5);
  return n ? v[i] : 0.0;
}

int main(int argc, char **argv) {
  const char *config = "integration/configs/demo.yaml", *plugin = "libmoe_ep.so";
  demo_t dd = {.steps = 50, .rng = 88172645463325252ull}, *d = &dd;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--config") && i + 1 < argc) config = argv[++i];
    else if (!strcmp(argv[i], "--plugin") && i + 1 < argc) plugin = argv[++i];
    else if (!strcmp(argv[i], "--steps") && i + 1 < argc) {
      char *end = NULL;
      const long n = strtol(argv[++i], &end, 10);
      if (end == argv[i] || *end != '\0' || n < 1 || n > MAX_STEPS) {
        fprintf(stderr, "--steps is '%s'; it must be an integer in 1..%d\n", argv[i], MAX_STEPS);
        return 2;
      }
      d->steps = (int)n;
    }
    else if (!strcmp(argv[i], "--verify")) d->verify = 1;
    else {
      fprintf(stderr, "usage: %s [--config FILE] [--plugin PATH] [--steps N] [--verify]\n", argv[0]);
      return 2;
    }
  }
  char err[512];
  void *lib = moe_ep_load(plugin, &d->ep, err, sizeof err);
  if (lib == NULL) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  d->info.rank = -1;
  CHECK(d->ep->config_from_yaml(config, &d->cfg));
  d->fp8 = d->cfg->dispatch_dtype == MOE_EP_DISPATCH_FP8_E4M3;
  moe_ep_group_params_t gp = MOE_EP_INIT(moe_ep_group_params_t);
  gp.config = d->cfg;
  gp.rank = -1;
  gp.world_size = -1;
  gp.cuda_device = -1;
  if (d->cfg->backend != MOE_EP_BACKEND_HOST) { /* one GPU per local rank */
    const char *lr = getenv("MOE_EP_LOCAL_RANK");
    int dev = lr ? atoi(lr) : 0;
    if (demo_set_device(dev)) gp.cuda_device = dev;
    tensor_device_id = dev;
  }
  CHECK(d->ep->group_create(&gp, &d->group));
  d->info = MOE_EP_INIT(moe_ep_group_info_t);
  CHECK(d->ep->group_info(d->group, &d->info));
  d->gpu = d->info.backend == MOE_EP_BACKEND_NCCL;
  tensor_device = d->gpu ? MOE_EP_DEVICE_CUDA : MOE_EP_DEVICE_CPU;
  d->rng += (uint64_t)d->info.rank * 0x9E3779B97F4A7C15ull;
  micro_batch_t mb[2];
  memset(mb, 0, sizeof(mb));
  d->disp_us = calloc(2 * (size_t)d->steps, sizeof(double));
  d->comb_us = calloc(2 * (size_t)d->steps, sizeof(double));
  if (!mb_alloc(d, &mb[0]) || !mb_alloc(d, &mb[1]) || !d->disp_us || !d->comb_us) {
    fprintf(stderr, "rank %d: out of memory\n", d->info.rank);
    return 1;
  }
  double start = now_us(), last_progress = start;
  for (int s = 0; s < d->steps; s++) {
    moe_ep_hook_t *ha, *hb, *ca, *cb;
    route(d, &mb[0]);
    route(d, &mb[1]);
    /* B's dispatch is in flight while A's experts run, and vice versa. */
    if (dispatch_send(d, &mb[0], &ha) || dispatch_send(d, &mb[1], &hb) ||
        experts_and_combine(d, &mb[0], ha, &ca) || experts_and_combine(d, &mb[1], hb, &cb) ||
        finish(d, &mb[0], ca) || finish(d, &mb[1], cb)) {
      return 1;
    }
    if (d->info.rank == 0 && now_us() - last_progress > 2e6) {
      fprintf(stderr, "progress: step %d/%d\n", s + 1, d->steps);
      last_progress = now_us();
    }
  }
  double secs = (now_us() - start) / 1e6;
  long tokens = 2L * d->steps * d->cfg->max_tokens_per_rank;
  if (d->info.rank == 0) {
    printf("%4s %6s %10s %18s %18s %10s %10s\n", "rank", "steps", "tokens/s",
           "dispatch p50/p99", "combine p50/p99", "MB moved", "verified");
  }
  char verified[32];
  snprintf(verified, sizeof verified, d->verify ? "%ld/%ld" : "off", d->verified,
           d->verified + d->failed);
  printf("%4d %6d %10.0f %8.0f/%6.0f us %8.0f/%6.0f us %10.1f %10s\n", d->info.rank,
         d->steps, tokens / secs, pct(d->disp_us, d->n_lat, 0.5), pct(d->disp_us, d->n_lat, 0.99),
         pct(d->comb_us, d->n_lat, 0.5), pct(d->comb_us, d->n_lat, 0.99), d->bytes / 1e6,
         verified);
  fflush(stdout);
  CHECK(d->ep->group_destroy(d->group));
  d->ep->config_free(d->cfg);
  moe_ep_unload(lib);
  return d->failed ? 1 : 0;
}
