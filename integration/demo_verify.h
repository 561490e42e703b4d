/* demo_verify.h: the demo's optional check of each combine against the
 * reference oracle (tests/oracle), behind a C interface. */
#ifndef MOE_EP_DEMO_VERIFY_H_
#define MOE_EP_DEMO_VERIFY_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The demo's expert: y = bf16(x * gain(e)), the oracle's expert function. */
void demo_expert_row(int global_expert, const float *x, int hidden, uint16_t *y);
/* Dequantized values of a received LL row (fp8 + f32 scales, or bf16). */
void demo_received_row(const void *row, const float *scales, int hidden, int fp8,
                       float *out);
/* 1 if `out` [T, H] matches what the oracle expects for this rank's tokens,
 * else 0 with a sentence in why. */
int demo_verify_combine(int world, int num_experts, int hidden, int top_k,
                        int max_tokens, int fp8, int num_tokens, const uint16_t *x,
                        const int64_t *topk_idx, const float *weights,
                        const uint16_t *out, char *why, int why_len);

#ifdef __cplusplus
}
#endif

#endif /* MOE_EP_DEMO_VERIFY_H_ */
