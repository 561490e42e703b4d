// ll_link_test.cc: the LL kernel library links into a host binary and its
// launchers reject invalid arguments without a GPU; sizing is exact.
#include <gtest/gtest.h>

#include "kernels/ll.h"

namespace {

TEST(LlLink, Fp8QuantizeRejectsBadHidden) {
  EXPECT_EQ(mep_fp8_quantize(nullptr, 4, 100, MOE_EP_FP8_SCALE_F32, nullptr, nullptr, nullptr),
            MOE_EP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(mep_kernels_last_error()).find("hidden is 100"), std::string::npos)
      << mep_kernels_last_error();
}

TEST(LlLink, Fp8QuantizeZeroTokensIsNoOp) {
  EXPECT_EQ(mep_fp8_quantize(nullptr, 0, 128, MOE_EP_FP8_SCALE_F32, nullptr, nullptr, nullptr),
            MOE_EP_OK);
}

TEST(LlLink, LaunchersRejectNullCtx) {
  mep_ll_dispatch_args_t d = {};
  mep_ll_combine_args_t c = {};
  EXPECT_EQ(mep_ll_dispatch_send(nullptr, &d, nullptr), MOE_EP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(mep_ll_dispatch_recv(nullptr, &d, nullptr), MOE_EP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(mep_ll_combine_send(nullptr, &c, nullptr), MOE_EP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(mep_ll_combine_recv(nullptr, &c, nullptr), MOE_EP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(mep_ll_dispatch_send(nullptr, nullptr, nullptr), MOE_EP_ERR_INVALID_ARGUMENT);
}

TEST(LlLink, BufferBytesExact) {
  // 1 local expert, 1 rank, 1 token, hidden 128, top-1, bf16:
  // signals 4*8 = 32; dispatch row 256; slot list 32 (16-byte head, one
  // 8-byte word, 16-aligned); combine row 256; staging max(256 + 32, 256
  // slot row + 256 partial) = 512. Per set 32+256+32+256+512 = 1088.
  EXPECT_EQ(mep_ll_buffer_bytes(1, 1, 1, 128, 1, 0, 2), 2u * 1088u);
  EXPECT_EQ(mep_ll_buffer_bytes(1, 1, 1, 128, 1, 0, 0), 2u * 1088u);  // 0 means 2
  // double_buffer: false -> one set.
  EXPECT_EQ(mep_ll_buffer_bytes(1, 1, 1, 128, 1, 0, 1), 1088u);
  // fp8 row: 128 + 4 scales -> 144 (16-aligned).
  EXPECT_EQ(mep_ll_dispatch_row_bytes(128, 1), 144u);
}

}  // namespace
