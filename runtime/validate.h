/* validate.h: tensor descriptor checks shared by every entry and backend:
 * device, dtype, rank, shape, contiguity, alignment. Each failure names the
 * entry, the argument, the value and the rule. */
#ifndef MEP_VALIDATE_H_
#define MEP_VALIDATE_H_

#include <stddef.h>
#include <stdint.h>

#include "moe_ep.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Dtype selectors (the descriptor's (code, bits)). */
typedef enum mep_dtype {
  MEP_DT_BF16 = 0,
  MEP_DT_FP8 = 1,
  MEP_DT_F32 = 2,
  MEP_DT_I32 = 3,
  MEP_DT_I64 = 4,
  MEP_DT_U8 = 5,
  MEP_DT_COUNT_ = 6
} mep_dtype_t;

#define MEP_BIT(dt) (1u << (dt))

/* Whether a caller's params struct (of its struct_size) holds `field`:
 * fields appended after an engine was built are absent, never read. */
#define MEP_HAS_FIELD(p, field) \
  ((p)->struct_size >= offsetof(__typeof__(*(p)), field) + sizeof((p)->field))


const char *mep_dtype_name(mep_dtype_t dt);
int mep_dtype_bytes(mep_dtype_t dt);
/* Returns the mep_dtype_t of a descriptor, or -1 if it is none of them. */
int mep_dtype_of(const moe_ep_data_type_t *dt);

/* A rule's device: DLPack device type plus, for CUDA, the required device
 * id (-1: any), in one int so rule initialisers stay positional. */
#define MEP_DEVICE(type, id) ((int)(type) | (((int)(id) + 1) << 8))
#define MEP_DEVICE_TYPE(d) ((d) & 0xff)
#define MEP_DEVICE_ID(d) (((d) >> 8) - 1)

typedef struct mep_tensor_rule {
  const char *entry;    /* "dispatch" */
  const char *name;     /* "params->recv_x" */
  int device;           /* MEP_DEVICE(type, id): MOE_EP_DEVICE_CPU (also accepts
                           CUDA_HOST) or _CUDA, and for CUDA the device id the
                           tensor must live on (-1: any) */
  uint32_t dtype_mask;  /* bit per mep_dtype_t allowed */
  int ndim;
  int64_t shape[3];     /* -1 = any */
  int allow_null_data;  /* when the tensor has zero elements */
} mep_tensor_rule_t;

/* Checks `t` against the rule; on success *data is the element pointer
 * (data + byte_offset) and *dtype its mep_dtype_t. */
moe_ep_status_t mep_tensor_check(const moe_ep_tensor_t *t,
                                 const mep_tensor_rule_t *rule, void **data,
                                 int *dtype);

/* One of a call's tensors, for mep_tensors_disjoint: its name in the
 * call's params, and whether the call writes it. */
typedef struct mep_named_tensor {
  const char *name; /* "params->recv_x" */
  const moe_ep_tensor_t *t;
  int written;
} mep_named_tensor_t;

/* Refuses a call whose written tensor shares memory with another of its
 * tensors: the kernels read and write a call's tensors at once, in no
 * fixed order, so a shared byte would end up as neither value. Every
 * tensor passed mep_tensor_check (compact, its dtype known); NULL and
 * empty ones are skipped. */
moe_ep_status_t mep_tensors_disjoint(const char *entry, const mep_named_tensor_t *ts, int n);

#ifdef __cplusplus
}
#endif

#endif /* MEP_VALIDATE_H_ */
