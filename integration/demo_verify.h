/* demo_verify.h: the demo engine's expert stand-in and its check of each
 * combine, in its own small reference arithmetic (the plugin's documented
 * formats; no test code). */
#ifndef MOE_EP_DEMO_VERIFY_H_
#define MOE_EP_DEMO_VERIFY_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The demo's expert: y = bf16(x * (1 + 0.01 * e)) in f32. */
void demo_expert_row(int global_expert, const float *x, int hidden, uint16_t *y);
/* Values of a received LL row (fp8 e4m3 times its f32 scales, or bf16). */
void demo_received_row(const void *row, const float *scales, int hidden, int fp8,
                       float *out);
/* What a receiver sees of the bf16 row x: bf16 as is, or (fp8) e4m3 with
 * one f32 scale per 128 channels (amax / 448), dequantized. */
void demo_transported_row(const uint16_t *x, int hidden, int fp8, float *out);
/* 1 if `out` [T, H] is what combine returns for this rank's tokens when
 * every rank runs demo_expert_row on what it received (experts placed
 * local_experts per rank), else 0 with a sentence in why (rank, first bad
 * index, expected, got). */
int demo_verify_combine(int rank, int hidden, int top_k, int local_experts, int fp8,
                        int num_tokens, const uint16_t *x, const int64_t *topk_idx,
                        const float *weights, const uint16_t *out, char *why, int why_len);

#ifdef __cplusplus
}
#endif

#endif /* MOE_EP_DEMO_VERIFY_H_ */
