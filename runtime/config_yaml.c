/* config_yaml.c: reads the `moe_ep:` section of an engine's YAML with
 * libyaml's document loader and stores each key through the key table.
 * Every message starts with the source and names the key, its line and what
 * is allowed; the engine's other top-level keys are not looked at. */
#include <stdio.h>
#include <string.h>
#include <yaml.h>

#include "runtime/config_keys.h"
#include "runtime/error.h"

#define SECTION "moe_ep"

typedef struct yaml_ctx {
  yaml_document_t *doc;
  const char *source; /* "config text" / "config file 'x.yaml'" */
  moe_ep_config_t *cfg;
  mep_config_origin_t *origin;
} yaml_ctx_t;

static int line_of(const yaml_node_t *node) {
  return (int)node->start_mark.line + 1;
}

static int scalar_is(const yaml_node_t *node, const char *s) {
  size_t n = strlen(s);
  return node->type == YAML_SCALAR_NODE && node->data.scalar.length == n &&
         memcmp(node->data.scalar.value, s, n) == 0;
}

/* libyaml does not resolve implicit tags: a plain "", "~" or "null" is the
 * YAML null, as is an explicit !!null. */
static int is_null(const yaml_node_t *node) {
  if (node->type != YAML_SCALAR_NODE) return 0;
  if (node->tag != NULL && strcmp((const char *)node->tag, YAML_NULL_TAG) == 0) {
    return 1;
  }
  if (node->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return 0;
  return scalar_is(node, "") || scalar_is(node, "~") ||
         scalar_is(node, "null") || scalar_is(node, "Null") ||
         scalar_is(node, "NULL");
}

/* "a mapping", "a sequence" or "scalar 'text'" for messages. */
static void describe(const yaml_node_t *node, char *buf, size_t cap) {
  if (node->type == YAML_MAPPING_NODE) {
    snprintf(buf, cap, "a mapping");
  } else if (node->type == YAML_SEQUENCE_NODE) {
    snprintf(buf, cap, "a sequence");
  } else {
    int n = node->data.scalar.length > 40 ? 40 : (int)node->data.scalar.length;
    snprintf(buf, cap, "scalar '%.*s%s'", n,
             (const char *)node->data.scalar.value,
             node->data.scalar.length > 40 ? "..." : "");
  }
}

/* Line of byte `offset` in text, for reader errors that carry no mark. */
static int line_at(const char *text, size_t len, size_t offset) {
  int line = 1;
  for (size_t i = 0; i < offset && i < len; i++) line += text[i] == '\n';
  return line;
}

static moe_ep_status_t parser_error(const yaml_parser_t *p, const char *text,
                                    size_t len, const char *source) {
  if (p->error == YAML_MEMORY_ERROR) {
    return mep_error(MOE_EP_ERR_NO_MEMORY, "%s: out of memory parsing YAML",
                     source);
  }
  const char *problem = p->problem ? p->problem : "unknown problem";
  if (p->error == YAML_READER_ERROR) {
    return mep_error(MOE_EP_ERR_CONFIG,
                     "%s, line %d: malformed YAML: %s (byte offset %zu); "
                     "expected UTF-8 YAML text",
                     source, line_at(text, len, p->problem_offset), problem,
                     p->problem_offset);
  }
  char context[128] = "";
  if (p->context != NULL) {
    snprintf(context, sizeof(context), " (%s at line %d)", p->context,
             (int)p->context_mark.line + 1);
  }
  return mep_error(MOE_EP_ERR_CONFIG,
                   "%s, line %d, column %d: malformed YAML: %s%s", source,
                   (int)p->problem_mark.line + 1,
                   (int)p->problem_mark.column + 1, problem, context);
}

/* Key k's name directly under `prefix`: returns the rest of its path after
 * the prefix (NULL when the key is not under it), *clen the length of the
 * first component and *dot where a nested section continues (NULL for a
 * leaf). */
static const char *key_under(int k, const char *prefix, size_t plen, size_t *clen,
                             const char **dot) {
  const char *path = mep_config_keys[k].path;
  if (strncmp(path, prefix, plen) != 0) return NULL;
  const char *rest = path + plen;
  *dot = strchr(rest, '.');
  *clen = *dot ? (size_t)(*dot - rest) : strlen(rest);
  return rest;
}

/* Finds `name` among the keys directly under `prefix` ("" or "bootstrap.").
 * Returns the first key index whose path continues with it, or -1;
 * *section is set when the name is a mapping of further keys. */
static int lookup(const char *prefix, const char *name, size_t nlen,
                  int *section) {
  size_t plen = strlen(prefix), clen;
  const char *dot;
  for (int k = 0; k < MEP_CONFIG_NUM_KEYS; k++) {
    const char *rest = key_under(k, prefix, plen, &clen, &dot);
    if (rest == NULL) continue;
    if (clen == nlen && memcmp(rest, name, nlen) == 0) {
      *section = dot != NULL;
      return k;
    }
  }
  return -1;
}

/* Allowed names directly under `prefix`, comma separated, and the closest
 * one to `name` (also matching leaves of nested sections, so a top-level
 * "timeout_ms" suggests "bootstrap.timeout_ms"). */
static void allowed_and_suggestion(const char *prefix, const char *name,
                                   size_t nlen, char *allowed, size_t acap,
                                   char *suggest, size_t scap) {
  size_t plen = strlen(prefix), n = 0, best = (size_t)-1, best_len = 0;
  allowed[0] = suggest[0] = '\0';
  for (int k = 0; k < MEP_CONFIG_NUM_KEYS; k++) {
    size_t clen;
    const char *dot;
    const char *rest = key_under(k, prefix, plen, &clen, &dot);
    if (rest == NULL) continue;
    /* List each section once: skip if an earlier key had the same head. */
    int dup = 0;
    for (int j = 0; j < k && !dup; j++) {
      const char *pj = mep_config_keys[j].path;
      dup = strncmp(pj, prefix, plen) == 0 &&
            strncmp(pj + plen, rest, clen) == 0 &&
            (pj[plen + clen] == '.' || pj[plen + clen] == '\0');
    }
    if (!dup && n < acap) {
      n += (size_t)snprintf(allowed + n, acap - n, "%s%.*s", n ? ", " : "",
                            (int)clen, rest);
    }
    size_t d = mep_config_edit_distance(name, nlen, rest, clen);
    if (d < best) {
      best = d;
      best_len = clen;
      snprintf(suggest, scap, "%.*s", (int)clen, rest);
    }
    if (dot != NULL) {
      const char *leaf = strrchr(rest, '.') + 1;
      size_t dl = mep_config_edit_distance(name, nlen, leaf, strlen(leaf));
      size_t dr = mep_config_edit_distance(name, nlen, rest, strlen(rest));
      if (dr < dl) dl = dr;
      if (dl < best) {
        best = dl;
        best_len = strlen(leaf);
        snprintf(suggest, scap, "%s", rest);
      }
    }
  }
  /* Only suggest what is plausibly a typo of the written name. */
  size_t longer = nlen > best_len ? nlen : best_len;
  if (best > 2 && best * 3 > longer) suggest[0] = '\0';
}

/* "moe_ep" or "moe_ep.bootstrap" for prefix "" / "bootstrap.". */
static void section_label(const char *prefix, char *buf, size_t cap) {
  size_t plen = strlen(prefix);
  if (plen == 0) {
    snprintf(buf, cap, "%s", SECTION);
  } else {
    snprintf(buf, cap, "%s.%.*s", SECTION, (int)plen - 1, prefix);
  }
}

static moe_ep_status_t unknown_key(yaml_ctx_t *c, const char *prefix,
                                   const yaml_node_t *key) {
  const char *name = (const char *)key->data.scalar.value;
  size_t nlen = key->data.scalar.length;
  char allowed[400], suggest[64], hint[96] = "";
  allowed_and_suggestion(prefix, name, nlen, allowed, sizeof(allowed),
                         suggest, sizeof(suggest));
  if (suggest[0] != '\0') {
    snprintf(hint, sizeof(hint), " (did you mean '%s%s'?)", prefix, suggest);
  }
  char label[64];
  section_label(prefix, label, sizeof(label));
  int show = nlen > 64 ? 64 : (int)nlen;
  return mep_error(MOE_EP_ERR_CONFIG,
                   "%s, line %d: unknown key '%s%.*s'%s; allowed keys under "
                   "%s: %s",
                   c->source, line_of(key), prefix, show, name, hint, label,
                   allowed);
}

static moe_ep_status_t read_mapping(yaml_ctx_t *c, const yaml_node_t *map,
                                    const char *prefix);

static moe_ep_status_t read_leaf(yaml_ctx_t *c, int k, const yaml_node_t *key,
                                 const yaml_node_t *value) {
  const mep_config_key_t *desc = &mep_config_keys[k];
  char allowed[200], where[MEP_CONFIG_WHERE_MAX];
  mep_config_key_allowed(desc, allowed, sizeof(allowed));
  snprintf(where, sizeof(where), "line %d", line_of(key));
  if (value->type != YAML_SCALAR_NODE) {
    char got[64];
    describe(value, got, sizeof(got));
    return mep_error(MOE_EP_ERR_CONFIG,
                     "%s, line %d: config key '%s' is %s, not a single value; "
                     "allowed: %s",
                     c->source, line_of(key), desc->path, got, allowed);
  }
  if (is_null(value)) {
    return mep_error(MOE_EP_ERR_CONFIG,
                     "%s, line %d: config key '%s' has no value; allowed: %s",
                     c->source, line_of(key), desc->path, allowed);
  }
  moe_ep_status_t st =
      mep_config_key_set(desc, c->cfg, (const char *)value->data.scalar.value,
                         value->data.scalar.length, where);
  if (st != MOE_EP_OK) {
    mep_error_prefix("%s", c->source);
    return st;
  }
  snprintf(c->origin->where[k], sizeof(c->origin->where[k]), "%s", where);
  return MOE_EP_OK;
}

static moe_ep_status_t read_section(yaml_ctx_t *c, int k,
                                    const yaml_node_t *key,
                                    const yaml_node_t *value) {
  /* "bootstrap.address" -> prefix "bootstrap." */
  const char *path = mep_config_keys[k].path;
  char prefix[64];
  size_t plen = (size_t)(strchr(path, '.') - path) + 1;
  snprintf(prefix, sizeof(prefix), "%.*s", (int)plen, path);
  if (is_null(value)) return MOE_EP_OK; /* "bootstrap:" alone: defaults */
  if (value->type != YAML_MAPPING_NODE) {
    char got[64], allowed[200], suggest[64];
    describe(value, got, sizeof(got));
    allowed_and_suggestion(prefix, "", 0, allowed, sizeof(allowed), suggest,
                           sizeof(suggest));
    return mep_error(MOE_EP_ERR_CONFIG,
                     "%s, line %d: config key '%.*s' is %s; it must be a "
                     "mapping with keys: %s",
                     c->source, line_of(key), (int)plen - 1, path, got,
                     allowed);
  }
  return read_mapping(c, value, prefix);
}

static moe_ep_status_t read_mapping(yaml_ctx_t *c, const yaml_node_t *map,
                                    const char *prefix) {
  yaml_node_pair_t *first = map->data.mapping.pairs.start;
  for (yaml_node_pair_t *pair = first; pair < map->data.mapping.pairs.top;
       pair++) {
    yaml_node_t *key = yaml_document_get_node(c->doc, pair->key);
    yaml_node_t *value = yaml_document_get_node(c->doc, pair->value);
    if (key == NULL || value == NULL) {
      return mep_error(MOE_EP_ERR_INTERNAL, "%s: YAML node missing",
                       c->source);
    }
    if (key->type != YAML_SCALAR_NODE) {
      char got[64], label[64];
      describe(key, got, sizeof(got));
      section_label(prefix, label, sizeof(label));
      return mep_error(MOE_EP_ERR_CONFIG,
                       "%s, line %d: a key under %s is %s; keys must be "
                       "plain names",
                       c->source, line_of(key), label, got);
    }
    const char *name = (const char *)key->data.scalar.value;
    size_t nlen = key->data.scalar.length;
    int section = 0;
    int k = lookup(prefix, name, nlen, &section);
    if (k < 0) return unknown_key(c, prefix, key);
    /* Earlier pairs are all known keys (unknown ones already failed). */
    for (yaml_node_pair_t *prev = first; prev < pair; prev++) {
      yaml_node_t *pk = yaml_document_get_node(c->doc, prev->key);
      if (pk != NULL && pk->type == YAML_SCALAR_NODE &&
          pk->data.scalar.length == nlen &&
          memcmp(pk->data.scalar.value, name, nlen) == 0) {
        return mep_error(MOE_EP_ERR_CONFIG,
                         "%s, line %d: duplicate key '%s%.*s' (first set at "
                         "line %d); each key may appear once",
                         c->source, line_of(key), prefix, (int)nlen, name,
                         line_of(pk));
      }
    }
    moe_ep_status_t st = section ? read_section(c, k, key, value)
                                 : read_leaf(c, k, key, value);
    if (st != MOE_EP_OK) return st;
  }
  return MOE_EP_OK;
}

/* Finds the single `moe_ep:` pair of the top-level mapping. */
static moe_ep_status_t find_section(yaml_ctx_t *c, const yaml_node_t *root,
                                    yaml_node_t **key_out,
                                    yaml_node_t **value_out) {
  char got[64];
  if (root == NULL) {
    return mep_error(MOE_EP_ERR_CONFIG,
                     "%s, line 1: the YAML is empty; expected a top-level "
                     "mapping with a '" SECTION ":' section",
                     c->source);
  }
  if (root->type != YAML_MAPPING_NODE) {
    describe(root, got, sizeof(got));
    return mep_error(MOE_EP_ERR_CONFIG,
                     "%s, line %d: the top level is %s, not a mapping; "
                     "expected a mapping with a '" SECTION ":' section",
                     c->source, line_of(root), got);
  }
  yaml_node_t *found = NULL, *near = NULL;
  for (yaml_node_pair_t *pair = root->data.mapping.pairs.start;
       pair < root->data.mapping.pairs.top; pair++) {
    yaml_node_t *key = yaml_document_get_node(c->doc, pair->key);
    if (key == NULL || key->type != YAML_SCALAR_NODE) continue;
    if (!scalar_is(key, SECTION)) {
      if (mep_config_edit_distance((const char *)key->data.scalar.value,
                                   key->data.scalar.length, SECTION,
                                   strlen(SECTION)) <= 2) {
        near = key;
      }
      continue;
    }
    if (found != NULL) {
      return mep_error(MOE_EP_ERR_CONFIG,
                       "%s, line %d: duplicate key '" SECTION "' (first at "
                       "line %d); the section may appear once",
                       c->source, line_of(key), line_of(found));
    }
    found = key;
    *value_out = yaml_document_get_node(c->doc, pair->value);
  }
  if (found == NULL) {
    char hint[128] = "";
    if (near != NULL) {
      snprintf(hint, sizeof(hint), "; did you mean '" SECTION "' for '%.*s' "
               "at line %d?",
               (int)near->data.scalar.length,
               (const char *)near->data.scalar.value, line_of(near));
    }
    return mep_error(MOE_EP_ERR_CONFIG,
                     "%s, line %d: no '" SECTION ":' section in the top-level "
                     "mapping%s; add 'moe_ep:' (an empty one gives all "
                     "defaults)",
                     c->source, line_of(root), hint);
  }
  *key_out = found;
  return *value_out != NULL
             ? MOE_EP_OK
             : mep_error(MOE_EP_ERR_INTERNAL, "%s: YAML node missing",
                         c->source);
}

static moe_ep_status_t read_document(yaml_ctx_t *c) {
  yaml_node_t *key = NULL, *value = NULL;
  MEP_CHECK(find_section(c, yaml_document_get_root_node(c->doc), &key, &value));
  if (is_null(value)) return MOE_EP_OK; /* "moe_ep:" alone: all defaults */
  if (value->type != YAML_MAPPING_NODE) {
    char got[64];
    describe(value, got, sizeof(got));
    return mep_error(MOE_EP_ERR_CONFIG,
                     "%s, line %d: '" SECTION "' is %s; it must be a mapping "
                     "of keys (backend, mode, num_experts, ...) or empty",
                     c->source, line_of(key), got);
  }
  return read_mapping(c, value, "");
}

/* libyaml's scanner costs O(depth) per token and its loader O(anchors) per
 * anchor and alias, so a deep or anchor-heavy input (1 MB of '[') takes
 * hours, and its loader keeps ~160 bytes per node of the whole document,
 * the engine's own keys included (16 MiB of "[a,a,...]" held 1.4 GB). One
 * event pass bounds all three before the loader runs; engine configs are
 * far inside these limits. */
#define MEP_YAML_MAX_DEPTH 64L
#define MEP_YAML_MAX_ANCHORS 1024L
#define MEP_YAML_MAX_ALIASES 65536L
#define MEP_YAML_MAX_NODES (1L << 18)

static moe_ep_status_t check_shape(const char *text, size_t len,
                                   const char *source) {
  yaml_parser_t p;
  if (!yaml_parser_initialize(&p)) {
    return mep_error(MOE_EP_ERR_NO_MEMORY, "%s: out of memory starting libyaml",
                     source);
  }
  yaml_parser_set_input_string(&p, (const unsigned char *)text, len);
  moe_ep_status_t st = MOE_EP_OK;
  long depth = 0, anchors = 0, aliases = 0, nodes = 0, documents = 0;
  /* In a document after the first: whether its root is a mapping, and how
   * many of the root's keys and values have started (even = a key next). */
  int root_is_map = 0;
  long root_items = 0;
  int later_section_line = 0;
  for (int done = 0; !done && st == MOE_EP_OK;) {
    yaml_event_t e;
    if (!yaml_parser_parse(&p, &e)) {
      st = parser_error(&p, text, len, source);
      break;
    }
    int line = (int)e.start_mark.line + 1;
    const unsigned char *anchor = NULL;
    if (documents > 1 && depth == 0) {
      root_is_map = e.type == YAML_MAPPING_START_EVENT;
      root_items = 0;
    } else if (documents > 1 && depth == 1 && root_is_map &&
               e.type != YAML_MAPPING_END_EVENT) {
      if (root_items++ % 2 == 0 && e.type == YAML_SCALAR_EVENT &&
          strcmp((const char *)e.data.scalar.value, SECTION) == 0) {
        later_section_line = line;
      }
    }
    switch (e.type) {
      case YAML_SEQUENCE_START_EVENT:
        anchor = e.data.sequence_start.anchor;
        depth++;
        nodes++;
        break;
      case YAML_MAPPING_START_EVENT:
        anchor = e.data.mapping_start.anchor;
        depth++;
        nodes++;
        break;
      case YAML_SEQUENCE_END_EVENT:
      case YAML_MAPPING_END_EVENT:
        depth--;
        break;
      case YAML_SCALAR_EVENT:
        anchor = e.data.scalar.anchor;
        nodes++;
        break;
      case YAML_ALIAS_EVENT:
        aliases++;
        break;
      case YAML_DOCUMENT_START_EVENT:
        documents++;
        break;
      case YAML_STREAM_END_EVENT:
        done = 1;
        break;
      default:
        break;
    }
    anchors += anchor != NULL;
    yaml_event_delete(&e);
    if (later_section_line != 0) {
      /* Only the first document is loaded (engine files hold one; later
       * ones are the engine's business), so a moe_ep section in a later
       * one, an override appended after '---' say, would be dropped
       * without a word. */
      st = mep_error(MOE_EP_ERR_CONFIG,
                     "%s, line %d: document %ld has a '" SECTION "' section; "
                     "moe-ep reads the first document only, so put its keys "
                     "there",
                     source, later_section_line, documents);
    } else {
      const struct {
        long count, max;
        const char *what;
      } limits[] = {
          {nodes, MEP_YAML_MAX_NODES, "nodes"},
          {depth, MEP_YAML_MAX_DEPTH, "levels of nesting"},
          {anchors, MEP_YAML_MAX_ANCHORS, "anchors"},
          {aliases, MEP_YAML_MAX_ALIASES, "aliases"},
      };
      for (size_t i = 0; i < sizeof(limits) / sizeof(limits[0]); i++) {
        if (limits[i].count <= limits[i].max) continue;
        st = mep_error(MOE_EP_ERR_CONFIG,
                       "%s, line %d: YAML has more than %ld %s; a config "
                       "needs a few hundred nodes, a handful of the others",
                       source, line, limits[i].max, limits[i].what);
        break;
      }
    }
  }
  yaml_parser_delete(&p);
  return st;
}

moe_ep_status_t mep_config_read_yaml_text(const char *text, size_t len,
                                          const char *source,
                                          moe_ep_config_t *cfg,
                                          mep_config_origin_t *origin) {
  yaml_parser_t parser;
  yaml_document_t doc;
  MEP_CHECK(check_shape(text, len, source));
  if (!yaml_parser_initialize(&parser)) {
    return mep_error(MOE_EP_ERR_NO_MEMORY, "%s: out of memory starting libyaml",
                     source);
  }
  yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
  moe_ep_status_t st = MOE_EP_OK;
  /* Only the first document is read: engine config files hold one. */
  if (!yaml_parser_load(&parser, &doc)) {
    st = parser_error(&parser, text, len, source);
    goto out_parser;
  }
  yaml_ctx_t c = {&doc, source, cfg, origin};
  st = read_document(&c);
  yaml_document_delete(&doc);
out_parser:
  yaml_parser_delete(&parser);
  return st;
}
