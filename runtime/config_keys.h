/* config_keys.h: the one table of configuration keys (YAML path, env name,
 * struct field, type) shared by the YAML reader, the env overrides, import,
 * validation and the canonical text, so no key is spelled twice. */
#ifndef MEP_CONFIG_KEYS_H_
#define MEP_CONFIG_KEYS_H_

#include <stddef.h>
#include <stdint.h>

#include "moe_ep.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mep_config_kind {
  MEP_KEY_ENUM,   /* int32 field, value is an index into `names` */
  MEP_KEY_INT,    /* int32 field */
  MEP_KEY_BOOL,   /* int32 field, 0 or 1 */
  MEP_KEY_STRING  /* char[size] field, NUL-terminated */
} mep_config_kind_t;

typedef struct mep_config_key {
  const char *path;          /* YAML path under moe_ep:, "bootstrap.address" */
  const char *env;           /* "MOE_EP_BOOTSTRAP_ADDRESS" */
  mep_config_kind_t kind;
  size_t offset;             /* offsetof(moe_ep_config_t, field) */
  size_t size;               /* sizeof the field */
  const char *const *names;  /* MEP_KEY_ENUM: spellings, NULL-terminated */
  int agreed;                /* every rank must hold the same value */
} mep_config_key_t;

/* Keys in declaration order; log_level's position is fixed by tests. */
enum {
  MEP_KEY_BACKEND,
  MEP_KEY_MODE,
  MEP_KEY_NUM_EXPERTS,
  MEP_KEY_HIDDEN,
  MEP_KEY_TOP_K,
  MEP_KEY_MAX_TOKENS,
  MEP_KEY_DISPATCH_DTYPE,
  MEP_KEY_FP8_SCALE,
  MEP_KEY_DOUBLE_BUFFER,
  MEP_KEY_TRANSPORT,
  MEP_KEY_RANKS_PER_NODE,
  MEP_KEY_BOOT_ADDRESS,
  MEP_KEY_BOOT_TIMEOUT,
  MEP_KEY_BOOT_TOKEN_ENV,
  MEP_KEY_KERNEL_TIMEOUT,
  MEP_KEY_LOG_LEVEL,
  MEP_CONFIG_NUM_KEYS
};

extern const mep_config_key_t mep_config_keys[MEP_CONFIG_NUM_KEYS];

/* Where each key's value came from, for error messages: "" (default or
 * engine struct), "line 7" or "environment variable MOE_EP_TOP_K". */
#define MEP_CONFIG_WHERE_MAX 96
typedef struct mep_config_origin {
  char where[MEP_CONFIG_NUM_KEYS][MEP_CONFIG_WHERE_MAX];
} mep_config_origin_t;

/* Pointer to the key's int32 field (ENUM/INT/BOOL) in cfg. */
int32_t *mep_config_key_int(const mep_config_key_t *key, moe_ep_config_t *cfg);
int32_t mep_config_key_get(const mep_config_key_t *key,
                           const moe_ep_config_t *cfg);

/* Parses `text` (length len, may hold NULs: rejected) as the key's type and
 * stores it in cfg. Only the type is checked here; ranges are checked by
 * mep_config_check so one place owns them. `where` names the source for the
 * message ("line 5", "environment variable MOE_EP_TOP_K"). */
moe_ep_status_t mep_config_key_set(const mep_config_key_t *key,
                                   moe_ep_config_t *cfg, const char *text,
                                   size_t len, const char *where);

/* Human text of what the key allows ("integer 1..32", "one of auto, host,
 * nccl"), for error messages. */
void mep_config_key_allowed(const mep_config_key_t *key, char *buf,
                            size_t cap);

/* Validation with origins (may be NULL): the message names the key, where
 * its value came from and what is allowed. */
moe_ep_status_t mep_config_check(const moe_ep_config_t *cfg,
                                 const mep_config_origin_t *origin);

/* Applies MOE_EP_<KEY> environment overrides (config_env.c). */
moe_ep_status_t mep_config_apply_env(moe_ep_config_t *cfg,
                                     mep_config_origin_t *origin);

/* Reads the `moe_ep:` section of YAML text (len bytes; NULs allowed, libyaml
 * rejects them) into cfg. `source` names the input in messages ("config
 * text" or "config file 'x.yaml'"). config_yaml.c. */
moe_ep_status_t mep_config_read_yaml_text(const char *text, size_t len,
                                          const char *source,
                                          moe_ep_config_t *cfg,
                                          mep_config_origin_t *origin);

/* Edit distance (Levenshtein) for "did you mean" suggestions. */
size_t mep_config_edit_distance(const char *a, size_t alen, const char *b,
                                size_t blen);

#ifdef __cplusplus
}
#endif

#endif /* MEP_CONFIG_KEYS_H_ */
