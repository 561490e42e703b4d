// host_row_desc_test.cc: the host backend's count words describe a call's
// rows with the nccl kernels' row description (kernels/common/row_desc.h),
// so two calls are refused as different exactly when their rows are laid
// out or scaled differently: LL's ROUND_SCALE on f32 scales makes the rows
// of UE8M0, HT ignores it, bf16 rows ignore the scale format.
#include <string>

#include "gtest/gtest.h"

extern "C" {
#include "kernels/common/row_desc.h"
#include "runtime/host/host_state.h"
#include "runtime/row_desc_text.h"
}

namespace {

constexpr uint32_t kMarker = 1u << 31;
constexpr uint32_t kMask = (1u << MEP_ROW_DESC_BITS) - 1u;

struct Call {
  mep_handle_state_t handle{};
  mep_op_t op{};
  Call(int mode, int hidden, int top_k, int fp8, int scale, uint32_t flags) {
    handle.top_k = top_k;
    op.kind = MEP_OP_DISPATCH;
    op.mode = mode;
    op.hidden = hidden;
    op.fp8 = fp8;
    op.scale_format = scale;
    op.flags = flags;
    op.handle = &handle;
  }
  uint32_t desc() const { return mep_host_row_desc(&op); }
  std::string text() const {
    char t[96];
    mep_row_desc_text(desc() & kMask, t, sizeof t);
    return t;
  }
};

constexpr int LL = MOE_EP_MODE_LOW_LATENCY, HT = MOE_EP_MODE_HIGH_THROUGHPUT;
constexpr int F32 = MOE_EP_FP8_SCALE_F32, UE8M0 = MOE_EP_FP8_SCALE_UE8M0,
              PACKED = MOE_EP_FP8_SCALE_UE8M0_PACKED;
constexpr uint32_t ROUND = MOE_EP_FLAG_ROUND_SCALE;

TEST(HostRowDesc, IsTheKernelsDescriptionBehindAMarker) {
  const Call ll(LL, 7168, 8, 1, PACKED, 0);
  EXPECT_EQ(ll.desc(), kMarker | mep_row_desc(7168, 8, 1, MEP_FP8_SCALE_UE8M0_PACKED));
  // hidden=8, top_k=1, bf16 is description 0: the marker tells it from an empty word.
  EXPECT_EQ(Call(HT, 8, 1, 0, F32, 0).desc(), kMarker);
  EXPECT_EQ(Call(LL, 32768, 32, 0, F32, 0).text(), "hidden=32768, top_k=32, bf16 rows");
}

TEST(HostRowDesc, RoundScaleMakesLowLatencyF32RowsUe8m0) {
  const Call rounded(LL, 7168, 8, 1, F32, ROUND);
  EXPECT_EQ(rounded.desc(), Call(LL, 7168, 8, 1, UE8M0, 0).desc());
  EXPECT_NE(rounded.desc(), Call(LL, 7168, 8, 1, F32, 0).desc());
  EXPECT_EQ(rounded.text(),
            "hidden=7168, top_k=8, fp8 rows with power-of-two (UE8M0 in f32) scales");
  // Already powers of two: the flag changes nothing.
  EXPECT_EQ(Call(LL, 7168, 8, 1, PACKED, ROUND).desc(), Call(LL, 7168, 8, 1, PACKED, 0).desc());
}

TEST(HostRowDesc, HighThroughputIgnoresRoundScale) {
  const Call rounded(HT, 4096, 6, 1, F32, ROUND);
  EXPECT_EQ(rounded.desc(), Call(HT, 4096, 6, 1, F32, 0).desc());
  EXPECT_EQ(rounded.text(), "hidden=4096, top_k=6, fp8 rows with f32 scales");
}

// One scale per row is a layout of its own: at hidden 128 it has as many
// scale words as 128-channel f32 scales, and the calls still differ.
TEST(HostRowDesc, PerTokenScalesAreTheirOwnFormat) {
  const Call per_token(HT, 128, 8, 1, MEP_FP8_SCALE_PER_TOKEN, 0);
  EXPECT_NE(per_token.desc(), Call(HT, 128, 8, 1, F32, 0).desc());
  EXPECT_EQ(per_token.text(), "hidden=128, top_k=8, fp8 rows with per-token f32 scales");
  EXPECT_EQ(Call(HT, 7168, 8, 1, MEP_FP8_SCALE_PER_TOKEN, ROUND).desc() & kMask,
            mep_row_desc(7168, 8, 1, MEP_FP8_SCALE_PER_TOKEN));
}

TEST(HostRowDesc, EveryFieldThatChangesTheRowsDiffers) {
  const Call base(LL, 7168, 8, 1, UE8M0, 0);
  EXPECT_NE(base.desc(), Call(LL, 7168 - 128, 8, 1, UE8M0, 0).desc());
  EXPECT_NE(base.desc(), Call(LL, 7168, 7, 1, UE8M0, 0).desc());
  EXPECT_NE(base.desc(), Call(LL, 7168, 8, 0, UE8M0, 0).desc());
  EXPECT_NE(base.desc(), Call(LL, 7168, 8, 1, PACKED, 0).desc());
  // bf16 rows carry no scales: their scale format is not part of them.
  EXPECT_EQ(Call(LL, 7168, 8, 0, PACKED, ROUND).desc(), Call(LL, 7168, 8, 0, F32, 0).desc());
}

}  // namespace
