/* config_keys.c: the key table and typed parsing of one scalar value
 * (enum name, integer, boolean, string) shared by YAML and environment
 * input. Range rules live in config_check.c, not here. */
#include "runtime/config_keys.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kernels/common/limits.h"
#include "runtime/error.h"

static const char *const backend_names[] = {"auto", "host", "nccl", NULL};
static const char *const mode_names[] = {"low_latency", "high_throughput",
                                         NULL};
static const char *const dtype_names[] = {"bf16", "fp8_e4m3", NULL};
static const char *const scale_names[] = {"f32", "ue8m0", "ue8m0_packed",
                                          NULL};
static const char *const transport_names[] = {"auto", "lsa", "gin",
                                              "gin_emulated", NULL};
static const char *const level_names[] = {"none",  "error", "warn", "info",
                                          "debug", "trace", NULL};

#define FIELD(f) offsetof(moe_ep_config_t, f), sizeof(((moe_ep_config_t *)0)->f)

const mep_config_key_t mep_config_keys[MEP_CONFIG_NUM_KEYS] = {
    [MEP_KEY_BACKEND] = {"backend", "MOE_EP_BACKEND", MEP_KEY_ENUM,
                         FIELD(backend), backend_names, 1},
    [MEP_KEY_MODE] = {"mode", "MOE_EP_MODE", MEP_KEY_ENUM, FIELD(mode),
                      mode_names, 1},
    [MEP_KEY_NUM_EXPERTS] = {"num_experts", "MOE_EP_NUM_EXPERTS", MEP_KEY_INT,
                             FIELD(num_experts), NULL, 1},
    [MEP_KEY_HIDDEN] = {"hidden", "MOE_EP_HIDDEN", MEP_KEY_INT, FIELD(hidden),
                        NULL, 1},
    [MEP_KEY_TOP_K] = {"top_k", "MOE_EP_TOP_K", MEP_KEY_INT, FIELD(top_k),
                       NULL, 1},
    [MEP_KEY_MAX_TOKENS] = {"max_tokens_per_rank", "MOE_EP_MAX_TOKENS_PER_RANK",
                            MEP_KEY_INT, FIELD(max_tokens_per_rank), NULL, 1},
    [MEP_KEY_DISPATCH_DTYPE] = {"dispatch_dtype", "MOE_EP_DISPATCH_DTYPE",
                                MEP_KEY_ENUM, FIELD(dispatch_dtype),
                                dtype_names, 1},
    [MEP_KEY_FP8_SCALE] = {"fp8_scale", "MOE_EP_FP8_SCALE", MEP_KEY_ENUM,
                           FIELD(fp8_scale), scale_names, 1},
    [MEP_KEY_DOUBLE_BUFFER] = {"double_buffer", "MOE_EP_DOUBLE_BUFFER",
                               MEP_KEY_BOOL, FIELD(double_buffer), NULL, 1},
    [MEP_KEY_TRANSPORT] = {"transport", "MOE_EP_TRANSPORT", MEP_KEY_ENUM,
                           FIELD(transport), transport_names, 1},
    [MEP_KEY_RANKS_PER_NODE] = {"ranks_per_node", "MOE_EP_RANKS_PER_NODE",
                                MEP_KEY_INT, FIELD(ranks_per_node), NULL, 1},
    [MEP_KEY_BOOT_ADDRESS] = {"bootstrap.address", "MOE_EP_BOOTSTRAP_ADDRESS",
                              MEP_KEY_STRING, FIELD(bootstrap_address), NULL,
                              0},
    [MEP_KEY_BOOT_TIMEOUT] = {"bootstrap.timeout_ms",
                              "MOE_EP_BOOTSTRAP_TIMEOUT_MS", MEP_KEY_INT,
                              FIELD(bootstrap_timeout_ms), NULL, 0},
    [MEP_KEY_BOOT_TOKEN_ENV] = {"bootstrap.token_env",
                                "MOE_EP_BOOTSTRAP_TOKEN_ENV", MEP_KEY_STRING,
                                FIELD(bootstrap_token_env), NULL, 0},
    [MEP_KEY_KERNEL_TIMEOUT] = {"timeouts.kernel_ms",
                                "MOE_EP_TIMEOUTS_KERNEL_MS", MEP_KEY_INT,
                                FIELD(kernel_timeout_ms), NULL, 1},
    [MEP_KEY_LOG_LEVEL] = {"log_level", "MOE_EP_LOG_LEVEL", MEP_KEY_ENUM,
                           FIELD(log_level), level_names, 0},
};

int32_t *mep_config_key_int(const mep_config_key_t *key, moe_ep_config_t *cfg) {
  return (int32_t *)((char *)cfg + key->offset);
}

int32_t mep_config_key_get(const mep_config_key_t *key,
                           const moe_ep_config_t *cfg) {
  int32_t v;
  memcpy(&v, (const char *)cfg + key->offset, sizeof(v));
  return v;
}

/* Values are echoed in messages; keep them short. */
#define SHOW "%.64s"

static moe_ep_status_t set_enum(const mep_config_key_t *key, int32_t *field,
                                const char *text, const char *where) {
  /* Case-insensitive: environment variables are often written upper-case. */
  for (int32_t i = 0; key->names[i] != NULL; i++) {
    if (strcasecmp(text, key->names[i]) == 0) {
      *field = i;
      return MOE_EP_OK;
    }
  }
  /* log.c reads MOE_EP_LOG_LEVEL as a name or a number; accept the same so
   * the two readers of that variable never disagree. */
  if (field != NULL && key == &mep_config_keys[MEP_KEY_LOG_LEVEL] &&
      text[0] >= '0' && text[0] <= '5' && text[1] == '\0') {
    *field = text[0] - '0';
    return MOE_EP_OK;
  }
  char allowed[160];
  mep_config_key_allowed(key, allowed, sizeof(allowed));
  return mep_error(MOE_EP_ERR_CONFIG,
                   "config key '%s' (%s): '" SHOW "' is not a valid value; "
                   "allowed: %s",
                   key->path, where, text, allowed);
}

static moe_ep_status_t set_int(const mep_config_key_t *key, int32_t *field,
                               const char *text, const char *where) {
  char allowed[160];
  mep_config_key_allowed(key, allowed, sizeof(allowed));
  const char *p = text;
  if (*p == '+' || *p == '-') p++;
  int digits = *p != '\0';
  for (const char *q = p; *q != '\0'; q++) {
    if (*q < '0' || *q > '9') digits = 0;
  }
  if (!digits) {
    return mep_error(MOE_EP_ERR_CONFIG,
                     "config key '%s' (%s): '" SHOW "' is not an integer; "
                     "allowed: %s",
                     key->path, where, text, allowed);
  }
  if (p[0] == '0' && p[1] != '\0') {
    /* YAML 1.1 readers (libyaml's spec, PyYAML, which engines read the same
     * file with) take 010 as octal 8: refuse rather than read a number the
     * engine sees otherwise. */
    return mep_error(MOE_EP_ERR_CONFIG,
                     "config key '%s' (%s): '" SHOW "' has a leading zero, "
                     "which YAML 1.1 readers take as octal; write it without; "
                     "allowed: %s",
                     key->path, where, text, allowed);
  }
  errno = 0;
  long long v = strtoll(text, NULL, 10);
  if (errno == ERANGE || v < INT32_MIN || v > INT32_MAX) {
    return mep_error(MOE_EP_ERR_CONFIG,
                     "config key '%s' (%s): '" SHOW "' does not fit in a "
                     "32-bit integer; allowed: %s",
                     key->path, where, text, allowed);
  }
  *field = (int32_t)v;
  return MOE_EP_OK;
}

static moe_ep_status_t set_bool(const mep_config_key_t *key, int32_t *field,
                                const char *text, const char *where) {
  static const char *const yes[] = {"true", "yes", "on", "1"};
  static const char *const no[] = {"false", "no", "off", "0"};
  for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
    if (strcasecmp(text, yes[i]) == 0) {
      *field = 1;
      return MOE_EP_OK;
    }
    if (strcasecmp(text, no[i]) == 0) {
      *field = 0;
      return MOE_EP_OK;
    }
  }
  char allowed[160];
  mep_config_key_allowed(key, allowed, sizeof(allowed));
  return mep_error(MOE_EP_ERR_CONFIG,
                   "config key '%s' (%s): '" SHOW "' is not a boolean; "
                   "allowed: %s",
                   key->path, where, text, allowed);
}

static moe_ep_status_t set_string(const mep_config_key_t *key,
                                  moe_ep_config_t *cfg, const char *text,
                                  size_t len, const char *where) {
  if (len >= key->size) {
    return mep_error(MOE_EP_ERR_CONFIG,
                     "config key '%s' (%s): value is %zu characters long; "
                     "at most %zu are allowed",
                     key->path, where, len, key->size - 1);
  }
  char *field = (char *)cfg + key->offset;
  memcpy(field, text, len);
  field[len] = '\0';
  return MOE_EP_OK;
}

moe_ep_status_t mep_config_key_set(const mep_config_key_t *key,
                                   moe_ep_config_t *cfg, const char *text,
                                   size_t len, const char *where) {
  if (memchr(text, '\0', len) != NULL) {
    return mep_error(MOE_EP_ERR_CONFIG,
                     "config key '%s' (%s): value contains a NUL character",
                     key->path, where);
  }
  switch (key->kind) {
    case MEP_KEY_ENUM:
      return set_enum(key, mep_config_key_int(key, cfg), text, where);
    case MEP_KEY_INT:
      return set_int(key, mep_config_key_int(key, cfg), text, where);
    case MEP_KEY_BOOL:
      return set_bool(key, mep_config_key_int(key, cfg), text, where);
    case MEP_KEY_STRING:
      return set_string(key, cfg, text, len, where);
  }
  return mep_error(MOE_EP_ERR_INTERNAL, "config key '%s' has no type",
                   key->path);
}

void mep_config_key_allowed(const mep_config_key_t *key, char *buf,
                            size_t cap) {
  size_t n = 0;
  buf[0] = '\0';
  switch ((int)(key - mep_config_keys)) {
    case MEP_KEY_NUM_EXPERTS:
      snprintf(buf, cap, "integer 1..%d", MEP_MAX_EXPERTS);
      return;
    case MEP_KEY_HIDDEN:
      snprintf(buf, cap,
               "integer %d..%d, a multiple of %d (of %d when dispatch_dtype "
               "is fp8_e4m3)",
               MEP_BF16_HIDDEN_ALIGN, MEP_MAX_HIDDEN, MEP_BF16_HIDDEN_ALIGN,
               MEP_HIDDEN_ALIGN);
      return;
    case MEP_KEY_TOP_K:
      snprintf(buf, cap, "integer 1..%d", MEP_MAX_TOP_K);
      return;
    case MEP_KEY_MAX_TOKENS:
      snprintf(buf, cap,
               "integer 1..%d in mode low_latency, 1..%d in mode "
               "high_throughput",
               MEP_MAX_TOKENS_LL, MEP_MAX_TOKENS_HT);
      return;
    case MEP_KEY_RANKS_PER_NODE:
      snprintf(buf, cap,
               "integer 0..%d (0 = unset; otherwise a divisor of the world "
               "size)",
               MEP_MAX_RANKS);
      return;
    case MEP_KEY_BOOT_TIMEOUT:
    case MEP_KEY_KERNEL_TIMEOUT:
      snprintf(buf, cap, "integer 1..%d (milliseconds)", MEP_MAX_TIMEOUT_MS);
      return;
    case MEP_KEY_BOOT_ADDRESS:
      snprintf(buf, cap,
               "\"host:port\" (host name, IPv4 or [IPv6]; port 1..65535), "
               "at most %d characters",
               MOE_EP_ADDRESS_MAX - 1);
      return;
    case MEP_KEY_BOOT_TOKEN_ENV:
      snprintf(buf, cap,
               "an environment variable name [A-Za-z_][A-Za-z0-9_]*, at "
               "most %d characters",
               MOE_EP_ENV_NAME_MAX - 1);
      return;
    case MEP_KEY_DOUBLE_BUFFER:
      snprintf(buf, cap, "true/false/yes/no/on/off/1/0");
      return;
    default:
      break;
  }
  if (key->kind != MEP_KEY_ENUM) return;
  n = (size_t)snprintf(buf, cap, "one of ");
  for (int i = 0; key->names[i] != NULL && n < cap; i++) {
    n += (size_t)snprintf(buf + n, cap - n, "%s%s", i ? ", " : "",
                          key->names[i]);
  }
}

size_t mep_config_edit_distance(const char *a, size_t alen, const char *b,
                                size_t blen) {
  /* Two rows are enough; keys are short, so cap the work for fuzzed input. */
  enum { MAXLEN = 64 };
  if (alen > MAXLEN || blen > MAXLEN) return (size_t)-1;
  size_t prev[MAXLEN + 1], cur[MAXLEN + 1];
  for (size_t j = 0; j <= blen; j++) prev[j] = j;
  for (size_t i = 1; i <= alen; i++) {
    cur[0] = i;
    for (size_t j = 1; j <= blen; j++) {
      size_t sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
      size_t del = prev[j] + 1;
      size_t ins = cur[j - 1] + 1;
      size_t best = sub < del ? sub : del;
      cur[j] = best < ins ? best : ins;
    }
    memcpy(prev, cur, sizeof(size_t) * (blen + 1));
  }
  return prev[blen];
}
