// ll_link_test.cc: the LL kernel library links into a host binary and its
// launchers reject invalid arguments without a GPU; sizing is exact.
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "kernels/common/limits.h"
#include "kernels/common/prepare_layout.h"
#include "kernels/ll/ll.h"
#include "tests/kernels/fake_ctx.h"

namespace {

TEST(LlLink, LaunchersRejectNullCtx) {
  mep_ll_dispatch_args_t d = {};
  mep_ll_combine_args_t c = {};
  EXPECT_EQ(mep_ll_dispatch_send(nullptr, &d, nullptr), MEP_KSTATUS_INVALID_ARGUMENT);
  EXPECT_EQ(mep_ll_dispatch_recv(nullptr, &d, nullptr), MEP_KSTATUS_INVALID_ARGUMENT);
  EXPECT_EQ(mep_ll_combine_send(nullptr, &c, nullptr), MEP_KSTATUS_INVALID_ARGUMENT);
  EXPECT_EQ(mep_ll_combine_recv(nullptr, &c, nullptr), MEP_KSTATUS_INVALID_ARGUMENT);
  EXPECT_EQ(mep_ll_dispatch_send(nullptr, nullptr, nullptr), MEP_KSTATUS_INVALID_ARGUMENT);
}

// Layout launcher: argument rules before any GPU work; nothing asked for is
// a no-op (no launch).
TEST(LlLink, PrepareLayoutRejectsBadArguments) {
  int32_t counts[4];
  mep_prepare_layout_args_t ok = {};
  ok.topk_idx_bytes = 8;
  ok.num_tokens = 0;
  ok.top_k = 2;
  ok.num_experts = 8;
  ok.world = 2;
  ok.num_tokens_per_rank = counts;
  struct Bad {
    const char *rule;
    void (*breaks)(mep_prepare_layout_args_t *);
  };
  const Bad bad[] = {
      {"num_tokens is -1", [](mep_prepare_layout_args_t *a) { a->num_tokens = -1; }},
      {"top_k is 33", [](mep_prepare_layout_args_t *a) { a->top_k = 33; }},
      {"world is 0", [](mep_prepare_layout_args_t *a) { a->world = 0; }},
      {"num_experts is 7", [](mep_prepare_layout_args_t *a) { a->num_experts = 7; }},
      {"topk_idx_bytes is 2", [](mep_prepare_layout_args_t *a) { a->topk_idx_bytes = 2; }},
      {"topk_idx is NULL with 3 tokens", [](mep_prepare_layout_args_t *a) { a->num_tokens = 3; }},
  };
  for (const Bad &b : bad) {
    mep_prepare_layout_args_t a = ok;
    b.breaks(&a);
    EXPECT_EQ(mep_prepare_layout(&a, nullptr), MEP_KSTATUS_INVALID_ARGUMENT) << b.rule;
    EXPECT_NE(std::string(mep_kernels_last_error()).find(b.rule), std::string::npos)
        << mep_kernels_last_error();
  }
  EXPECT_EQ(mep_prepare_layout(nullptr, nullptr), MEP_KSTATUS_INVALID_ARGUMENT);
  mep_prepare_layout_args_t none = ok;
  none.num_tokens = 3;  // topk_idx NULL, but no output asked for: nothing to read
  none.num_tokens_per_rank = nullptr;
  EXPECT_EQ(mep_prepare_layout(&none, nullptr), MEP_KSTATUS_OK);
}

// DeepEP-form layout export: argument rules before any GPU work; no output
// asked for is a no-op (no launch, so it succeeds without a GPU).
TEST(LlLink, ExportLayoutRejectsBadArguments) {
  int32_t slot_src[8] = {}, src_count[2] = {}, src_info[8];
  int64_t layout_range[2];
  struct Bad {
    const char *rule;
    const int32_t *slot_src, *src_count;
    int32_t e_local, world, max_tokens;
    int32_t *src_info;
    int64_t *layout_range;
  };
  const Bad bad[] = {
      {"e_local is 0", slot_src, src_count, 0, 2, 4, src_info, layout_range},
      {"e_local is 1025", slot_src, src_count, 1025, 2, 4, src_info, layout_range},
      {"world is 0", slot_src, src_count, 1, 0, 4, src_info, layout_range},
      {"world is 1025", slot_src, src_count, 1, 1025, 4, src_info, layout_range},
      {"max_tokens is 0", slot_src, src_count, 1, 2, 0, src_info, layout_range},
      {"max_tokens is 1025", slot_src, src_count, 1, 2, 1025, src_info, layout_range},
      {"src_count is NULL", slot_src, nullptr, 1, 2, 4, nullptr, layout_range},
      {"src_count is NULL", slot_src, nullptr, 1, 2, 4, src_info, nullptr},
      {"slot_src is NULL with src_info asked for", nullptr, src_count, 1, 2, 4, src_info,
       nullptr},
      // Dims are checked even when nothing is asked for.
      {"world is 0", slot_src, src_count, 1, 0, 4, nullptr, nullptr},
  };
  for (const Bad &b : bad) {
    EXPECT_EQ(mep_ll_export_layout(b.slot_src, b.src_count, b.e_local, b.world, b.max_tokens,
                                   b.src_info, b.layout_range, nullptr),
              MEP_KSTATUS_INVALID_ARGUMENT)
        << b.rule;
    EXPECT_NE(std::string(mep_kernels_last_error()).find(b.rule), std::string::npos)
        << mep_kernels_last_error();
  }
  EXPECT_EQ(mep_ll_export_layout(nullptr, nullptr, 1, 2, 4, nullptr, nullptr, nullptr),
            MEP_KSTATUS_OK);
}

// 1 local expert, 1 rank, 1 token, hidden 128, top-1, a window laid out for
// LSA only and exactly its size; fake pointers (no GPU).
mep_ll_ctx_t TinyLsaOnlyCtx() {
  mep_ll_ctx_t ctx = {};
  FillFakePointers(&ctx);
  ctx.num_sms = 1;
  ctx.dims = {1, 1, 1, 128, 1, 0, 2, 1};
  ctx.window_bytes = mep_ll_buffer_bytes(&ctx.dims);
  return ctx;
}

// A window laid out for LSA only has no staging: a staged transport on it
// is refused before any launch, naming both.
TEST(LlLink, LsaOnlyWindowRefusesStagedTransports) {
  mep_ll_ctx_t ctx = TinyLsaOnlyCtx();
  mep_ll_dispatch_args_t d = {};
  mep_ll_combine_args_t c = {};
  for (int t : {MEP_LL_TRANSPORT_GIN_EMULATED, MEP_LL_TRANSPORT_GIN}) {
    ctx.transport = t;
    EXPECT_EQ(mep_ll_dispatch_send(&ctx, &d, nullptr), MEP_KSTATUS_INVALID_ARGUMENT) << t;
    const std::string e = mep_kernels_last_error();
    EXPECT_NE(e.find("without staging (dims.lsa_only)"), std::string::npos) << e;
    EXPECT_NE(e.find(t == MEP_LL_TRANSPORT_GIN ? "transport is gin," : "transport is gin_emulated"),
              std::string::npos)
        << e;
    EXPECT_EQ(mep_ll_combine_recv(&ctx, &c, nullptr), MEP_KSTATUS_INVALID_ARGUMENT) << t;
  }
  // A window one byte short of its dims is refused too.
  ctx.transport = MEP_LL_TRANSPORT_LSA;
  ctx.window_bytes -= 1;
  EXPECT_EQ(mep_ll_dispatch_send(&ctx, &d, nullptr), MEP_KSTATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(mep_kernels_last_error()).find("smaller than the LL buffer"),
            std::string::npos)
      << mep_kernels_last_error();
}

// Capacities outside the limits the kernels index by (the rank's 16-bit
// field, top_k, hidden) are refused before any launch, naming them.
TEST(LlLink, ContextDimsOutsideTheLimitsAreRefused) {
  mep_ll_dispatch_args_t d = {};
  struct Bad {
    const char *what;
    void (*breaks)(mep_ll_dims_t *);
  };
  const Bad bad[] = {
      {"world 0", [](mep_ll_dims_t *x) { x->world = 0; }},
      {"world 1025", [](mep_ll_dims_t *x) { x->world = MEP_MAX_RANKS + 1; }},
      {"top_k 33", [](mep_ll_dims_t *x) { x->top_k = MEP_MAX_TOP_K + 1; }},
      {"hidden 129", [](mep_ll_dims_t *x) { x->hidden = 129; }},
      {"hidden 32776", [](mep_ll_dims_t *x) { x->hidden = MEP_MAX_HIDDEN + 8; }},
  };
  for (const Bad &b : bad) {
    mep_ll_ctx_t ctx = TinyLsaOnlyCtx();
    ctx.transport = MEP_LL_TRANSPORT_LSA;
    b.breaks(&ctx.dims);
    ctx.window_bytes = ~0ull;  // the size check is not what refuses it
    EXPECT_EQ(mep_ll_dispatch_send(&ctx, &d, nullptr), MEP_KSTATUS_INVALID_ARGUMENT) << b.what;
    const std::string e = mep_kernels_last_error();
    EXPECT_NE(e.find("the context's dims hold world"), std::string::npos) << b.what << ": " << e;
  }
}

// The library's kernels carry no phase stamps (only //kernels/ll:ll_stamped
// does): a context asking for them is refused by every dispatch launcher,
// naming the build that has them, instead of leaving the buffer unwritten.
TEST(LlLink, StampsNeedTheStampedBuild) {
  mep_ll_ctx_t ctx = TinyLsaOnlyCtx();
  ctx.transport = MEP_LL_TRANSPORT_LSA;
  uint64_t stamps[MEP_LL_STAMP_POINTS] = {};
  ctx.stamps = stamps;
  mep_ll_dispatch_args_t d = {};
  d.hidden = 128;
  d.top_k = 1;
  d.num_experts = 1;
  d.topk_idx_bytes = 4;
  using Launcher = mep_kstatus_t (*)(const mep_ll_ctx_t *, const mep_ll_dispatch_args_t *, void *);
  const std::pair<const char *, Launcher> launchers[] = {{"dispatch:", mep_ll_dispatch},
                                                         {"dispatch_send:", mep_ll_dispatch_send},
                                                         {"dispatch_recv:", mep_ll_dispatch_recv}};
  for (const auto &[op, launch] : launchers) {
    EXPECT_EQ(launch(&ctx, &d, nullptr), MEP_KSTATUS_INVALID_ARGUMENT) << op;
    const std::string e = mep_kernels_last_error();
    EXPECT_EQ(e.rfind(op, 0), 0u) << e;
    EXPECT_NE(e.find("built without phase stamps (link //kernels/ll:ll_stamped)"),
              std::string::npos)
        << e;
  }
  // Without the buffer the same call gets past that check (to a later
  // rule, so nothing launches).
  ctx.stamps = nullptr;
  d.fp8 = 1;
  d.scale_mode = 7;
  EXPECT_EQ(mep_ll_dispatch_send(&ctx, &d, nullptr), MEP_KSTATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(mep_kernels_last_error()).find("scale_mode is 7"), std::string::npos)
      << mep_kernels_last_error();
}

// Over LSA a combine whose dispatch carried no weights pushes them from its
// send half, so both the send and the fused launcher need topk_idx and
// topk_weights; a weighted dispatch's combine needs neither.
TEST(LlLink, LsaCombineSendNeedsTheWeightsItPushes) {
  mep_ll_ctx_t ctx = TinyLsaOnlyCtx();
  ctx.transport = MEP_LL_TRANSPORT_LSA;
  int32_t handle[4] = {};
  mep_ll_route_t route[1] = {};
  int64_t idx[1] = {0};
  uint16_t y[128] = {}, out[128] = {};
  mep_ll_combine_args_t c = {};
  c.y = y;
  c.topk_idx = idx;
  c.topk_idx_bytes = 8;
  c.out = out;
  c.num_tokens = 1;
  c.hidden = 128;
  c.top_k = 1;
  c.num_experts = 1;
  c.recv_count = c.slot_src = c.src_count = c.src_tokens = handle;
  c.route = route;
  EXPECT_EQ(mep_ll_combine_send(&ctx, &c, nullptr), MEP_KSTATUS_INVALID_ARGUMENT);
  std::string e = mep_kernels_last_error();
  EXPECT_NE(e.find("combine_send: topk_idx and topk_weights must not be NULL"), std::string::npos)
      << e;
  EXPECT_EQ(mep_ll_combine(&ctx, &c, nullptr), MEP_KSTATUS_INVALID_ARGUMENT);
  e = mep_kernels_last_error();
  EXPECT_NE(e.find("topk_weights must not be NULL"), std::string::npos) << e;
  // No tokens: nothing to push.
  c.num_tokens = 0;
  mep_ll_combine_send(&ctx, &c, nullptr);
  EXPECT_EQ(std::string(mep_kernels_last_error()).find("must not be NULL"), std::string::npos)
      << mep_kernels_last_error();
  // Weights at dispatch: the send half reads the route's weights instead.
  c.num_tokens = 1;
  c.partials = 1;
  mep_ll_combine_send(&ctx, &c, nullptr);
  EXPECT_EQ(std::string(mep_kernels_last_error()).find("must not be NULL"), std::string::npos)
      << mep_kernels_last_error();
}

TEST(LlLink, BufferBytesExact) {
  // 1 local expert, 1 rank, 1 token, hidden 128, top-1, bf16:
  // signals 6*8 = 48; dispatch row 256; slot list 32 (16-byte head, one
  // 8-byte word, 16-aligned); expert list 16 (count + one entry); 32 to
  // put comb_recv on a 128-byte boundary (at 384); combine rows 2*512 (one
  // per half, a line-partial row: one 512-byte step of 4 lines covers 240
  // channels); pushed weights 16 (one 8-byte word, 16-aligned); flagged
  // partials 2*512 (per half, one token's 128 channels, 4 bytes each); 112
  // to put staging on a 128-byte boundary (at 2560); staging max(256 + 32,
  // 256 slot row + 256 partial) = 512. Per set
  // 48+256+32+16+32+1024+16+1024+112+512 = 3072.
  mep_ll_dims_t d = {1, 1, 1, 128, 1, 0, 2, 0};
  EXPECT_EQ(mep_ll_buffer_bytes(&d), 2u * 3072u);
  d.num_sets = 0;  // 0 means 2
  EXPECT_EQ(mep_ll_buffer_bytes(&d), 2u * 3072u);
  // double_buffer: false -> one set.
  d.num_sets = 1;
  EXPECT_EQ(mep_ll_buffer_bytes(&d), 3072u);
  // LSA only: no staging, 3072 - 512.
  d.lsa_only = 1;
  EXPECT_EQ(mep_ll_buffer_bytes(&d), 2560u);
  // fp8 row: 128 + 4 scales -> 144 (16-aligned).
  EXPECT_EQ(mep_ll_dispatch_row_bytes(128, 1), 144u);
}

}  // namespace
