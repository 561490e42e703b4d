/* config_canonical.c: the canonical "key=value" text of the keys every rank
 * must agree on, its FNV-1a hash (compared at group_create) and the
 * one-line description of the first difference between two such texts. */
#include <stdio.h>
#include <string.h>

#include "runtime/config.h"
#include "runtime/config_keys.h"

static int key_cmp(int a, int b) {
  return strcmp(mep_config_keys[a].path, mep_config_keys[b].path);
}

/* Agreed keys sorted by path, so the text (and hash) does not depend on the
 * table's order. Insertion sort: twelve entries. */
static int sorted_agreed(int *idx) {
  int n = 0;
  for (int k = 0; k < MEP_CONFIG_NUM_KEYS; k++) {
    if (!mep_config_keys[k].agreed) continue;
    int j = n++;
    while (j > 0 && key_cmp(idx[j - 1], k) > 0) {
      idx[j] = idx[j - 1];
      j--;
    }
    idx[j] = k;
  }
  return n;
}

static void value_text(const mep_config_key_t *key, const moe_ep_config_t *cfg,
                       char *buf, size_t cap) {
  int32_t v = mep_config_key_get(key, cfg);
  switch (key->kind) {
    case MEP_KEY_ENUM:
      for (int32_t i = 0; key->names[i] != NULL; i++) {
        if (i == v) {
          snprintf(buf, cap, "%s", key->names[i]);
          return;
        }
      }
      snprintf(buf, cap, "%d", (int)v); /* invalid: still deterministic */
      return;
    case MEP_KEY_BOOL:
      snprintf(buf, cap, "%s", v == 0 ? "false" : v == 1 ? "true" : "invalid");
      return;
    case MEP_KEY_INT:
      snprintf(buf, cap, "%d", (int)v);
      return;
    case MEP_KEY_STRING:
      snprintf(buf, cap, "%.*s", (int)key->size,
               (const char *)cfg + key->offset);
      return;
  }
}

size_t mep_config_canonical(const moe_ep_config_t *cfg, char *buf, size_t cap) {
  if (buf == NULL || cap == 0) return 0;
  buf[0] = '\0';
  if (cfg == NULL) return 0;
  int idx[MEP_CONFIG_NUM_KEYS];
  int n = sorted_agreed(idx);
  size_t len = 0;
  for (int i = 0; i < n; i++) {
    const mep_config_key_t *key = &mep_config_keys[idx[i]];
    char value[MOE_EP_ADDRESS_MAX];
    value_text(key, cfg, value, sizeof(value));
    int w = snprintf(buf + len, cap - len, "%s=%s\n", key->path, value);
    if (w < 0) break;
    if ((size_t)w >= cap - len) return cap - 1; /* truncated */
    len += (size_t)w;
  }
  return len;
}

uint64_t mep_config_hash(const moe_ep_config_t *cfg) {
  char text[2048];
  size_t n = mep_config_canonical(cfg, text, sizeof(text));
  uint64_t h = 14695981039346656037ull; /* FNV-1a 64 offset basis */
  for (size_t i = 0; i < n; i++) {
    h ^= (unsigned char)text[i];
    h *= 1099511628211ull; /* FNV-1a 64 prime */
  }
  return h;
}

/* Finds "key=" at the start of a line of `text`; returns the value's start
 * and its length through *vlen, or NULL. */
static const char *find_value(const char *text, const char *key, size_t klen,
                              size_t *vlen) {
  const char *line = text;
  while (line != NULL && *line != '\0') {
    const char *end = strchr(line, '\n');
    size_t llen = end ? (size_t)(end - line) : strlen(line);
    if (llen > klen && strncmp(line, key, klen) == 0 && line[klen] == '=') {
      *vlen = llen - klen - 1;
      return line + klen + 1;
    }
    line = end ? end + 1 : NULL;
  }
  return NULL;
}

/* Compares `a`'s keys against `b`; writes the first difference. */
static int first_diff(const char *a, const char *b, int a_is_mine, char *buf,
                      size_t cap) {
  const char *line = a;
  while (line != NULL && *line != '\0') {
    const char *end = strchr(line, '\n');
    size_t llen = end ? (size_t)(end - line) : strlen(line);
    const char *eq = memchr(line, '=', llen);
    if (eq != NULL) {
      size_t klen = (size_t)(eq - line);
      size_t alen = llen - klen - 1, blen = 0;
      const char *bval = find_value(b, line, klen, &blen);
      if (bval == NULL || blen != alen || memcmp(bval, eq + 1, alen) != 0) {
        const char *missing = "(missing)";
        int bl = bval ? (int)blen : (int)strlen(missing);
        const char *bv = bval ? bval : missing;
        if (a_is_mine) {
          snprintf(buf, cap, "%.*s: %.*s vs %.*s", (int)klen, line, (int)alen,
                   eq + 1, bl, bv);
        } else {
          snprintf(buf, cap, "%.*s: %.*s vs %.*s", (int)klen, line, bl, bv,
                   (int)alen, eq + 1);
        }
        return 1;
      }
    }
    line = end ? end + 1 : NULL;
  }
  return 0;
}

void mep_config_describe_diff(const char *mine, const char *theirs, char *buf,
                              size_t cap) {
  if (buf == NULL || cap == 0) return;
  if (mine == NULL || theirs == NULL) {
    snprintf(buf, cap, "(no config to compare)");
    return;
  }
  if (first_diff(mine, theirs, 1, buf, cap)) return;
  if (first_diff(theirs, mine, 0, buf, cap)) return;
  snprintf(buf, cap, "no difference");
}
