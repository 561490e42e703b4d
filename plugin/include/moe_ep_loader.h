/* moe_ep_loader.h: header-only helper an engine uses to load libmoe_ep.so.
 *
 *   const moe_ep_plugin_v1_t *ep;
 *   char err[512];
 *   void *lib = moe_ep_load("/path/libmoe_ep.so", &ep, err, sizeof err);
 *   if (lib == NULL) { report(err); }
 *   ...
 *   moe_ep_unload(lib);
 *
 * It dlopens the file, looks up the one table symbol (moe_ep_plugin_v1),
 * checks that the table's struct_size holds abi_version before reading it,
 * then abi_version, then that struct_size reaches handle_free and that no
 * entry up to there is NULL, so a too-old or foreign library is refused with
 * a sentence instead of a crash. Link the engine with -ldl on older glibc. */
#ifndef MOE_EP_LOADER_H_
#define MOE_EP_LOADER_H_

#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "moe_ep.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The smallest v1 table this header can use: everything up to handle_free
 * (0.2). Entries appended later are optional: MOE_EP_HAS_ENTRY says whether
 * the loaded library has one. */
#define MOE_EP_LOADER_MIN_V1_SIZE \
  (offsetof(moe_ep_plugin_v1_t, handle_free) + sizeof(void (*)(void)))

/* Whether `table` (of the size it reports) has the entry `field` set;
 * use before calling entries appended after v1's first release. */
#define MOE_EP_HAS_ENTRY(table, field)                                   \
  ((table)->struct_size >= offsetof(moe_ep_plugin_v1_t, field) +       \
                               sizeof((table)->field) &&               \
   (table)->field != NULL)

/* handle_layout (0.3) through a table of any size: a library older than
 * the entry (its table ends at handle_free) is still loaded, and this
 * returns MOE_EP_ERR_UNSUPPORTED for it without calling into the library
 * (its last_error then says nothing about this call). */
static inline moe_ep_status_t moe_ep_call_handle_layout(
    const moe_ep_plugin_v1_t *table, moe_ep_handle_t *handle,
    const moe_ep_handle_layout_params_t *params) {
  if (table == NULL || !MOE_EP_HAS_ENTRY(table, handle_layout)) {
    return MOE_EP_ERR_UNSUPPORTED;
  }
  return table->handle_layout(handle, params);
}

/* group_busy_hook (0.4) through a table of any size: MOE_EP_ERR_UNSUPPORTED
 * (and *hook NULL) for a library whose table predates the entry. */
static inline moe_ep_status_t moe_ep_call_group_busy_hook(const moe_ep_plugin_v1_t *table,
                                                          moe_ep_group_t *group,
                                                          moe_ep_hook_t **hook) {
  if (table == NULL || !MOE_EP_HAS_ENTRY(table, group_busy_hook)) {
    if (hook != NULL) *hook = NULL;
    return MOE_EP_ERR_UNSUPPORTED;
  }
  return table->group_busy_hook(group, hook);
}

/* The entries every v1 table has (get_version .. handle_free), in order. */
static const char *const moe_ep_load_required_names_[] = {
    "get_version",      "last_error", "status_string", "set_logger",   "config_from_yaml",
    "config_free",      "buffer_size_hint", "group_create", "group_destroy", "group_info",
    "group_poll_error", "set_num_sms", "max_sms_used", "prepare",      "dispatch",
    "combine",          "hook_run",   "hook_free",     "handle_free"};
#define MOE_EP_LOADER_REQUIRED_ \
  (sizeof(moe_ep_load_required_names_) / sizeof(moe_ep_load_required_names_[0]))

/* The index of the first required entry that is NULL, or
 * MOE_EP_LOADER_REQUIRED_ when all are set. The entries are function
 * pointers laid out one after another from get_version. */
static inline size_t moe_ep_load_first_null_(const moe_ep_plugin_v1_t *t) {
  typedef char moe_ep_loader_names_match_[
      (offsetof(moe_ep_plugin_v1_t, handle_free) - offsetof(moe_ep_plugin_v1_t, get_version)) /
                  sizeof(void (*)(void)) + 1 ==
              MOE_EP_LOADER_REQUIRED_
          ? 1
          : -1];
  const char *base = (const char *)t + offsetof(moe_ep_plugin_v1_t, get_version);
  size_t i;
  (void)sizeof(moe_ep_loader_names_match_);
  for (i = 0; i < MOE_EP_LOADER_REQUIRED_; i++) {
    void (*fn)(void);
    memcpy(&fn, base + i * sizeof(fn), sizeof(fn));
    if (fn == NULL) return i;
  }
  return i;
}

/* moe_ep_load's refusal: the sentence into err (if err_len > 0), the
 * library closed; returns NULL. */
static inline void *moe_ep_load_refuse_(void *lib, char *err, size_t err_len, const char *fmt,
                                        ...) {
  va_list ap;
  if (err_len > 0) {
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
  }
  dlclose(lib);
  return NULL;
}

/* Returns the dlopen handle (pass to moe_ep_unload) and sets *table, or
 * returns NULL with a sentence in err (if err_len > 0). */
static inline void *moe_ep_load(const char *path,
                                const moe_ep_plugin_v1_t **table, char *err,
                                size_t err_len) {
  static const char *const symbols[] = {MOE_EP_PLUGIN_V1_SYMBOL};
  void *lib;
  const moe_ep_plugin_v1_t *found = NULL;
  size_t i;

  if (table != NULL) *table = NULL;
  if (path == NULL || table == NULL) {
    if (err_len > 0)
      snprintf(err, err_len, "moe_ep_load: path and table must be non-NULL");
    return NULL;
  }
  lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    const char *why = dlerror();
    if (err_len > 0)
      snprintf(err, err_len, "moe_ep_load: cannot open '%s': %s", path,
               why ? why : "unknown dlopen error");
    return NULL;
  }
  for (i = 0; i < sizeof(symbols) / sizeof(symbols[0]) && found == NULL; i++) {
    found = (const moe_ep_plugin_v1_t *)dlsym(lib, symbols[i]);
  }
  if (found == NULL) {
    return moe_ep_load_refuse_(lib, err, err_len,
                               "moe_ep_load: '%s' exports no moe_ep_plugin_v1 table (not a "
                               "moe_ep library, or one older than ABI v1)",
                               path);
  }
  /* struct_size first: a table too short to hold abi_version must not
   * have it read (that would be past the exported object). */
  if (found->struct_size <
      offsetof(moe_ep_plugin_v1_t, abi_version) + sizeof(found->abi_version)) {
    return moe_ep_load_refuse_(lib, err, err_len,
                               "moe_ep_load: '%s' table moe_ep_plugin_v1 is %zu bytes, too "
                               "short to hold abi_version; this engine needs at least %zu",
                               path, found->struct_size, (size_t)MOE_EP_LOADER_MIN_V1_SIZE);
  }
  if (found->abi_version != MOE_EP_ABI_VERSION) {
    return moe_ep_load_refuse_(lib, err, err_len,
                               "moe_ep_load: '%s' table moe_ep_plugin_v1 reports abi_version "
                               "%u, this engine was built for %u",
                               path, found->abi_version, MOE_EP_ABI_VERSION);
  }
  if (found->struct_size < MOE_EP_LOADER_MIN_V1_SIZE) {
    return moe_ep_load_refuse_(lib, err, err_len,
                               "moe_ep_load: '%s' table moe_ep_plugin_v1 is %zu bytes, too old: "
                               "this engine needs at least %zu",
                               path, found->struct_size, (size_t)MOE_EP_LOADER_MIN_V1_SIZE);
  }
  i = moe_ep_load_first_null_(found);
  if (i < MOE_EP_LOADER_REQUIRED_) {
    return moe_ep_load_refuse_(lib, err, err_len,
                               "moe_ep_load: '%s' table moe_ep_plugin_v1 has no '%s' entry "
                               "(NULL); every entry up to handle_free is required",
                               path, moe_ep_load_required_names_[i]);
  }
  *table = found;
  return lib;
}

/* dlclose. Once the library has progressed a UCX worker (its UCX log
 * handler) or seen a call captured in a CUDA graph (CUDA's release of the
 * graph calls into it), it stays mapped for the life of the process: those
 * callers outlive any unload. */
static inline void moe_ep_unload(void *lib) {
  if (lib != NULL) dlclose(lib);
}

#ifdef __cplusplus
}
#endif

#endif /* MOE_EP_LOADER_H_ */
