/* config.h: the effective configuration: YAML `moe_ep:` section, defaults,
 * MOE_EP_<KEY> environment overrides, range checks and the canonical hash
 * the ranks compare at group_create. */
#ifndef MEP_CONFIG_H_
#define MEP_CONFIG_H_

#include <stddef.h>
#include <stdint.h>

#include "moe_ep.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Fills every field with its documented default. */
void mep_config_defaults(moe_ep_config_t *cfg);

/* Parses a file path or YAML text (see moe_ep.h), applies environment
 * overrides and validates. On success *out is malloc'd; free with
 * mep_config_free. On failure nothing is allocated and last_error names the
 * key, its line and what is allowed. */
moe_ep_status_t mep_config_from_yaml(const char *path_or_text,
                                     moe_ep_config_t **out);
void mep_config_free(moe_ep_config_t *cfg);

/* Copies an engine-provided config honouring its struct_size (fields past
 * it take defaults) and validates ranges. */
moe_ep_status_t mep_config_import(const moe_ep_config_t *user,
                                  moe_ep_config_t *out);

/* Range / consistency checks on a full config (names the key on failure). */
moe_ep_status_t mep_config_validate(const moe_ep_config_t *cfg);

/* Canonical "key=value\n" text of the keys every rank must agree on (data
 * shapes and protocol; not log_level or bootstrap timing), sorted by key.
 * Returns the length written (truncated to cap-1, always NUL-terminated). */
size_t mep_config_canonical(const moe_ep_config_t *cfg, char *buf, size_t cap);
uint64_t mep_config_hash(const moe_ep_config_t *cfg); /* FNV-1a of canonical */

/* Given two canonical texts that differ, writes the first differing key and
 * both values: "max_tokens_per_rank: 128 vs 256". */
void mep_config_describe_diff(const char *mine, const char *theirs, char *buf,
                              size_t cap);

/* Whether dispatch moves fp8 rows: fp8_e4m3 in low_latency mode (high
 * throughput always moves bf16). */
static inline int mep_config_fp8_dispatch(const moe_ep_config_t *cfg) {
  return cfg->mode == MOE_EP_MODE_LOW_LATENCY &&
         cfg->dispatch_dtype == MOE_EP_DISPATCH_FP8_E4M3;
}

/* Names for enums, as written in YAML ("host", "low_latency", "fp8_e4m3"...). */
const char *mep_backend_name(int v);
const char *mep_mode_name(int v);
const char *mep_dispatch_dtype_name(int v);
const char *mep_fp8_scale_name(int v);
const char *mep_transport_name(int v);

#ifdef __cplusplus
}
#endif

#endif /* MEP_CONFIG_H_ */
