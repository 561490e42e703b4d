// scale_mode.h: the kernels' fp8 scale mode (MEP_FP8_SCALE_*) for the
// oracle's scale format, one mapping for every GPU world test (the oracle
// itself stays free of the kernels' names).
#ifndef MEP_TESTS_GPU_SCALE_MODE_H_
#define MEP_TESTS_GPU_SCALE_MODE_H_

#include "kernels/common/kernels_types.h"
#include "tests/oracle/problem.h"

namespace mep_world {

inline int ScaleMode(moe_ep_oracle::ScaleFormat f) {
  switch (f) {
    case moe_ep_oracle::ScaleFormat::kF32: return MEP_FP8_SCALE_F32;
    case moe_ep_oracle::ScaleFormat::kUe8m0: return MEP_FP8_SCALE_UE8M0;
    case moe_ep_oracle::ScaleFormat::kUe8m0Packed: return MEP_FP8_SCALE_UE8M0_PACKED;
    case moe_ep_oracle::ScaleFormat::kPerToken: return MEP_FP8_SCALE_PER_TOKEN;
  }
  return MEP_FP8_SCALE_F32;
}

}  // namespace mep_world

#endif  // MEP_TESTS_GPU_SCALE_MODE_H_
