/* config_env.c: MOE_EP_<KEY> environment overrides, applied after the YAML
 * so an operator can change one key without editing the engine's file.
 * Other MOE_EP_* variables (MOE_EP_RANK, ...) belong to the launcher. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/config_keys.h"
#include "runtime/error.h"

moe_ep_status_t mep_config_apply_env(moe_ep_config_t *cfg,
                                     mep_config_origin_t *origin) {
  for (int k = 0; k < MEP_CONFIG_NUM_KEYS; k++) {
    const mep_config_key_t *key = &mep_config_keys[k];
    const char *value = getenv(key->env);
    /* Empty means unset, as for MOE_EP_LOG_LEVEL in log.c: `VAR= cmd` is
     * the usual way to switch an override off. */
    if (value == NULL || value[0] == '\0') continue;
    char where[MEP_CONFIG_WHERE_MAX];
    snprintf(where, sizeof(where), "environment variable %s", key->env);
    MEP_CHECK(mep_config_key_set(key, cfg, value, strlen(value), where));
    if (origin != NULL) {
      snprintf(origin->where[k], sizeof(origin->where[k]), "%s", where);
    }
  }
  return MOE_EP_OK;
}
