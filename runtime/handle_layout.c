/* handle_layout.c: the handle_layout entry: an LL handle's slot layout
 * (DeepEP's src_info and layout_range) after its dispatch. The checks
 * every backend shares live here, so a backend's op sees only a completed
 * dispatch and well-formed outputs. */
#include "runtime/error.h"
#include "runtime/group.h"
#include "runtime/validate.h"

static moe_ep_status_t check_outputs(const moe_ep_group_t *g, const moe_ep_handle_layout_params_t *p,
                                     int32_t **src_info, int64_t **layout_range) {
  int dev = mep_group_device(g), dt;
  int64_t el = g->num_local_experts, slots = (int64_t)g->world_size * g->cfg.max_tokens_per_rank;
  void *data = NULL;
  if (p->src_info != NULL) {
    mep_tensor_rule_t r = {"handle_layout", "params->src_info", dev, MEP_BIT(MEP_DT_I32), 2,
                           {el, slots, 0}, 0};
    MEP_CHECK(mep_tensor_check(p->src_info, &r, &data, &dt));
    *src_info = data;
  }
  if (p->layout_range != NULL) {
    mep_tensor_rule_t r = {"handle_layout", "params->layout_range", dev, MEP_BIT(MEP_DT_I64), 2,
                           {el, g->world_size, 0}, 0};
    MEP_CHECK(mep_tensor_check(p->layout_range, &r, &data, &dt));
    *layout_range = data;
  }
  return MOE_EP_OK;
}

static moe_ep_status_t handle_layout_locked(moe_ep_group_t *g, moe_ep_handle_t *h,
                                            const moe_ep_handle_layout_params_t *p) {
  /* Looked up again under the lock: another thread may have freed it. */
  MEP_CHECK(mep_handle_check(g, h, "handle_layout"));
  MEP_CHECK(mep_group_broken_error(g, "handle_layout"));
  if (p == NULL || !MEP_HAS_FIELD(p, stream)) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "handle_layout: params is NULL or params->struct_size=%zu is below "
                     "sizeof(moe_ep_handle_layout_params_t)=%zu",
                     p ? p->struct_size : (size_t)0, sizeof(moe_ep_handle_layout_params_t));
  }
  if (g->cfg.mode != MOE_EP_MODE_LOW_LATENCY) {
    return mep_error(MOE_EP_ERR_UNSUPPORTED,
                     "handle_layout: handle=%p is a high_throughput handle; the slot layout "
                     "(src_info, layout_range) is LL only",
                     (void *)h);
  }
  if (h->dispatched != MEP_DISPATCHED) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "handle_layout: handle=%p has %s; its layout exists once its dispatch's "
                     "receive has completed",
                     (void *)h, mep_dispatch_state_text(h->dispatched));
  }
  if (g->ops->handle_layout == NULL) {
    return mep_error(MOE_EP_ERR_UNSUPPORTED,
                     "handle_layout: the %s backend does not export the slot layout",
                     g->ops->name);
  }
  int32_t *src_info = NULL;
  int64_t *layout_range = NULL;
  MEP_CHECK(check_outputs(g, p, &src_info, &layout_range));
  return g->ops->handle_layout(g, h, src_info, layout_range, p->stream);
}

moe_ep_status_t mep_handle_layout(moe_ep_handle_t *h, const moe_ep_handle_layout_params_t *p) {
  moe_ep_group_t *g;
  MEP_CHECK(mep_owner_group(h, MEP_OBJ_HANDLE, "handle_layout", &g));
  MEP_LOCKED_ENTRY(g, "handle_layout", handle_layout_locked(g, h, p));
}
