/* dispatch_check_ht.c: the high-throughput dispatch's arguments. HT rows
 * follow x's dtype: bf16, or fp8 the engine already quantised (with its
 * scales), carried verbatim; HT never quantises. Worst-case sizing
 * (MOE_EP_FLAG_WORST_CASE) makes every receive tensor hold the most a rank
 * can receive. */
#include "runtime/dispatch_check.h"

#include "kernels/common/row_desc.h"
#include "runtime/error.h"
#include "runtime/group.h"
#include "runtime/validate.h"

static const char *const kXScalesShape =
    "[T, H/128] float32, [T, H/512] int32 when packed, or [T, 1] float32 per token";

/* params->format against x's dtype; sets the scale format of fp8 rows. */
static moe_ep_status_t ht_format(const moe_ep_group_t *g, const moe_ep_dispatch_params_t *p,
                                 int fp8, const moe_ep_tensor_t *x_scales, int32_t *scale_format) {
  int32_t f = MOE_EP_FORMAT_GROUP;
  MEP_CHECK(mep_dispatch_format(p, &f));
  if (!fp8) {
    if (f != MOE_EP_FORMAT_GROUP && f != MOE_EP_FORMAT_BF16) {
      return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                       "dispatch: params->format=%d asks for fp8 rows but params->x is bf16; "
                       "high-throughput dispatch never quantises: pass x already quantised "
                       "to fp8 e4m3 with its params->x_scales",
                       f);
    }
    if (x_scales != NULL) {
      return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                       "dispatch: params->x_scales=%p is set but params->x is bf16; bf16 rows "
                       "carry no scales (x_scales goes with an fp8 e4m3 x)",
                       (const void *)x_scales);
    }
    return MOE_EP_OK;
  }
  if (f == MOE_EP_FORMAT_BF16) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "dispatch: params->format=%d (bf16) but params->x is fp8_e4m3fn; "
                     "high-throughput rows follow x's dtype (use format 0, or the fp8 format "
                     "of x_scales)",
                     f);
  }
  if (x_scales == NULL) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "dispatch: params->x_scales is NULL but params->x is fp8_e4m3fn; a "
                     "pre-quantised x needs its scales (%s)",
                     kXScalesShape);
  }
  *scale_format = mep_format_scale(f, &g->cfg);
  return MOE_EP_OK;
}

/* x and, for fp8, x_scales: what this call sends. */
static moe_ep_status_t ht_inputs(const moe_ep_group_t *g, const moe_ep_dispatch_params_t *p,
                                 moe_ep_hook_t **hook, mep_op_t *op) {
  int dev = mep_group_device(g), dt;
  const mep_handle_state_t *h = op->handle;
  void *data;
  /* x's dtype chooses the rows, so x is checked first. */
  mep_tensor_rule_t rx = {"dispatch", "params->x", dev, MEP_BIT(MEP_DT_BF16) | MEP_BIT(MEP_DT_FP8),
                          2, {h->num_tokens, p->hidden, 0}, 1};
  MEP_CHECK(mep_tensor_check(p->x, &rx, &data, &dt));
  op->x = data;
  op->fp8 = dt == MEP_DT_FP8;
  const moe_ep_tensor_t *xs = MEP_HAS_FIELD(p, x_scales) ? p->x_scales : NULL;
  MEP_CHECK(ht_format(g, p, op->fp8, xs, &op->scale_format));
  MEP_CHECK(mep_check_flags_hidden(g, "dispatch", p->flags, MEP_DISPATCH_FLAGS, p->hidden, hook,
                                   op->fp8));
  if (!op->fp8) return MOE_EP_OK;
  int packed = op->scale_format == MOE_EP_FP8_SCALE_UE8M0_PACKED;
  mep_tensor_rule_t rs = {"dispatch", "params->x_scales", dev,
                          packed ? MEP_BIT(MEP_DT_I32) : MEP_BIT(MEP_DT_F32), 2,
                          {h->num_tokens, mep_fp8_scale_words(p->hidden, op->scale_format), 0},
                          1};
  MEP_CHECK(mep_tensor_check(xs, &rs, &data, &dt));
  op->x_scales = data;
  return MOE_EP_OK;
}

/* Rows the receive tensors must hold: this rank's receive, or with
 * WORST_CASE the most any rank can receive. */
static moe_ep_status_t ht_capacity(const moe_ep_group_t *g, const moe_ep_dispatch_params_t *p,
                                   mep_op_t *op) {
  int64_t cap = op->recv_capacity, worst = (int64_t)g->world_size * g->cfg.max_tokens_per_rank;
  if ((p->flags & MOE_EP_FLAG_WORST_CASE) && cap < worst) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "dispatch: params->recv_x has %lld rows; with MOE_EP_FLAG_WORST_CASE the "
                     "receive tensors need at least world_size * max_tokens_per_rank = %d * %d "
                     "= %lld rows (the most a rank can receive)",
                     (long long)cap, g->world_size, g->cfg.max_tokens_per_rank,
                     (long long)worst);
  }
  if (cap < op->handle->num_recv) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "dispatch: params->recv_x has %lld rows but this rank "
                     "receives %lld tokens (see prepare's layout)",
                     (long long)cap, (long long)op->handle->num_recv);
  }
  return MOE_EP_OK;
}

static moe_ep_status_t ht_outputs(const moe_ep_group_t *g, const moe_ep_dispatch_params_t *p,
                                  mep_op_t *op) {
  int dev = mep_group_device(g), dt;
  const mep_handle_state_t *h = op->handle;
  void *data;
  MEP_CHECK(mep_check_weights(g, h, "dispatch", p->topk_weights, &data));
  op->topk_weights = data;
  mep_tensor_rule_t rx = {"dispatch", "params->recv_x", dev,
                          op->fp8 ? MEP_BIT(MEP_DT_FP8) : MEP_BIT(MEP_DT_BF16), 2,
                          {-1, p->hidden, 0}, 1};
  MEP_CHECK(mep_tensor_check(p->recv_x, &rx, &op->recv_x, &dt));
  op->recv_capacity = p->recv_x->shape[0];
  MEP_CHECK(ht_capacity(g, p, op));
  int64_t cap = op->recv_capacity;
  if (op->fp8) {
    int packed = op->scale_format == MOE_EP_FP8_SCALE_UE8M0_PACKED;
    mep_tensor_rule_t rs = {"dispatch", "params->recv_scales", dev,
                            packed ? MEP_BIT(MEP_DT_I32) : MEP_BIT(MEP_DT_F32), 2,
                            {cap, mep_fp8_scale_words(p->hidden, op->scale_format), 0}, 1};
    MEP_CHECK(mep_tensor_check(p->recv_scales, &rs, &op->recv_scales, &dt));
  }
  mep_tensor_rule_t ri = {"dispatch", "params->recv_topk_idx", dev, MEP_BIT(MEP_DT_I32),
                          2, {cap, h->top_k, 0}, 1};
  MEP_CHECK(mep_tensor_check(p->recv_topk_idx, &ri, &data, &dt));
  op->recv_topk_idx = data;
  mep_tensor_rule_t rtw = {"dispatch", "params->recv_topk_weights", dev,
                           MEP_BIT(MEP_DT_F32), 2, {cap, h->top_k, 0}, 1};
  MEP_CHECK(mep_tensor_check(p->recv_topk_weights, &rtw, &data, &dt));
  op->recv_topk_weights = data;
  mep_tensor_rule_t rc = {"dispatch", "params->recv_count", dev, MEP_BIT(MEP_DT_I32),
                          1, {g->num_local_experts, 0, 0}, 0};
  MEP_CHECK(mep_tensor_check(p->recv_count, &rc, &data, &dt));
  op->recv_count = data;
  if (p->num_recv_tokens == NULL && !(p->flags & MOE_EP_FLAG_WORST_CASE)) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "dispatch: params->num_recv_tokens is NULL; high-throughput "
                     "dispatch reports the received row count there (it may be NULL "
                     "only with MOE_EP_FLAG_WORST_CASE)");
  }
  op->num_recv_tokens = p->num_recv_tokens;
  return MOE_EP_OK;
}

moe_ep_status_t mep_check_ht_dispatch(const moe_ep_group_t *g, const moe_ep_dispatch_params_t *p,
                                      moe_ep_hook_t **hook, mep_op_t *op) {
  MEP_CHECK(ht_inputs(g, p, hook, op));
  MEP_CHECK(ht_outputs(g, p, op));
  const mep_named_tensor_t ts[] = {
      {"params->x", p->x, 0},
      {"params->x_scales", op->fp8 ? p->x_scales : NULL, 0},
      {"params->topk_weights", p->topk_weights, 0},
      {"params->recv_x", p->recv_x, 1},
      {"params->recv_scales", op->fp8 ? p->recv_scales : NULL, 1},
      {"params->recv_topk_idx", p->recv_topk_idx, 1},
      {"params->recv_topk_weights", p->recv_topk_weights, 1},
      {"params->recv_count", p->recv_count, 1},
  };
  return mep_tensors_disjoint("dispatch", ts, 8);
}
