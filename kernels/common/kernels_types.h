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

/* How an fp8 dispatch scales each 128-channel group. */
enum {
  MEP_FP8_SCALE_F32 = 0,          /* amax / 448 as f32 */
  MEP_FP8_SCALE_UE8M0 = 1,        /* rounded up to a power of two, f32 storage */
  MEP_FP8_SCALE_UE8M0_PACKED = 2  /* the same exponents, four per int32 */
};

#endif /* MEP_KERNELS_TYPES_H_ */
