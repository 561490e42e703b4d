/* validate.c: tensor descriptor checks (see validate.h). */
#include "runtime/validate.h"

#include <stdio.h>
#include <string.h>

#include "runtime/error.h"

static const struct {
  const char *name;
  uint8_t code, bits;
} dtypes[MEP_DT_COUNT_] = {
    [MEP_DT_BF16] = {"bf16", MOE_EP_DTYPE_BFLOAT, 16},
    [MEP_DT_FP8] = {"fp8_e4m3fn", MOE_EP_DTYPE_FLOAT8_E4M3FN, 8},
    [MEP_DT_F32] = {"float32", MOE_EP_DTYPE_FLOAT, 32},
    [MEP_DT_I32] = {"int32", MOE_EP_DTYPE_INT, 32},
    [MEP_DT_I64] = {"int64", MOE_EP_DTYPE_INT, 64},
    [MEP_DT_U8] = {"uint8", MOE_EP_DTYPE_UINT, 8},
};

const char *mep_dtype_name(mep_dtype_t dt) {
  return (dt >= 0 && dt < MEP_DT_COUNT_) ? dtypes[dt].name : "unknown";
}

/* The DLPack name of a dtype no rule takes (float16, int8, float8_e5m2,
 * bfloat16x2, ...), so that a refusal says what the caller passed and not
 * only its codes. Families that carry their width in the code (the 8-, 6- and
 * 4-bit floats) are named without the bits. */
static void dlpack_name(const moe_ep_data_type_t *dt, char *buf, size_t cap) {
  static const char *const sized[] = {[0] = "int", [1] = "uint", [2] = "float",
                                      [4] = "bfloat", [5] = "complex"};
  static const char *const named[] = {
      [3] = "opaque_handle", [6] = "bool",           [7] = "float8_e3m4",         [8] = "float8_e4m3",
      [9] = "float8_e4m3b11fnuz", [10] = "float8_e4m3fn",  [11] = "float8_e4m3fnuz",
      [12] = "float8_e5m2",   [13] = "float8_e5m2fnuz",    [14] = "float8_e8m0fnu",
      [15] = "float6_e2m3fn", [16] = "float6_e3m2fn",      [17] = "float4_e2m1fn"};
  int n;
  if (dt->code < sizeof(sized) / sizeof(sized[0]) && sized[dt->code] != NULL) {
    n = snprintf(buf, cap, "%s%u", sized[dt->code], dt->bits);
  } else if (dt->code < sizeof(named) / sizeof(named[0]) && named[dt->code] != NULL) {
    n = snprintf(buf, cap, "%s", named[dt->code]);
  } else {
    n = snprintf(buf, cap, "a type DLPack does not define");
    return;
  }
  if (dt->lanes != 1 && n >= 0 && (size_t)n < cap) {
    snprintf(buf + n, cap - (size_t)n, "x%u", dt->lanes);
  }
}

int mep_dtype_bytes(mep_dtype_t dt) {
  return (dt >= 0 && dt < MEP_DT_COUNT_) ? dtypes[dt].bits / 8 : 0;
}

int mep_dtype_of(const moe_ep_data_type_t *dt) {
  if (dt->lanes != 1) return -1;
  for (int i = 0; i < MEP_DT_COUNT_; i++) {
    if (dtypes[i].code == dt->code && dtypes[i].bits == dt->bits) return i;
  }
  return -1;
}

static void mask_names(uint32_t mask, char *buf, size_t cap) {
  buf[0] = '\0';
  size_t n = 0;
  for (int i = 0; i < MEP_DT_COUNT_; i++) {
    if (mask & (1u << i)) {
      n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, "%s%s",
                            n ? " or " : "", dtypes[i].name);
    }
  }
}

static void shape_text(const int64_t *shape, int ndim, char *buf, size_t cap) {
  size_t n = (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < ndim && n < cap; i++) {
    if (shape[i] < 0) {
      n += (size_t)snprintf(buf + n, cap - n, "%s*", i ? ", " : "");
    } else {
      n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "",
                            (long long)shape[i]);
    }
  }
  if (n < cap) snprintf(buf + n, cap - n, "]");
}

moe_ep_status_t mep_tensor_check(const moe_ep_tensor_t *t,
                                 const mep_tensor_rule_t *r, void **data,
                                 int *dtype) {
  char want[96], got[96];
  if (t == NULL) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT, "%s: %s is NULL", r->entry,
                     r->name);
  }
  int dev = t->device.device_type;
  const int want_type = MEP_DEVICE_TYPE(r->device), want_id = MEP_DEVICE_ID(r->device);
  int dev_ok = dev == want_type ||
               (want_type == MOE_EP_DEVICE_CPU && dev == MOE_EP_DEVICE_CUDA_HOST);
  if (!dev_ok) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "%s: %s has device_type=%d but this backend needs %s "
                     "memory (device_type=%d)",
                     r->entry, r->name, dev,
                     want_type == MOE_EP_DEVICE_CPU ? "host" : "CUDA device", want_type);
  }
  if (want_type == MOE_EP_DEVICE_CUDA && want_id >= 0 && t->device.device_id != want_id) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "%s: %s has device_id=%d but the group runs on CUDA device %d; "
                     "tensors must live on the group's GPU",
                     r->entry, r->name, (int)t->device.device_id, want_id);
  }
  int dt = mep_dtype_of(&t->dtype);
  if (dt < 0 || !(r->dtype_mask & (1u << dt))) {
    mask_names(r->dtype_mask, want, sizeof(want));
    if (dt < 0) {
      dlpack_name(&t->dtype, got, sizeof(got));
    } else {
      snprintf(got, sizeof(got), "%s", mep_dtype_name(dt));
    }
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "%s: %s has dtype (code=%u, bits=%u, lanes=%u) = %s; it "
                     "must be %s",
                     r->entry, r->name, t->dtype.code, t->dtype.bits,
                     t->dtype.lanes, got, want);
  }
  if (t->ndim != r->ndim || t->shape == NULL) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "%s: %s has ndim=%d%s; it must have %d dimensions",
                     r->entry, r->name, t->ndim,
                     t->shape == NULL ? " and no shape" : "", r->ndim);
  }
  /* A dimension the rule leaves open (-1) is the caller's number: its
   * product with the others must not wrap (a wrapped count could pass a NULL
   * buffer as empty). An empty tensor has a zero dimension. */
  int64_t bytes = mep_dtype_bytes(dt);
  int empty = 0, too_big = 0;
  for (int i = 0; i < r->ndim; i++) {
    if (t->shape[i] < 0 || (r->shape[i] >= 0 && t->shape[i] != r->shape[i])) {
      shape_text(r->shape, r->ndim, want, sizeof(want));
      shape_text(t->shape, t->ndim, got, sizeof(got));
      return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                       "%s: %s has shape %s; it must be %s", r->entry, r->name,
                       got, want);
    }
    if (t->shape[i] == 0) empty = 1;
    too_big |= __builtin_mul_overflow(bytes, t->shape[i], &bytes);
  }
  if (too_big && !empty) {
    shape_text(t->shape, t->ndim, got, sizeof(got));
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "%s: %s has shape %s, whose size in bytes does not fit in 63 bits",
                     r->entry, r->name, got);
  }
  if (t->strides != NULL && !empty) {
    int64_t expect = 1;
    for (int i = r->ndim - 1; i >= 0; i--) {
      if (t->shape[i] > 1 && t->strides[i] != expect) {
        return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                         "%s: %s is not contiguous (stride[%d]=%lld, row-major "
                         "needs %lld)",
                         r->entry, r->name, i, (long long)t->strides[i],
                         (long long)expect);
      }
      expect *= t->shape[i];
    }
  }
  char *p = (char *)t->data;
  if (p == NULL) {
    if (empty && r->allow_null_data) {
      *data = NULL;
      *dtype = dt;
      return MOE_EP_OK;
    }
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT, "%s: %s->data is NULL",
                     r->entry, r->name);
  }
  /* Past the shape and stride checks the tensor spans `bytes` from
   * data + byte_offset (nothing when empty: it is never read): a span that
   * wraps the address space is no memory at all, and pointer overflow is
   * undefined in C. */
  uintptr_t room = UINTPTR_MAX - (uintptr_t)p;
  if (t->byte_offset > room || (!empty && (uint64_t)bytes > room - t->byte_offset)) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "%s: %s data %p + byte_offset %llu + %lld bytes wraps the "
                     "address space",
                     r->entry, r->name, t->data, (unsigned long long)t->byte_offset,
                     (long long)(empty ? 0 : bytes));
  }
  p += t->byte_offset;
  /* 16-byte rows let the kernels move whole vectors; small index/count
   * arrays only need their element alignment. */
  uintptr_t align = (dt == MEP_DT_BF16 || dt == MEP_DT_FP8) ? 16
                                                           : (uintptr_t)mep_dtype_bytes(dt);
  if (((uintptr_t)p & (align - 1)) != 0) {
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "%s: %s data %p (byte_offset %llu) is not %u-byte "
                     "aligned",
                     r->entry, r->name, t->data,
                     (unsigned long long)t->byte_offset, (unsigned)align);
  }
  *data = p;
  *dtype = dt;
  return MOE_EP_OK;
}

/* [first, last] bytes of a tensor that passed mep_tensor_check; 0 when it
 * has no bytes. */
static int tensor_bytes(const moe_ep_tensor_t *t, uintptr_t *first, uintptr_t *last) {
  if (t == NULL || t->data == NULL) return 0;
  uint64_t bytes = (uint64_t)mep_dtype_bytes(mep_dtype_of(&t->dtype));
  for (int i = 0; i < t->ndim; i++) bytes *= (uint64_t)t->shape[i];
  if (bytes == 0) return 0;
  *first = (uintptr_t)t->data + (uintptr_t)t->byte_offset;
  *last = *first + (uintptr_t)(bytes - 1);
  return 1;
}

moe_ep_status_t mep_tensors_disjoint(const char *entry, const mep_named_tensor_t *ts, int n) {
  for (int i = 0; i < n; i++) {
    uintptr_t a0, a1;
    if (!tensor_bytes(ts[i].t, &a0, &a1)) continue;
    for (int j = i + 1; j < n; j++) {
      uintptr_t b0, b1;
      if (!(ts[i].written || ts[j].written) || !tensor_bytes(ts[j].t, &b0, &b1)) continue;
      if (a1 < b0 || b1 < a0) continue;
      const mep_named_tensor_t *w = ts[i].written ? &ts[i] : &ts[j];
      const mep_named_tensor_t *o = w == &ts[i] ? &ts[j] : &ts[i];
      return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                       "%s: %s (bytes %#llx..%#llx) and %s (bytes %#llx..%#llx) share memory; "
                       "the call writes %s while it %s %s, in no fixed order: give %s memory "
                       "of its own",
                       entry, ts[i].name, (unsigned long long)a0, (unsigned long long)a1,
                       ts[j].name, (unsigned long long)b0, (unsigned long long)b1, w->name,
                       o->written ? "writes" : "reads", o->name, w->name);
    }
  }
  return MOE_EP_OK;
}
