/* dispatch_check.c: checks shared by dispatch and combine, and the
 * low-latency dispatch's arguments (see dispatch_check.h). */
#include "runtime/dispatch_check.h"

#include "kernels/common/row_desc.h"
#include "runtime/config.h"
#include "runtime/error.h"
#include "runtime/group.h"
#include "runtime/validate.h"

moe_ep_status_t mep_check_flags_hidden(const moe_ep_group_t *g, const char *entry,
                                       uint32_t flags, uint32_t known, int32_t hidden,
                                       moe_ep_hook_t **hook, int fp8) {
  if (flags & ~known) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "%s: params->flags=0x%x has unknown bits 0x%x", entry,
                     flags, flags & ~known);
  }
  if ((flags & MOE_EP_FLAG_DEFER_RECV) && hook == NULL) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "%s: MOE_EP_FLAG_DEFER_RECV needs a non-NULL hook output",
                     entry);
  }
  int align = fp8 ? MEP_HIDDEN_ALIGN : MEP_BF16_HIDDEN_ALIGN;
  if (hidden < align || hidden > g->cfg.hidden || hidden % align != 0) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "%s: params->hidden=%d must be a multiple of %d%s in [%d, "
                     "config hidden=%d]",
                     entry, hidden, align, fp8 ? " (fp8 scales cover 128 channels)" : "",
                     align, g->cfg.hidden);
  }
  return MOE_EP_OK;
}

moe_ep_status_t mep_check_weights(const moe_ep_group_t *g, const mep_handle_state_t *h,
                                  const char *what, const moe_ep_tensor_t *t, void **data) {
  int dt;
  mep_tensor_rule_t r = {what, "params->topk_weights", mep_group_device(g), MEP_BIT(MEP_DT_F32),
                         2, {h->num_tokens, h->top_k, 0}, 1};
  return mep_tensor_check(t, &r, data, &dt);
}

moe_ep_status_t mep_dispatch_format(const moe_ep_dispatch_params_t *p, int32_t *format) {
  int32_t f = MEP_HAS_FIELD(p, format) ? p->format : MOE_EP_FORMAT_GROUP;
  if (f < MOE_EP_FORMAT_GROUP || f > MOE_EP_FORMAT_FP8_PER_TOKEN) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "dispatch: params->format=%d is not a moe_ep_dispatch_format_t value "
                     "(0..%d)",
                     f, MOE_EP_FORMAT_FP8_PER_TOKEN);
  }
  *format = f;
  return MOE_EP_OK;
}

int32_t mep_format_scale(int32_t format, const moe_ep_config_t *cfg) {
  switch (format) {
    case MOE_EP_FORMAT_FP8_F32: return MOE_EP_FP8_SCALE_F32;
    case MOE_EP_FORMAT_FP8_UE8M0: return MOE_EP_FP8_SCALE_UE8M0;
    case MOE_EP_FORMAT_FP8_UE8M0_PACKED: return MOE_EP_FP8_SCALE_UE8M0_PACKED;
    case MOE_EP_FORMAT_FP8_PER_TOKEN: return MEP_FP8_SCALE_PER_TOKEN;
    default: return cfg->fp8_scale;
  }
}

/* This call's LL rows (params->format, or the group's): a bf16 call needs a
 * group whose buffers hold bf16 rows (dispatch_dtype: bf16); fp8 rows fit
 * either. */
static moe_ep_status_t ll_format(const moe_ep_group_t *g, const moe_ep_dispatch_params_t *p,
                                 int *fp8, int32_t *scale_format) {
  int32_t f = MOE_EP_FORMAT_GROUP;
  MEP_CHECK(mep_dispatch_format(p, &f));
  if (f == MOE_EP_FORMAT_FP8_PER_TOKEN) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "dispatch: params->format=%d (fp8 with one scale per token) is a format of "
                     "pre-quantised high-throughput rows; low-latency dispatch quantises bf16 x "
                     "itself, one scale per 128 channels (formats 0..4)",
                     f);
  }
  *fp8 = f == MOE_EP_FORMAT_GROUP ? mep_config_fp8_dispatch(&g->cfg) : f != MOE_EP_FORMAT_BF16;
  *scale_format = mep_format_scale(f, &g->cfg);
  if (!*fp8 && mep_config_fp8_dispatch(&g->cfg)) {
    return mep_error(MOE_EP_ERR_UNSUPPORTED,
                     "dispatch: params->format=%d asks for bf16 rows, but this group's "
                     "buffers hold fp8 rows (dispatch_dtype: fp8_e4m3); configure "
                     "dispatch_dtype: bf16 to choose the format per call",
                     f);
  }
  return MOE_EP_OK;
}

/* What low-latency dispatch refuses of the arguments HT takes. */
static moe_ep_status_t ll_refusals(const moe_ep_dispatch_params_t *p) {
  if (p->flags & MOE_EP_FLAG_WORST_CASE) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "dispatch: params->flags=0x%x has MOE_EP_FLAG_WORST_CASE, which is for "
                     "high_throughput dispatch; low-latency outputs are always worst-case "
                     "sized ([E_local, R*max_tokens, H])",
                     p->flags);
  }
  if (MEP_HAS_FIELD(p, x_scales) && p->x_scales != NULL) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "dispatch: params->x_scales=%p is not NULL; x_scales is for "
                     "high_throughput dispatch; low-latency dispatch quantises bf16 x itself",
                     (const void *)p->x_scales);
  }
  return MOE_EP_OK;
}

static moe_ep_status_t ll_outputs(const moe_ep_group_t *g, const moe_ep_dispatch_params_t *p,
                                  mep_op_t *op) {
  int dev = mep_group_device(g);
  int64_t el = g->num_local_experts;
  int64_t slots = (int64_t)g->world_size * g->cfg.max_tokens_per_rank;
  void *data;
  int dt;
  /* Optional in LL: weights given here travel with the tokens, so combine
   * can sum each token's experts on the expert side (fewer bytes back). */
  if (MEP_HAS_FIELD(p, topk_weights) && p->topk_weights != NULL) {
    MEP_CHECK(mep_check_weights(g, op->handle, "dispatch", p->topk_weights, &data));
    op->topk_weights = data;
    op->weighted = 1;
  }
  mep_tensor_rule_t rx = {"dispatch", "params->recv_x", dev,
                          op->fp8 ? MEP_BIT(MEP_DT_FP8) : MEP_BIT(MEP_DT_BF16), 3,
                          {el, slots, p->hidden}, 0};
  MEP_CHECK(mep_tensor_check(p->recv_x, &rx, &op->recv_x, &dt));
  mep_tensor_rule_t rc = {"dispatch", "params->recv_count", dev, MEP_BIT(MEP_DT_I32),
                          1, {el, 0, 0}, 0};
  MEP_CHECK(mep_tensor_check(p->recv_count, &rc, &data, &dt));
  op->recv_count = data;
  if (op->fp8) {
    int packed = op->scale_format == MOE_EP_FP8_SCALE_UE8M0_PACKED;
    mep_tensor_rule_t rs = {"dispatch", "params->recv_scales", dev,
                            packed ? MEP_BIT(MEP_DT_I32) : MEP_BIT(MEP_DT_F32), 3,
                            {el, slots, mep_fp8_scale_words(p->hidden, op->scale_format)}, 0};
    MEP_CHECK(mep_tensor_check(p->recv_scales, &rs, &op->recv_scales, &dt));
  }
  return MOE_EP_OK;
}

moe_ep_status_t mep_check_ll_dispatch(const moe_ep_group_t *g, const moe_ep_dispatch_params_t *p,
                                      moe_ep_hook_t **hook, mep_op_t *op) {
  int fp8;
  MEP_CHECK(ll_format(g, p, &fp8, &op->scale_format));
  MEP_CHECK(mep_check_flags_hidden(g, "dispatch", p->flags, MEP_DISPATCH_FLAGS, p->hidden, hook,
                                   fp8));
  MEP_CHECK(ll_refusals(p));
  op->fp8 = fp8;
  void *data;
  int dt;
  mep_tensor_rule_t rx = {"dispatch", "params->x", mep_group_device(g), MEP_BIT(MEP_DT_BF16), 2,
                          {op->handle->num_tokens, p->hidden, 0}, 1};
  MEP_CHECK(mep_tensor_check(p->x, &rx, &data, &dt));
  op->x = data;
  MEP_CHECK(ll_outputs(g, p, op));
  const mep_named_tensor_t ts[] = {
      {"params->x", p->x, 0},
      {"params->topk_weights", op->weighted ? p->topk_weights : NULL, 0},
      {"params->recv_x", p->recv_x, 1},
      {"params->recv_scales", op->fp8 ? p->recv_scales : NULL, 1},
      {"params->recv_count", p->recv_count, 1},
  };
  return mep_tensors_disjoint("dispatch", ts, 5);
}
