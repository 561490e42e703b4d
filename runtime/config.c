/* config.c: defaults, the config_from_yaml entry (file or text), import of
 * engine-filled structs honouring struct_size, and enum names. Parsing is in
 * config_yaml.c, env overrides in config_env.c, rules in config_check.c. */
#define _POSIX_C_SOURCE 200809L

#include "runtime/config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "runtime/config_keys.h"
#include "runtime/error.h"

/* Larger than any engine config; bounds what a wrong path can make us read. */
#define MEP_CONFIG_FILE_MAX (16u << 20)

void mep_config_defaults(moe_ep_config_t *cfg) {
  if (cfg == NULL) return;
  memset(cfg, 0, sizeof(*cfg));
  cfg->struct_size = sizeof(*cfg);
  cfg->backend = MOE_EP_BACKEND_AUTO;
  cfg->mode = MOE_EP_MODE_LOW_LATENCY;
  cfg->num_experts = 256;
  cfg->hidden = 7168;
  cfg->top_k = 8;
  cfg->max_tokens_per_rank = 128;
  cfg->dispatch_dtype = MOE_EP_DISPATCH_BF16;
  cfg->fp8_scale = MOE_EP_FP8_SCALE_F32;
  cfg->double_buffer = 1;
  cfg->transport = MOE_EP_TRANSPORT_AUTO;
  cfg->ranks_per_node = 0; /* unset */
  cfg->bootstrap_timeout_ms = 30000;
  cfg->kernel_timeout_ms = 10000;
  cfg->log_level = MOE_EP_LOG_WARN;
  snprintf(cfg->bootstrap_address, sizeof(cfg->bootstrap_address), "%s",
           "127.0.0.1:29500");
  snprintf(cfg->bootstrap_token_env, sizeof(cfg->bootstrap_token_env), "%s",
           "MOE_EP_JOB_TOKEN");
}

static void errno_text(int err, char *buf, size_t cap) {
  if (strerror_r(err, buf, cap) != 0) snprintf(buf, cap, "errno %d", err);
}

/* Reads a whole regular file into a malloc'd buffer (*text, *len). */
static moe_ep_status_t read_file(const char *path, char **text, size_t *len) {
  char err[128];
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    errno_text(errno, err, sizeof(err));
    return mep_error(MOE_EP_ERR_CONFIG, "config file '%s' cannot be opened: %s",
                     path, err);
  }
  moe_ep_status_t st = MOE_EP_OK;
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap);
  if (buf == NULL) {
    st = mep_error(MOE_EP_ERR_NO_MEMORY, "config file '%s': out of memory",
                   path);
    goto out_close;
  }
  for (;;) {
    if (n == cap) {
      if (cap >= MEP_CONFIG_FILE_MAX) {
        if (fgetc(f) == EOF) break; /* exactly the bound */
        st = mep_error(MOE_EP_ERR_CONFIG,
                       "config file '%s' is larger than %u bytes; a config "
                       "file is expected to be small",
                       path, MEP_CONFIG_FILE_MAX);
        goto out_free;
      }
      char *bigger = realloc(buf, cap * 2);
      if (bigger == NULL) {
        st = mep_error(MOE_EP_ERR_NO_MEMORY, "config file '%s': out of memory",
                       path);
        goto out_free;
      }
      buf = bigger;
      cap *= 2;
    }
    size_t got = fread(buf + n, 1, cap - n, f);
    n += got;
    if (got == 0) break;
  }
  if (ferror(f)) {
    st = mep_error(MOE_EP_ERR_CONFIG, "config file '%s' could not be read",
                   path);
    goto out_free;
  }
  *text = buf;
  *len = n;
  goto out_close;
out_free:
  free(buf);
out_close:
  fclose(f);
  return st;
}

static moe_ep_status_t parse_all(const char *text, size_t len,
                                 const char *source, moe_ep_config_t **out) {
  if (len > MEP_CONFIG_FILE_MAX) {
    return mep_error(MOE_EP_ERR_CONFIG,
                     "%s is %zu bytes, larger than %u; a config is expected "
                     "to be small",
                     source, len, MEP_CONFIG_FILE_MAX);
  }
  mep_config_origin_t *origin = calloc(1, sizeof(*origin));
  moe_ep_config_t *cfg = malloc(sizeof(*cfg));
  moe_ep_status_t st = MOE_EP_OK;
  if (origin == NULL || cfg == NULL) {
    st = mep_error(MOE_EP_ERR_NO_MEMORY, "config_from_yaml: out of memory");
    goto out_free;
  }
  mep_config_defaults(cfg);
  MEP_CHECK_GOTO(mep_config_read_yaml_text(text, len, source, cfg, origin), st,
                 out_free);
  MEP_CHECK_GOTO(mep_config_apply_env(cfg, origin), st, out_free);
  st = mep_config_check(cfg, origin);
  if (st != MOE_EP_OK) {
    mep_error_prefix("%s", source);
    goto out_free;
  }
  free(origin);
  *out = cfg;
  return MOE_EP_OK;
out_free:
  free(cfg);
  free(origin);
  return st;
}

moe_ep_status_t mep_config_from_yaml(const char *path_or_text,
                                     moe_ep_config_t **out) {
  if (path_or_text == NULL) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "config_from_yaml: path_or_text is NULL; pass a file "
                     "path or YAML text");
  }
  if (out == NULL) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "config_from_yaml: out is NULL; pass the address of a "
                     "moe_ep_config_t pointer");
  }
  struct stat sb;
  int stat_errno = 0;
  if (stat(path_or_text, &sb) == 0) {
    if (S_ISREG(sb.st_mode)) {
      char *text = NULL;
      size_t len = 0;
      MEP_CHECK(read_file(path_or_text, &text, &len));
      char source[512 + 16]; /* long paths (Bazel sandboxes) stay whole */
      snprintf(source, sizeof(source), "config file '%.512s'", path_or_text);
      moe_ep_status_t st = parse_all(text, len, source, out);
      free(text);
      return st;
    }
    /* A directory or device: reading it as YAML would hang or mislead. */
    if (strchr(path_or_text, '\n') == NULL &&
        strchr(path_or_text, ':') == NULL) {
      return mep_error(MOE_EP_ERR_CONFIG,
                       "config file '%.200s' is not a regular file", path_or_text);
    }
  } else {
    stat_errno = errno;
  }
  if (strchr(path_or_text, '\n') != NULL) {
    return parse_all(path_or_text, strlen(path_or_text), "config text", out);
  }
  if (strchr(path_or_text, ':') != NULL) {
    /* One line: it may have been meant as a path, so say how it was read. */
    char source[160];
    snprintf(source, sizeof(source),
             "config text '%.64s' (no such file, so read as YAML)",
             path_or_text);
    return parse_all(path_or_text, strlen(path_or_text), source, out);
  }
  char err[128];
  errno_text(stat_errno, err, sizeof(err));
  return mep_error(MOE_EP_ERR_CONFIG,
                   "config file '%.200s' not found: %s (text with a newline "
                   "or ':' is read as YAML instead)",
                   path_or_text, err);
}

void mep_config_free(moe_ep_config_t *cfg) { free(cfg); }

/* Smallest struct_size an engine may pass: everything up to log_level. The
 * strings after it are optional (defaults). */
#define MEP_CONFIG_MIN_SIZE \
  (offsetof(moe_ep_config_t, log_level) + sizeof(int32_t))

moe_ep_status_t mep_config_import(const moe_ep_config_t *user,
                                  moe_ep_config_t *out) {
  if (user == NULL || out == NULL) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "config import: %s is NULL", user == NULL ? "config" : "out");
  }
  if (user->struct_size < MEP_CONFIG_MIN_SIZE) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "config struct_size is %zu; it must be at least %zu "
                     "(through log_level); initialise the struct with "
                     "MOE_EP_INIT(moe_ep_config_t)",
                     user->struct_size, (size_t)MEP_CONFIG_MIN_SIZE);
  }
  moe_ep_config_t tmp;
  mep_config_defaults(&tmp);
  /* Copy only fields that lie wholly inside the engine's struct: a field cut
   * by struct_size is one the engine's header did not have. */
  for (int k = 0; k < MEP_CONFIG_NUM_KEYS; k++) {
    const mep_config_key_t *key = &mep_config_keys[k];
    if (key->offset + key->size <= user->struct_size) {
      memcpy((char *)&tmp + key->offset, (const char *)user + key->offset,
             key->size);
    }
  }
  MEP_CHECK(mep_config_check(&tmp, NULL));
  *out = tmp;
  return MOE_EP_OK;
}

static const char *enum_name(int k, int v) {
  const char *const *names = mep_config_keys[k].names;
  for (int i = 0; names[i] != NULL; i++) {
    if (i == v) return names[i];
  }
  return "unknown";
}

const char *mep_backend_name(int v) { return enum_name(MEP_KEY_BACKEND, v); }
const char *mep_mode_name(int v) { return enum_name(MEP_KEY_MODE, v); }
const char *mep_dispatch_dtype_name(int v) {
  return enum_name(MEP_KEY_DISPATCH_DTYPE, v);
}
const char *mep_fp8_scale_name(int v) { return enum_name(MEP_KEY_FP8_SCALE, v); }
const char *mep_transport_name(int v) { return enum_name(MEP_KEY_TRANSPORT, v); }
