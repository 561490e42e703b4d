/* config_check.c: every range and consistency rule on a full config, in one
 * place, for YAML input, environment overrides and engine-filled structs
 * alike. Messages name the key, its value, where it came from, and what is
 * allowed. */
#include <stdio.h>
#include <string.h>

#include "kernels/common/limits.h"
#include "runtime/config.h"
#include "runtime/config_keys.h"
#include "runtime/error.h"

/* " (line 5)" or "" when the value is a default or came from a struct. */
static void origin_text(const mep_config_origin_t *origin, int k, char *buf,
                        size_t cap) {
  buf[0] = '\0';
  if (origin != NULL && origin->where[k][0] != '\0') {
    snprintf(buf, cap, " (%s)", origin->where[k]);
  }
}

static moe_ep_status_t int_error(const moe_ep_config_t *cfg,
                                 const mep_config_origin_t *origin, int k,
                                 const char *why) {
  const mep_config_key_t *key = &mep_config_keys[k];
  char where[MEP_CONFIG_WHERE_MAX + 4], allowed[200];
  origin_text(origin, k, where, sizeof(where));
  mep_config_key_allowed(key, allowed, sizeof(allowed));
  return mep_error(MOE_EP_ERR_CONFIG,
                   "config key '%s' = %d%s %s; allowed: %s", key->path,
                   (int)mep_config_key_get(key, cfg), where, why, allowed);
}

static moe_ep_status_t check_range(const moe_ep_config_t *cfg,
                                   const mep_config_origin_t *origin, int k,
                                   int32_t lo, int32_t hi) {
  int32_t v = mep_config_key_get(&mep_config_keys[k], cfg);
  if (v < lo || v > hi) return int_error(cfg, origin, k, "is out of range");
  return MOE_EP_OK;
}

static moe_ep_status_t check_enum(const moe_ep_config_t *cfg,
                                  const mep_config_origin_t *origin, int k) {
  const mep_config_key_t *key = &mep_config_keys[k];
  int32_t n = 0;
  while (key->names[n] != NULL) n++;
  return check_range(cfg, origin, k, 0, n - 1);
}

static moe_ep_status_t check_hidden(const moe_ep_config_t *cfg,
                                    const mep_config_origin_t *origin) {
  MEP_CHECK(check_range(cfg, origin, MEP_KEY_HIDDEN, MEP_BF16_HIDDEN_ALIGN,
                        MEP_MAX_HIDDEN));
  if (cfg->hidden % MEP_BF16_HIDDEN_ALIGN != 0) {
    return int_error(cfg, origin, MEP_KEY_HIDDEN, "is not a multiple of 8");
  }
  if (cfg->dispatch_dtype == MOE_EP_DISPATCH_FP8_E4M3 &&
      cfg->hidden % MEP_HIDDEN_ALIGN != 0) {
    char why[160], dwhere[MEP_CONFIG_WHERE_MAX + 4];
    origin_text(origin, MEP_KEY_DISPATCH_DTYPE, dwhere, sizeof(dwhere));
    snprintf(why, sizeof(why),
             "is not a multiple of %d, which dispatch_dtype fp8_e4m3%s needs "
             "(one scale per %d channels)",
             MEP_HIDDEN_ALIGN, dwhere, MEP_HIDDEN_ALIGN);
    return int_error(cfg, origin, MEP_KEY_HIDDEN, why);
  }
  return MOE_EP_OK;
}

static moe_ep_status_t check_max_tokens(const moe_ep_config_t *cfg,
                                        const mep_config_origin_t *origin) {
  int ll = cfg->mode == MOE_EP_MODE_LOW_LATENCY;
  int32_t hi = ll ? MEP_MAX_TOKENS_LL : MEP_MAX_TOKENS_HT;
  if (cfg->max_tokens_per_rank >= 1 && cfg->max_tokens_per_rank <= hi) {
    return MOE_EP_OK;
  }
  char why[128];
  snprintf(why, sizeof(why), "is out of range for mode %s",
           ll ? "low_latency" : "high_throughput");
  return int_error(cfg, origin, MEP_KEY_MAX_TOKENS, why);
}

/* "host:port": host is a name / IPv4 (no ':') or a bracketed IPv6 literal;
 * port is decimal 1..65535. Returns NULL when fine, else the broken rule. */
static const char *address_problem(const char *s) {
  const char *colon;
  if (s[0] == '[') {
    const char *close = strchr(s, ']');
    if (close == NULL) return "has '[' without ']'";
    if (close == s + 1) return "has an empty IPv6 host";
    for (const char *p = s + 1; p < close; p++) {
      if (strchr("0123456789abcdefABCDEF:.%", *p) == NULL) {
        return "has a character not allowed in an IPv6 address";
      }
    }
    if (close[1] != ':') return "has no ':port' after ']'";
    colon = close + 1;
  } else {
    colon = strchr(s, ':');
    if (colon == NULL) return "has no ':port'";
    if (strchr(colon + 1, ':') != NULL) {
      return "has more than one ':' (write IPv6 hosts as [addr]:port)";
    }
    if (colon == s) return "has an empty host";
    for (const char *p = s; p < colon; p++) {
      char c = *p;
      int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
               (c >= '0' && c <= '9') || c == '.' || c == '-' || c == '_';
      if (!ok) return "has a character not allowed in a host name";
    }
  }
  const char *port = colon + 1;
  if (*port == '\0') return "has an empty port";
  long v = 0;
  for (const char *p = port; *p != '\0'; p++) {
    if (*p < '0' || *p > '9') return "has a port that is not a number";
    v = v * 10 + (*p - '0');
    if (v > 65535) return "has a port above 65535";
  }
  if (v < 1) return "has port 0";
  return NULL;
}

static int env_name_ok(const char *s) {
  if (!((s[0] >= 'A' && s[0] <= 'Z') || (s[0] >= 'a' && s[0] <= 'z') ||
        s[0] == '_')) {
    return 0;
  }
  for (const char *p = s + 1; *p != '\0'; p++) {
    char c = *p;
    if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
          (c >= '0' && c <= '9') || c == '_')) {
      return 0;
    }
  }
  return 1;
}

static moe_ep_status_t string_error(const mep_config_origin_t *origin, int k,
                                    const char *value, const char *why) {
  const mep_config_key_t *key = &mep_config_keys[k];
  char where[MEP_CONFIG_WHERE_MAX + 4], allowed[200];
  origin_text(origin, k, where, sizeof(where));
  mep_config_key_allowed(key, allowed, sizeof(allowed));
  return mep_error(MOE_EP_ERR_CONFIG,
                   "config key '%s' = '%.80s'%s %s; allowed: %s", key->path,
                   value, where, why, allowed);
}

static moe_ep_status_t check_strings(const moe_ep_config_t *cfg,
                                     const mep_config_origin_t *origin) {
  /* Engine-filled structs may lack the terminator: never read past it. */
  if (memchr(cfg->bootstrap_address, '\0', sizeof(cfg->bootstrap_address)) ==
      NULL) {
    return string_error(origin, MEP_KEY_BOOT_ADDRESS, "",
                        "is not NUL-terminated within MOE_EP_ADDRESS_MAX");
  }
  if (memchr(cfg->bootstrap_token_env, '\0',
             sizeof(cfg->bootstrap_token_env)) == NULL) {
    return string_error(origin, MEP_KEY_BOOT_TOKEN_ENV, "",
                        "is not NUL-terminated within MOE_EP_ENV_NAME_MAX");
  }
  const char *why = address_problem(cfg->bootstrap_address);
  if (why != NULL) {
    return string_error(origin, MEP_KEY_BOOT_ADDRESS, cfg->bootstrap_address,
                        why);
  }
  if (!env_name_ok(cfg->bootstrap_token_env)) {
    return string_error(origin, MEP_KEY_BOOT_TOKEN_ENV,
                        cfg->bootstrap_token_env,
                        "is not a valid environment variable name");
  }
  return MOE_EP_OK;
}

moe_ep_status_t mep_config_check(const moe_ep_config_t *cfg,
                                 const mep_config_origin_t *origin) {
  if (cfg == NULL) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "config is NULL; pass a config from config_from_yaml");
  }
  MEP_CHECK(check_enum(cfg, origin, MEP_KEY_BACKEND));
  MEP_CHECK(check_enum(cfg, origin, MEP_KEY_MODE));
  MEP_CHECK(check_range(cfg, origin, MEP_KEY_NUM_EXPERTS, 1, MEP_MAX_EXPERTS));
  MEP_CHECK(check_enum(cfg, origin, MEP_KEY_DISPATCH_DTYPE));
  MEP_CHECK(check_hidden(cfg, origin));
  MEP_CHECK(check_range(cfg, origin, MEP_KEY_TOP_K, 1, MEP_MAX_TOP_K));
  MEP_CHECK(check_max_tokens(cfg, origin));
  MEP_CHECK(check_enum(cfg, origin, MEP_KEY_FP8_SCALE));
  MEP_CHECK(check_range(cfg, origin, MEP_KEY_DOUBLE_BUFFER, 0, 1));
  MEP_CHECK(check_enum(cfg, origin, MEP_KEY_TRANSPORT));
  MEP_CHECK(check_range(cfg, origin, MEP_KEY_RANKS_PER_NODE, 0, MEP_MAX_RANKS));
  MEP_CHECK(check_range(cfg, origin, MEP_KEY_BOOT_TIMEOUT, 1,
                        MEP_MAX_TIMEOUT_MS));
  MEP_CHECK(check_range(cfg, origin, MEP_KEY_KERNEL_TIMEOUT, 1,
                        MEP_MAX_TIMEOUT_MS));
  MEP_CHECK(check_enum(cfg, origin, MEP_KEY_LOG_LEVEL));
  return check_strings(cfg, origin);
}

moe_ep_status_t mep_config_validate(const moe_ep_config_t *cfg) {
  return mep_config_check(cfg, NULL);
}
