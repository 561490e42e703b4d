// host_rows_test.cc: the host backend's wire rows (kernels/host/host_rows.h)
// for pre-quantised HT input: an fp8 row with its scales and metadata fits
// the slot an HT group sizes for bf16 rows, and its bytes come back exactly
// as sent, whatever they are (HT never interprets them).
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/host/host_rows.h"
#include "kernels/common/limits.h"

namespace moe_ep_test {
namespace {

// HT groups size their slots with fp8 = 0 (bf16 rows); every layer of the
// group has hidden <= the config's, and row sizes grow with hidden.
TEST(HostRows, Fp8RowFitsTheBf16Slot) {
  for (int hidden = MEP_HIDDEN_ALIGN; hidden <= MEP_MAX_HIDDEN; hidden += MEP_HIDDEN_ALIGN) {
    for (int k = 1; k <= MEP_MAX_TOP_K; k++) {
      mep_row_layout_t l;
      mep_row_layout_init(&l, hidden, k, 1, 0);
      size_t slot = mep_row_bytes_max(hidden, k, 0);
      ASSERT_LE(l.row_bytes, slot) << "hidden " << hidden << " top_k " << k;
      // The largest scale row (f32, one per 128 channels) fits the payload.
      ASSERT_LE(static_cast<size_t>(hidden) + hidden / MEP_HIDDEN_ALIGN * 4u, l.payload_bytes);
    }
  }
}

TEST(HostRows, Fp8RowBytesComeBackVerbatim) {
  const int hidden = 640, k = 3, groups = hidden / 128;
  mep_row_layout_t l;
  mep_row_layout_init(&l, hidden, k, 1, 0);
  std::vector<uint8_t> x(hidden), row(l.row_bytes, 0xEE), got_x(hidden, 0);
  for (int i = 0; i < hidden; i++) x[i] = static_cast<uint8_t>(i * 37 + 11);  // NaN codes too
  const int32_t lids[k] = {2, -1, 0};
  const float w[k] = {0.5f, 0.0f, 1.25f};
  for (size_t scale_bytes : {static_cast<size_t>(groups) * 4u, static_cast<size_t>((groups + 3) / 4) * 4u}) {
    std::vector<uint8_t> scales(scale_bytes), got_s(scale_bytes, 0);
    for (size_t i = 0; i < scale_bytes; i++) scales[i] = static_cast<uint8_t>(0xFF - i * 13);
    mep_row_pack_fp8(&l, row.data(), 7, 1, lids, w, x.data(), scales.data(), scale_bytes);
    EXPECT_EQ(mep_row_token(row.data()), 7);
    EXPECT_EQ(mep_row_ordinal(row.data()), 1);
    for (int j = 0; j < k; j++) {
      EXPECT_EQ(mep_row_lids(row.data())[j], lids[j]);
      EXPECT_EQ(mep_row_weights(&l, row.data())[j], w[j]);
    }
    mep_row_unpack_ht(&l, row.data(), got_x.data(), got_s.data(), scale_bytes);
    for (int i = 0; i < hidden; i++) ASSERT_EQ(got_x[i], x[i]) << "x byte " << i;
    for (size_t i = 0; i < scale_bytes; i++) ASSERT_EQ(got_s[i], scales[i]) << "scale byte " << i;
  }
}

}  // namespace
}  // namespace moe_ep_test
