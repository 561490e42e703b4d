/* kernels_types.h: the plain values kernels/ shares with its callers, so
 * kernels/ needs nothing from the public ABI: the launchers' status and the
 * fp8 scale formats. runtime/nccl maps the status to moe_ep's and checks at
 * compile time that the scale formats keep moe_ep_fp8_scale_t's numbers. */
#ifndef MEP_KERNELS_TYPES_H_
#define MEP_KERNELS_TYPES_H_

typedef enum mep_kstatus {
  MEP_KSTATUS_OK = 0,
  MEP_KSTATUS_INVALID_ARGUMENT = 1, /* an argument broke a launcher rule */
  MEP_KSTATUS_CUDA = 2              /* the CUDA runtime refused or failed */
} mep_kstatus_t;

/* How an fp8 dispatch's rows are scaled: each 128-channel group (0-2,
 * moe_ep_fp8_scale_t's numbers), or each row by one f32 (3: pre-quantised
 * HT rows only, MOE_EP_FORMAT_FP8_PER_TOKEN; no group configures it). */
enum {
  MEP_FP8_SCALE_F32 = 0,          /* amax / 448 as f32 */
  MEP_FP8_SCALE_UE8M0 = 1,        /* rounded up to a power of two, f32 storage */
  MEP_FP8_SCALE_UE8M0_PACKED = 2, /* the same exponents, four per int32 */
  MEP_FP8_SCALE_PER_TOKEN = 3     /* one f32 per row, carried as sent */
};

#endif /* MEP_KERNELS_TYPES_H_ */
