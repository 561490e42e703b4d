/* op.h: the runtime's internal view of a routing handle and of one
 * dispatch/combine operation (what a backend's send/recv halves receive).
 * Everything the receive half needs is copied here, because a deferred
 * receive runs after the caller's parameter structs are gone. */
#ifndef MEP_OP_H_
#define MEP_OP_H_

#include <stdint.h>

#include "moe_ep.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct moe_ep_handle mep_handle_state_t;

/* A free asked for from inside an entry (the engine's logger, or a garbage
 * collector running in it), which must not wait for a lock there. The
 * object is taken out of the registry at once (gone to every other call)
 * and queued on its group through this link, so queueing cannot fail; the
 * next holder of that group's lock finishes it (group.c, mep_group_free). */
typedef struct mep_deferred_free {
  void *obj; /* the object holding this link */
  void (*then)(struct moe_ep_group *group, void *obj);
  void (*release)(void *obj);
  struct mep_deferred_free *next;
} mep_deferred_free_t;

/* The routing layout of one layer call (public type moe_ep_handle_t). */
/* A handle's dispatch state (moe_ep_handle.dispatched). */
enum {
  MEP_UNDISPATCHED = 0,
  MEP_DISPATCH_PENDING = 1,   /* its receive is in a hook not run yet */
  MEP_DISPATCHED = 2,         /* received: combine may follow */
  MEP_DISPATCH_ABANDONED = 3  /* its hook was freed unrun, or its receive failed */
};
/* What a refusal says of a handle not in MEP_DISPATCHED ("has ..."). */
static inline const char *mep_dispatch_state_text(int32_t state) {
  switch (state) {
    case MEP_UNDISPATCHED: return "not been dispatched";
    case MEP_DISPATCH_PENDING: return "a dispatch whose hook has not run yet";
    default:
      return "a dispatch whose receive was abandoned (its hook was freed before it ran, or "
             "its receive failed)";
  }
}

struct moe_ep_handle {
  int32_t num_tokens;
  int32_t top_k;
  /* topk_idx as the caller gave it; host backend also keeps an int64 copy. */
  const void *topk_idx;
  int32_t topk_idx_bits; /* 32 or 64 */
  int64_t *topk_host;    /* [T*K] int64 copy (host backend), owned */
  int32_t dispatched;    /* MEP_UNDISPATCHED ... (combine needs MEP_DISPATCHED) */
  int32_t dispatch_hidden;
  /* LL: dispatch was given topk_weights (weighted = 1; its data, NULL when
   * T = 0). The weights then travel with the tokens and combine applies
   * them on the expert side; the tensor must stay unchanged until the
   * combine on this handle completes. */
  int32_t weighted;
  const float *dispatch_weights;
  int64_t num_recv;      /* HT: rows received by dispatch (-1: not known on the host) */
  /* HT host: which of the group's count exchanges this handle's prepare
   * joined (1, 2, ...). Every rank makes the exchanges in the same order,
   * so matched prepares carry the same number on every rank; a dispatch
   * sends it, and a receiver refuses rows of another layer call. */
  uint64_t prepare_no;
  /* HT nccl: recv_x's rows in the latest worst-case dispatch, whose N_recv
   * stays on the device; combine's y then needs that many */
  int64_t worst_rows;
  int32_t worst_case;    /* HT: the latest dispatch had MOE_EP_FLAG_WORST_CASE
                            (combine then takes y with N_recv rows or more) */
  void *backend;         /* backend's per-handle state (slot sources); one
                            malloc block, freed with the handle */
  /* prepare's optional outputs, valid during prepare only (NULL = skip) */
  int32_t *out_tokens_per_rank;   /* [R] */
  int32_t *out_tokens_per_expert; /* [E] */
  uint8_t *out_is_token_in_rank;  /* [T, R] */
  void *prepare_stream;           /* params->stream (nccl computes them there) */
  mep_deferred_free_t deferred; /* handle_free from inside an entry */
};

typedef enum mep_op_kind { MEP_OP_DISPATCH = 0, MEP_OP_COMBINE = 1 } mep_op_kind_t;

typedef struct mep_op {
  mep_op_kind_t kind;
  int32_t mode;        /* moe_ep_mode_t of the group */
  int32_t buffer_set;  /* 0 .. MEP_NUM_BUFFER_SETS-1 */
  uint32_t flags;
  int32_t hidden;
  uint64_t seq;        /* per-group operation counter (epoch for signals) */
  /* dispatch: this call's row format, resolved from params->format (LL)
   * or from x's dtype (HT, where fp8 rows come pre-quantised) */
  int32_t fp8;          /* 0: bf16 rows; 1: fp8 e4m3 + scales */
  int32_t scale_format; /* fp8 only: MEP_FP8_SCALE_*, moe_ep_fp8_scale_t's
                           values or MEP_FP8_SCALE_PER_TOKEN (HT) */
  mep_handle_state_t *handle;
  void *stream;
  /* dispatch */
  const void *x;              /* [T, H] bf16; HT fp8: e4m3 */
  const void *x_scales;       /* HT fp8: [T, scale columns] f32 or int32 */
  void *recv_x;               /* LL [E_l, R*M, H]; HT [cap, H] */
  void *recv_scales;          /* fp8 only: LL [E_l, R*M, cols]; HT [cap, cols] */
  int32_t *recv_count;        /* LL [E_l]; HT per-local-expert counts */
  const float *topk_weights;  /* HT dispatch input; LL dispatch (optional)
                                 and combine input */
  int32_t weighted;           /* LL dispatch: topk_weights was given */
  int32_t *recv_topk_idx;     /* HT [cap, K] */
  float *recv_topk_weights;   /* HT [cap, K] */
  int64_t *num_recv_tokens;   /* HT host out; NULL allowed with WORST_CASE */
  int64_t recv_capacity;      /* HT rows recv_x can hold */
  /* combine */
  const void *y;              /* LL [E_l, R*M, H]; HT [N_recv, H] */
  void *out;                  /* [T, H] bf16 */
} mep_op_t;

/* The scale format of a dispatch's fp8 rows (moe_ep_fp8_scale_t), as both
 * backends quantise and describe them: MOE_EP_FLAG_ROUND_SCALE makes LL's
 * f32 scales powers of two, which are MOE_EP_FP8_SCALE_UE8M0's rows; HT
 * never quantises and ignores it (moe_ep.h). */
static inline int32_t mep_op_scale_format(const mep_op_t *op) {
  if (op->scale_format == MOE_EP_FP8_SCALE_F32 && (op->flags & MOE_EP_FLAG_ROUND_SCALE) &&
      op->mode == MOE_EP_MODE_LOW_LATENCY) {
    return MOE_EP_FP8_SCALE_UE8M0;
  }
  return op->scale_format;
}

#ifdef __cplusplus
}
#endif

#endif /* MEP_OP_H_ */
