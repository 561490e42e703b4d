/* moe_ep_plugin.c: the one exported symbol, moe_ep_plugin_v1, and the thin
 * entry functions behind it. Every entry clears nothing and validates its
 * pointers before forwarding to the runtime; all of them are hidden. */
#include "moe_ep.h"
#include "runtime/config.h"
#include "runtime/error.h"
#include "runtime/group.h"
#include "runtime/log.h"

#define MEP_EXPORT __attribute__((visibility("default")))

static moe_ep_status_t entry_get_version(int *major, int *minor, int *patch) {
  if (major == NULL || minor == NULL || patch == NULL) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "get_version: major, minor and patch must be non-NULL");
  }
  *major = MOE_EP_VERSION_MAJOR;
  *minor = MOE_EP_VERSION_MINOR;
  *patch = MOE_EP_VERSION_PATCH;
  return MOE_EP_OK;
}

static moe_ep_status_t entry_set_logger(moe_ep_logger_fn fn, void *user) {
  mep_log_set_logger(fn, user);
  return MOE_EP_OK;
}

static moe_ep_status_t entry_config_from_yaml(const char *path_or_text,
                                              moe_ep_config_t **out) {
  if (out == NULL) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT, "config_from_yaml: out is NULL");
  }
  return mep_config_from_yaml(path_or_text, out);
}

MEP_EXPORT const moe_ep_plugin_v1_t moe_ep_plugin_v1 = {
    .struct_size = sizeof(moe_ep_plugin_v1_t),
    .abi_version = MOE_EP_ABI_VERSION,
    .name = "moe_ep",
    .get_version = entry_get_version,
    .last_error = mep_last_error,
    .status_string = mep_status_string,
    .set_logger = entry_set_logger,
    .config_from_yaml = entry_config_from_yaml,
    .config_free = mep_config_free,
    .buffer_size_hint = mep_buffer_size_hint,
    .group_create = mep_group_create,
    .group_destroy = mep_group_destroy,
    .group_info = mep_group_info,
    .group_poll_error = mep_group_poll_error,
    .set_num_sms = mep_group_set_num_sms,
    .max_sms_used = mep_group_max_sms_used,
    .prepare = mep_prepare,
    .dispatch = mep_dispatch,
    .combine = mep_combine,
    .hook_run = mep_hook_run,
    .hook_free = mep_hook_free,
    .handle_free = mep_handle_free,
    .handle_layout = mep_handle_layout,
    .group_busy_hook = mep_group_busy_hook,
};
