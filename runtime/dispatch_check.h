/* dispatch_check.h: the argument checks of dispatch and combine that every
 * backend shares, per mode: flags and hidden, routing weights, the row
 * format, and each mode's tensors. Each fills the mep_op_t a backend
 * receives; each failure names the argument, its value and the rule. */
#ifndef MEP_DISPATCH_CHECK_H_
#define MEP_DISPATCH_CHECK_H_

#include <stdint.h>

#include "moe_ep.h"
#include "runtime/op.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MEP_DISPATCH_FLAGS \
  (MOE_EP_FLAG_DEFER_RECV | MOE_EP_FLAG_ROUND_SCALE | MOE_EP_FLAG_WORST_CASE)
#define MEP_COMBINE_FLAGS (MOE_EP_FLAG_DEFER_RECV | MOE_EP_FLAG_ROUND_SCALE)

/* flags within `known`, a hook output for DEFER_RECV, and hidden a multiple
 * of 8 (128 for fp8 rows) up to the config's hidden. */
moe_ep_status_t mep_check_flags_hidden(const moe_ep_group_t *g, const char *entry,
                                       uint32_t flags, uint32_t known, int32_t hidden,
                                       moe_ep_hook_t **hook, int fp8);

/* topk_weights of a dispatch or combine (`what`): f32 [num_tokens, top_k]
 * on the group's device; *data is its element pointer. */
moe_ep_status_t mep_check_weights(const moe_ep_group_t *g, const mep_handle_state_t *h,
                                  const char *what, const moe_ep_tensor_t *t, void **data);

/* params->format (MOE_EP_FORMAT_GROUP when the caller's struct predates
 * it), checked to be a moe_ep_dispatch_format_t value. */
moe_ep_status_t mep_dispatch_format(const moe_ep_dispatch_params_t *p, int32_t *format);
/* The moe_ep_fp8_scale_t an fp8 format names; the group's for the others. */
int32_t mep_format_scale(int32_t format, const moe_ep_config_t *cfg);

/* Everything a dispatch takes in each mode, into op (fp8, scale_format,
 * x, x_scales and the outputs). */
moe_ep_status_t mep_check_ll_dispatch(const moe_ep_group_t *g, const moe_ep_dispatch_params_t *p,
                                      moe_ep_hook_t **hook, mep_op_t *op);
moe_ep_status_t mep_check_ht_dispatch(const moe_ep_group_t *g, const moe_ep_dispatch_params_t *p,
                                      moe_ep_hook_t **hook, mep_op_t *op);

#ifdef __cplusplus
}
#endif

#endif /* MEP_DISPATCH_CHECK_H_ */
