// oracle.h: the reference oracle for moe-ep conformance tests, in one include.
// Independent of runtime/ and kernels/: plain loops over plain types.
// Regenerate every rank's inputs from (Problem, seed), then ask for any rank's
// expected prepare / LL / HT outputs; compare with compare.h.
#ifndef MOE_EP_TESTS_ORACLE_ORACLE_H_
#define MOE_EP_TESTS_ORACLE_ORACLE_H_

#include "tests/oracle/bf16.h"     // float_to_bf16, bf16_to_float
#include "tests/oracle/compare.h"  // compare_*
#include "tests/oracle/expert.h"   // expert_fn_row, transported_row, ht_partial_row
#include "tests/oracle/fp8.h"      // float_to_e4m3, e4m3_to_float
#include "tests/oracle/ht.h"       // ht_dispatch_expected, ht_combine_*
#include "tests/oracle/inputs.h"   // RankInputs, make_inputs, make_all_inputs
#include "tests/oracle/ll.h"       // ll_dispatch_expected, ll_combine_*
#include "tests/oracle/prepare.h"  // prepare_expected
#include "tests/oracle/problem.h"  // Problem, Generator, DispatchDtype, ScaleFormat
#include "tests/oracle/quant.h"    // quantize_row, scales, UE8M0 packing

#endif  // MOE_EP_TESTS_ORACLE_ORACLE_H_
