// expert.h: the tests' stand-in for an expert MLP, plus the transport of a row
// through dispatch (bf16 exact, or fp8 quantize+dequantize). Tests apply these
// same functions to the rows the plugin actually delivered.
#ifndef MOE_EP_TESTS_ORACLE_EXPERT_H_
#define MOE_EP_TESTS_ORACLE_EXPERT_H_

#include <cstdint>

#include "tests/oracle/problem.h"

namespace moe_ep_oracle {

// Expert e's gain: 1.0f + 0.01f * (float)e, in float. Distinct per expert, so
// a row combined with the wrong expert's output shows up.
float expert_gain(int global_expert);

// y[i] = bf16(x[i] * expert_gain(e)) for i < hidden (float multiply, then RNE).
void expert_fn_row(int global_expert, const float* x, int hidden, uint16_t* y);

// The float values a destination sees for source row x (bf16 bits) under
// p.dispatch_dtype: bf16 -> exact; fp8 -> dequantize(quantize(x)) with
// p.scale_format.
void transported_row(const Problem& p, const uint16_t* x, float* out);

// One HT partial row on `rank` (its local experts), x as the rank received
// it (transported_row: bf16 exact, or the pre-quantised fp8 row
// dequantised):
//   y = bf16( sum over k ascending with idx[k] != -1 of
//             w[k] * bf16_to_float(expert_fn(rank * L + idx[k], x)) )
// with float accumulation from 0.0f. idx are local ids (int32), K = p.top_k.
void ht_partial_row(const Problem& p, int rank, const uint16_t* x, const int32_t* idx,
                    const float* w, uint16_t* y);

}  // namespace moe_ep_oracle

#endif  // MOE_EP_TESTS_ORACLE_EXPERT_H_
