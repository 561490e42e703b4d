// ll_gpu_test.cc: multi-process GPU test of the LL data path (one process per
// GPU, re-exec'd by the parent with MOE_EP_RANK/MOE_EP_WORLD_SIZE): NCCL setup
// through runtime/nccl, dispatch + combine over LSA and GIN-emulated checked
// against a CPU reference built from every rank's seeds (fp8 bytes and scales
// exactly against tests/oracle's quantizer, +-inf and NaN input included),
// double buffering, CUDA graph replays, refused corrupt lists and a timeout
// record. Every test passes alone or in any order: the ones that break
// their group's state run on a fresh group of their own. Runs with any
// world size, 1 included (MOE_EP_TEST_WORLD=1, or a 1-GPU machine).
// Timings live in tools/bench/ll_kernel_bench.cc.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "kernels/ll/ll.h"
#include "runtime/error.h"
#include "runtime/nccl/nccl_setup.h"
#include "tests/gpu/cuda_ok.h"
#include "tests/gpu/ll_gpu_harness.h"
#include "tests/oracle/quant.h"

namespace {

#define MEP_OK(x) ASSERT_EQ((x), MEP_KSTATUS_OK) << #x << ": " << mep_kernels_last_error()

using namespace mep_ll_gpu;

float e4m3_to_f(uint8_t b) {
  const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return NAN;
  float v = e == 0 ? std::ldexp((float)m, -9) : std::ldexp(1.0f + m / 8.0f, e - 7);
  return s ? -v : v;
}
// Expert output row for (source rank, token, global expert): what "y" holds.
float y_val(uint64_t seed, int r, int t, int e, int h) {
  return 2.0f * unit(mix(seed ^ ((uint64_t)r << 50) ^ ((uint64_t)t << 36) ^ ((uint64_t)e << 20) ^ (uint64_t)h)) - 1.0f;
}

Group *g_group = nullptr;  // shared by the tests that leave it consistent

class LlGpu : public ::testing::Test {
 protected:
  // This rank's dispatches carry topk_weights, so its combines receive
  // partials pre-reduced on the experts' ranks (ranks may differ).
  int weighted_ = 0;
  // A test that breaks its group's state (a corrupt list, a timeout) runs
  // on a fresh group of its own (use_fresh_group), freed in TearDown, so
  // the shared group stays consistent for whatever runs next.
  Group *fresh_ = nullptr;
  Group &G() { return fresh_ ? *fresh_ : *g_group; }
  void use_fresh_group() {
    fresh_ = group_create(g_group);
    ASSERT_NE(fresh_, nullptr) << "rank " << g_rank << ": a fresh group could not be made";
  }
  void TearDown() override {
    group_free(fresh_);  // collective: every rank made one in the same test
    fresh_ = nullptr;
  }
  // Each test starts with no timeout record and no abort flag, so one
  // failure does not cascade into the next test.
  void clear_record() {
    memset((void *)G().rec, 0, sizeof *G().rec);
    ASSERT_EQ(mep_ll_clear_abort(&G().ctx, G().stream), MEP_KSTATUS_OK);
    ASSERT_EQ(cudaStreamSynchronize(G().stream), cudaSuccess);
  }
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(clear_record());
    fprintf(stderr, "rank %d: start %s\n", g_rank,
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  std::string rec_text() {
    const mep_ll_error_record_t *r = G().rec;
    char b[256];
    snprintf(b, sizeof b, "timeout record flag %d op %d rank %d peer %d expert %d set %d expected %llu seen %llu",
             r->flag, r->op, r->rank, r->peer, r->expert, r->buffer_set,
             (unsigned long long)r->expected, (unsigned long long)r->seen);
    return b;
  }
  int local_experts(const Case &c) { return c.experts / g_world; }
  // Buffer set `set` of this rank's window (host-visible address), and
  // its per-block tag copies in the device state (MEP_LL_SHADOW_SLOTS
  // blocks of mep_ll_tag_words(R) u32 each; word R + 1 is the combine
  // epoch).
  static char *set_window(Group &g, int set) {
    return (char *)g.ctx.window_local + (size_t)set * mep_ll_set_layout(&g.ctx.dims).set_bytes;
  }
  static char *set_tags(Group &g, int set) {
    return (char *)g.ctx.state + mep_ll_state_layout(&g.ctx.dims).tags +
           (size_t)set * MEP_LL_SHADOW_SLOTS * mep_ll_tag_words(g_world) * 4;
  }

  void upload(const Case &c, Group &g, const Inputs &in, void *x, void *topk, void *w) {
    (void)g;
    ASSERT_TRUE(mep_ll_gpu::upload(c, in, x, topk, w)) << "rank " << g_rank << ": upload failed";
  }
  mep_ll_dispatch_args_t dargs(const Case &c, Group &g, int set, void *x, void *topk, void *w) {
    return dispatch_args(c, g, set, x, topk, w, weighted_);
  }
  mep_ll_combine_args_t cargs(const Case &c, Group &g, int set, void *topk, void *w) {
    return combine_args(c, g, set, topk, w, weighted_);
  }

  // Checks recv_x/scales/counts/handle against all ranks' inputs; then fills
  // y from the handle (y_seed) so combine can be checked.
  void verify_dispatch_and_make_y(const Case &c, Group &g, uint64_t y_seed) {
    const int EL = local_experts(c), H = c.hidden, cap = g_world * kMaxTokens;
    std::vector<Inputs> all;
    for (int r = 0; r < g_world; ++r) all.push_back(make_inputs(c, r));
    std::vector<int32_t> cnt(EL), slot((size_t)EL * cap), srcc((size_t)EL * g_world);
    ASSERT_EQ(cudaMemcpy(cnt.data(), g.recv_count, EL * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(slot.data(), g.slot_src, slot.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(srcc.data(), g.src_count, srcc.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    const size_t row_bytes = c.fp8 ? (size_t)H : (size_t)H * 2;
    const int groups = H / 128, words = (groups + 3) / 4;
    const size_t srow = c.fp8 ? (c.scale_mode == MOE_EP_FP8_SCALE_UE8M0_PACKED ? words * 4 : groups * 4) : 0;
    std::vector<uint8_t> rx((size_t)EL * cap * row_bytes), rs((size_t)EL * cap * srow);
    ASSERT_EQ(cudaMemcpy(rx.data(), g.recv_x, rx.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    if (c.fp8) {
      ASSERT_EQ(cudaMemcpy(rs.data(), g.scales, rs.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    }
    std::vector<uint16_t> yh((size_t)EL * cap * H, 0);
    long bad = 0;
    for (int le = 0; le < EL; ++le) {
      const int e = g_rank * EL + le;
      int i = 0;
      for (int r = 0; r < g_world; ++r) {
        int from_r = 0;
        const int T = tokens_of(c, r);
        for (int t = 0; t < T; ++t)
          for (int k = 0; k < c.top_k; ++k) {
            if (all[r].topk[(size_t)t * c.top_k + k] != e) continue;
            ++from_r;
            if (i >= cnt[le]) { ++i; continue; }
            const size_t s = (size_t)le * cap + i;
            ASSERT_EQ(slot[s], MEP_LL_SLOT_PACK(r, t, k))
                << "rank " << g_rank << " expert " << le << " slot " << i << " seed " << c.seed;
            const uint16_t *xr = &all[r].x[(size_t)t * H];
            if (!c.fp8) {
              if (memcmp(&rx[s * row_bytes], xr, row_bytes) != 0 && bad++ < 3) {
                const uint16_t *got = reinterpret_cast<const uint16_t *>(&rx[s * row_bytes]);
                int h = 0;
                while (h < H && got[h] == xr[h]) ++h;
                ADD_FAILURE() << "bf16 row differs: rank " << g_rank << " expert " << le << " slot "
                              << i << " seed " << c.seed << ", first at channel " << h << ": got 0x"
                              << std::hex << got[h] << " want 0x" << xr[h] << std::dec;
              }
            } else {
              // Exact: the oracle's scale and e4m3 bytes (x / scale, IEEE).
              const moe_ep_oracle::ScaleFormat fmt =
                  c.scale_mode == MOE_EP_FP8_SCALE_F32 ? moe_ep_oracle::ScaleFormat::kF32
                  : c.scale_mode == MOE_EP_FP8_SCALE_UE8M0 ? moe_ep_oracle::ScaleFormat::kUe8m0
                                                           : moe_ep_oracle::ScaleFormat::kUe8m0Packed;
              std::vector<uint8_t> oq(H);
              std::vector<float> osc(groups);
              moe_ep_oracle::quantize_row(xr, H, fmt, oq.data(), osc.data());
              for (int gi = 0; gi < groups; ++gi) {
                const float sc = osc[gi];
                float got_sc;
                if (c.scale_mode == MOE_EP_FP8_SCALE_UE8M0_PACKED) {
                  const uint8_t byte = rs[s * srow + gi];
                  const uint8_t want = moe_ep_oracle::ue8m0_byte(sc);
                  if (byte != want && bad++ < 3)
                    ADD_FAILURE() << "ue8m0 byte " << (int)byte << " want " << (int)want
                                  << " rank " << g_rank << " expert " << le << " slot " << i << " group " << gi
                                  << " seed " << c.seed;
                  got_sc = moe_ep_oracle::ue8m0_to_float(byte);
                } else {
                  memcpy(&got_sc, &rs[s * srow + gi * 4], 4);
                  if (got_sc != sc && bad++ < 3)
                    ADD_FAILURE() << "scale " << got_sc << " want " << sc << " rank " << g_rank
                                  << " expert " << le << " slot " << i << " group " << gi << " seed " << c.seed;
                }
                for (int h = gi * 128; h < gi * 128 + 128; ++h) {
                  const uint8_t got = rx[s * row_bytes + h];
                  if (got != oq[h] && bad++ < 3)
                    ADD_FAILURE() << "fp8 byte 0x" << std::hex << (int)got << " want 0x" << (int)oq[h]
                                  << std::dec << " (x " << bf2f(xr[h]) << ", scale " << sc << ") rank "
                                  << g_rank << " expert " << le << " slot " << i << " channel " << h
                                  << " seed " << c.seed;
                  const float xv = bf2f(xr[h]), q = e4m3_to_f(got) * got_sc;
                  if (!std::isfinite(xv)) continue;  // the exact code above is the check
                  if (std::fabs(q - xv) > std::fabs(xv) * 0.0625f + got_sc * 0.002f + 1e-7f && bad++ < 3)
                    ADD_FAILURE() << "fp8 value " << q << " want ~" << xv << " rank " << g_rank
                                  << " expert " << le << " slot " << i << " channel " << h
                                  << " seed " << c.seed;
                }
              }
              if (c.scale_mode == MOE_EP_FP8_SCALE_UE8M0_PACKED)
                for (int b = groups; b < words * 4; ++b)
                  if (rs[s * srow + b] != 0 && bad++ < 3)
                    ADD_FAILURE() << "packed scale padding byte " << b << " is " << (int)rs[s * srow + b]
                                  << " rank " << g_rank << " expert " << le << " slot " << i;
            }
            for (int h = 0; h < H; ++h) yh[s * H + h] = f2bf(y_val(y_seed, r, t, e, h));
            ++i;
          }
        ASSERT_EQ(srcc[(size_t)le * g_world + r], from_r)
            << "src_count rank " << g_rank << " expert " << le << " src " << r << " seed " << c.seed;
      }
      ASSERT_EQ(cnt[le], i) << "recv_count rank " << g_rank << " expert " << le << " seed " << c.seed;
    }
    ASSERT_EQ(bad, 0) << "dispatch rows and scales differ (first 3 above), rank " << g_rank
                      << " seed " << c.seed;
    ASSERT_EQ(cudaMemcpy(g.y, yh.data(), yh.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
    // That copy (pageable memory) may return before its DMA lands; the
    // combine on the group's non-blocking stream would not wait for it.
    ASSERT_EQ(cudaStreamSynchronize(cudaStreamLegacy), cudaSuccess);
  }

  // Expected out[t][h], exactly as documented, wherever the weights were
  // given: per expert rank the sum of its slots' w * y (fmaf, k ascending,
  // from 0) in f32, rounded to bf16; the partials added in f32 (from 0) in
  // the order the ranks first appear in the token's top-k, then bf16.
  float expected_out(const Case &c, const Inputs &in, uint64_t y_seed, int t, int h) {
    const int K = c.top_k, EL = local_experts(c);
    auto y = [&](int e) { return bf2f(f2bf(y_val(y_seed, g_rank, t, e, h))); };
    float acc = 0;
    for (int k = 0; k < K; ++k) {
      const int e = (int)in.topk[(size_t)t * K + k];
      if (e < 0) continue;
      bool seen = false;
      for (int k0 = 0; k0 < k; ++k0)
        seen |= in.topk[(size_t)t * K + k0] >= 0 && (int)in.topk[(size_t)t * K + k0] / EL == e / EL;
      if (seen) continue;
      float partial = 0;
      for (int k2 = k; k2 < K; ++k2) {
        const int e2 = (int)in.topk[(size_t)t * K + k2];
        if (e2 >= 0 && e2 / EL == e / EL) partial = std::fmaf(in.w[(size_t)t * K + k2], y(e2), partial);
      }
      acc += bf2f(f2bf(partial));
    }
    return bf2f(f2bf(acc));
  }

  void verify_combine(const Case &c, Group &g, uint64_t y_seed) {
    const int T = tokens_of(c, g_rank), H = c.hidden;
    if (T == 0) return;
    const Inputs in = make_inputs(c, g_rank);
    std::vector<uint16_t> out((size_t)T * H);
    ASSERT_EQ(cudaMemcpy(out.data(), g.out, out.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    long bad = 0;
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h) {
        const float got = bf2f(out[(size_t)t * H + h]), want = expected_out(c, in, y_seed, t, h);
        if (got != want && bad++ < 3)
          ADD_FAILURE() << "combine out[" << t << "][" << h << "] = " << got << " want " << want
                        << " rank " << g_rank << " seed " << c.seed << " weighted " << weighted_;
      }
    ASSERT_EQ(bad, 0) << "combine values differ (first 3 above), rank " << g_rank << " seed "
                      << c.seed;
  }

  void repeated_expert(int transport);  // RepeatedExpertKeepsFirstMaxTokensPerSource
  // Weights carried by dispatch: combine pre-reduced on the experts' ranks.
  void weighted_round_trip(const Case &c, int transport) {
    weighted_ = 1;
    round_trip(c, transport);
  }
  // This rank's inputs of `c` dispatched on set 0 over `transport`, both
  // halves, finished with no record.
  void dispatch_set0(const Case &c, Group &g, int transport) {
    g.ctx.transport = transport;
    const Inputs in = make_inputs(c, g_rank);
    upload(c, g, in, g.x, g.topk, g.w);
    mep_ll_dispatch_args_t d = dargs(c, g, 0, g.x, g.topk, g.w);
    MEP_OK(mep_ll_dispatch_send(&g.ctx, &d, g.stream));
    MEP_OK(mep_ll_dispatch_recv(&g.ctx, &d, g.stream));
    CUDA_OK(cudaStreamSynchronize(g.stream));
    ASSERT_EQ(g.rec->flag, 0) << rec_text();
  }
  // After a call that waited for absent rank 1 since t0: the record names
  // this rank as the one that waited, rank 1 as the peer and `op` as the
  // wait, with a value other than the one expected, within the timeout.
  void expect_absent_rank1(Group &g, int op, std::chrono::steady_clock::time_point t0) {
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_EQ(g.rec->flag, 2) << "rank " << g_rank << ": no timeout recorded while rank 1 was absent";
    EXPECT_EQ(g.rec->op, op) << "rank " << g_rank << ": " << rec_text();
    EXPECT_EQ(g.rec->rank, g_rank) << "the record must name the rank that waited: " << rec_text();
    EXPECT_EQ(g.rec->peer, 1) << "rank " << g_rank << ": the record must name the absent rank: "
                              << rec_text();
    EXPECT_NE(g.rec->seen, g.rec->expected) << "rank " << g_rank << ": " << rec_text();
    EXPECT_LT(ms, 5000) << "rank " << g_rank;
  }
  // `c` dispatched on set 0 of a fresh group, then combined on rank 0
  // alone (rank 1 returns, and still frees the group in TearDown): the
  // send half (and with recv the receive half) under a 300 ms kernel
  // timeout, whose record must name `op`.
  void combine_without_rank1(const Case &c, bool recv, int op) {
    ASSERT_NO_FATAL_FAILURE(use_fresh_group());
    Group &g = G();
    ASSERT_NO_FATAL_FAILURE(dispatch_set0(c, g, MEP_LL_TRANSPORT_LSA));
    if (g_rank == 1) return;
    MEP_OK(mep_ll_timeout_cycles(g_rank, 300, &g.ctx.timeout_cycles));
    mep_ll_combine_args_t cb = cargs(c, g, 0, g.topk, g.w);
    const auto t0 = std::chrono::steady_clock::now();
    MEP_OK(mep_ll_combine_send(&g.ctx, &cb, g.stream));
    if (recv) {
      MEP_OK(mep_ll_combine_recv(&g.ctx, &cb, g.stream));
    }
    CUDA_OK(cudaStreamSynchronize(g.stream));
    expect_absent_rank1(g, op, t0);
  }
  // fused_combine: the combine in one launch (mep_ll_combine), else both
  // halves (the hooks' kernels).
  void round_trip(const Case &c, int transport, bool fused_combine = false) {
    Group &g = G();
    ASSERT_NO_FATAL_FAILURE(dispatch_set0(c, g, transport));
    verify_dispatch_and_make_y(c, g, c.seed + 1);
    mep_ll_combine_args_t cb = cargs(c, g, 0, g.topk, g.w);
    if (fused_combine) {
      MEP_OK(mep_ll_combine(&g.ctx, &cb, g.stream));
    } else {
      MEP_OK(mep_ll_combine_send(&g.ctx, &cb, g.stream));
      MEP_OK(mep_ll_combine_recv(&g.ctx, &cb, g.stream));
    }
    CUDA_OK(cudaStreamSynchronize(g.stream));
    ASSERT_EQ(g.rec->flag, 0) << rec_text();
    verify_combine(c, g, c.seed + 1);
  }
};

const Case kBf16Big = {7168, 8, 256, 0, 0, 8, {128, 128}, 11};
const Case kFp8Big = {7168, 8, 256, 1, MOE_EP_FP8_SCALE_F32, 8, {128, 0}, 12};
const Case kFp8PackedSmall = {2048, 1, 8, 1, MOE_EP_FP8_SCALE_UE8M0_PACKED, 4, {1, 128}, 13};
const Case kFp8Ue8m0 = {2048, 8, 8, 1, MOE_EP_FP8_SCALE_UE8M0, 4, {128, 1}, 14};
const Case kBf16Odd = {2056, 1, 256, 0, 0, 4, {1, 0}, 15};
// int64 topk_idx with UE8M0-packed scales: hidden 7168 (56 groups, 14 full
// words) and hidden 2176 (17 groups: a partial last word, and a row that is
// not a multiple of the quantizer's 512-channel step).
const Case kFp8PackedI64Big = {7168, 8, 256, 1, MOE_EP_FP8_SCALE_UE8M0_PACKED, 8, {128, 37}, 16};
const Case kFp8PackedI64Odd = {2176, 4, 64, 1, MOE_EP_FP8_SCALE_UE8M0_PACKED, 8, {45, 128}, 17};
const Case kFp8Hot = {7168, 8, 256, 1, MOE_EP_FP8_SCALE_F32, 4, {128, 128}, 18, true};
// Token counts cycling 128, 0, 37 over the ranks: from 3 ranks on, a rank
// with nothing to send sits between ranks that send (its count words and
// list slots must still arrive), and combine sums partials from several
// ranks; at 2 ranks the second sends nothing.
const Case kFp8SomeRanksIdle = {7168, 8, 256, 1, MOE_EP_FP8_SCALE_F32, 8, {128, 0, 37}, 22};
const Case kBf16SomeRanksIdle = {2048, 6, 64, 0, 0, 4, {128, 0, 37}, 23};
// Calls small enough for flagged partials over LSA, sized from the groups'
// limit F (mep_ll_flag_tokens: 16 at EP1-2, 8 at EP4 with the tests'
// 128-token maximum): F/2 and F tokens (swapped: F and F/2, other inputs),
// and F against F + 1 (one source flagged, the other not, in the same
// combine).
int flag_tokens() { return mep_ll_flag_tokens(&g_group->ctx.dims); }
Case bf16_flagged(bool swapped = false) {
  const int f = flag_tokens(), h = std::max(1, f / 2);
  return {7168, 8, 256, 0, 0, 8, swapped ? std::vector<int>{f, h} : std::vector<int>{h, f},
          swapped ? 26u : 24u};
}
// A call above the flagged limit (line partials from every rank), and
// one that mixes the kinds: one rank's tokens flagged, the other's lines.
Case bf16_lines(bool swapped = false) {
  const int f = flag_tokens();
  return {7168, 8, 256, 0, 0, 8, swapped ? std::vector<int>{37, f + 1} : std::vector<int>{f + 1, 37},
          swapped ? 28u : 27u};
}
Case bf16_mixed_kinds(bool swapped = false) {
  const int f = flag_tokens(), h = std::max(1, f / 2);
  return {7168, 8, 256, 0, 0, 8, swapped ? std::vector<int>{h, f + 1} : std::vector<int>{f + 1, h},
          swapped ? 30u : 29u};
}
Case fp8_flag_edge() {
  return {7168, 8, 256, 1, MOE_EP_FP8_SCALE_F32, 4, {flag_tokens(), flag_tokens() + 1}, 25};
}
// +-inf and NaN in the tokens (make_inputs): codes and scales exactly the
// oracle's under moe_ep.h's rule, for each scale format; 2176 channels put
// groups past the quantiser's 512-channel step.
const Case kFp8NonFinite[] = {
    {2048, 8, 8, 1, MOE_EP_FP8_SCALE_F32, 4, {128, 37}, 19, false, true},
    {2048, 8, 8, 1, MOE_EP_FP8_SCALE_UE8M0, 4, {37, 128}, 20, false, true},
    {2176, 4, 64, 1, MOE_EP_FP8_SCALE_UE8M0_PACKED, 8, {45, 128}, 21, false, true},
};

TEST_F(LlGpu, LsaBf16H7168Top8E256) { round_trip(kBf16Big, MEP_LL_TRANSPORT_LSA); }
TEST_F(LlGpu, LsaFp8H7168Top8ZeroTokensOnRank1) { round_trip(kFp8Big, MEP_LL_TRANSPORT_LSA); }
TEST_F(LlGpu, LsaFp8PackedH2048Top1E8) { round_trip(kFp8PackedSmall, MEP_LL_TRANSPORT_LSA); }
TEST_F(LlGpu, LsaFp8Ue8m0H2048Top8E8) { round_trip(kFp8Ue8m0, MEP_LL_TRANSPORT_LSA); }
TEST_F(LlGpu, LsaBf16H2056Top1OneToken) { round_trip(kBf16Odd, MEP_LL_TRANSPORT_LSA); }
TEST_F(LlGpu, GinEmuBf16H7168Top8E256) { round_trip(kBf16Big, MEP_LL_TRANSPORT_GIN_EMULATED); }
TEST_F(LlGpu, GinEmuFp8H7168Top8ZeroTokensOnRank1) { round_trip(kFp8Big, MEP_LL_TRANSPORT_GIN_EMULATED); }
TEST_F(LlGpu, GinEmuFp8PackedH2048Top1E8) { round_trip(kFp8PackedSmall, MEP_LL_TRANSPORT_GIN_EMULATED); }
TEST_F(LlGpu, GinEmuFp8Ue8m0H2048Top8E8) { round_trip(kFp8Ue8m0, MEP_LL_TRANSPORT_GIN_EMULATED); }
TEST_F(LlGpu, LsaFp8PackedI64H7168Top8E256) { round_trip(kFp8PackedI64Big, MEP_LL_TRANSPORT_LSA); }
TEST_F(LlGpu, LsaFp8PackedI64H2176Top4E64) { round_trip(kFp8PackedI64Odd, MEP_LL_TRANSPORT_LSA); }
TEST_F(LlGpu, GinEmuFp8PackedI64H2176Top4E64) { round_trip(kFp8PackedI64Odd, MEP_LL_TRANSPORT_GIN_EMULATED); }
TEST_F(LlGpu, LsaFp8H7168TokensOnSomeRanks) { round_trip(kFp8SomeRanksIdle, MEP_LL_TRANSPORT_LSA); }
TEST_F(LlGpu, GinEmuBf16H2048TokensOnSomeRanks) { round_trip(kBf16SomeRanksIdle, MEP_LL_TRANSPORT_GIN_EMULATED); }
TEST_F(LlGpu, GinEmuBf16H2056Top1OneToken) { round_trip(kBf16Odd, MEP_LL_TRANSPORT_GIN_EMULATED); }
// Every slot on rank 0's experts 0..7 (run_device.sh also runs these on a
// 1-SM grid: every local expert, and 2048 slots, in one receive block).
TEST_F(LlGpu, LsaFp8HotExperts) { round_trip(kFp8Hot, MEP_LL_TRANSPORT_LSA); }
TEST_F(LlGpu, GinEmuFp8HotExperts) { round_trip(kFp8Hot, MEP_LL_TRANSPORT_GIN_EMULATED); }
TEST_F(LlGpu, WeightedLsaFp8HotExperts) { weighted_round_trip(kFp8Hot, MEP_LL_TRANSPORT_LSA); }
// Hot experts' rows are shared between blocks through the help words
// (ll_dispatch_copy.cuh: 256 rows each, 32 copied by the owner): a word is
// published only within its call, so after every dispatch no word of
// either set holds slots, and a uniform call between two hot ones reads
// no stale word.
TEST_F(LlGpu, LsaFp8HotExpertsLeaveNoHelpWordPublished) {
  Group &g = G();
  auto expect_closed = [&](const char *after) {
    const uint64_t base = mep_ll_state_layout(&g.ctx.dims).tickets;
    const uint64_t per_set = mep_ll_set_counter_bytes(&g.ctx.dims);
    const int L = g.ctx.dims.local_experts;
    std::vector<uint64_t> w((size_t)L);
    for (int set = 0; set < MEP_NUM_BUFFER_SETS; ++set) {
      const char *words = (const char *)g.ctx.state + base + set * per_set + MEP_LL_TICKET_BYTES;
      CUDA_OK(cudaMemcpy(w.data(), words, w.size() * 8, cudaMemcpyDeviceToHost));
      for (int e = 0; e < L; ++e)
        if ((w[(size_t)e] >> 32) != 0) {
          ADD_FAILURE() << "rank " << g_rank << ": after the " << after << " call, set " << set
                        << " local expert " << e << " still publishes " << (w[(size_t)e] >> 32)
                        << " slots (cursor " << (uint32_t)w[(size_t)e] << ")";
          return;
        }
    }
  };
  round_trip(kFp8Hot, MEP_LL_TRANSPORT_LSA);
  expect_closed("hot");
  round_trip(kBf16Big, MEP_LL_TRANSPORT_LSA);
  expect_closed("uniform");
  round_trip(kFp8Hot, MEP_LL_TRANSPORT_LSA);
  expect_closed("second hot");
}
TEST_F(LlGpu, LsaFp8NonFiniteInput) {
  for (const Case &c : kFp8NonFinite) {
    round_trip(c, MEP_LL_TRANSPORT_LSA);
    if (HasFatalFailure()) return;
  }
}
TEST_F(LlGpu, GinEmuFp8NonFiniteInput) {
  for (const Case &c : kFp8NonFinite) {
    round_trip(c, MEP_LL_TRANSPORT_GIN_EMULATED);
    if (HasFatalFailure()) return;
  }
}
// Weights carried by dispatch: combine pre-reduced on the experts' ranks.
TEST_F(LlGpu, WeightedLsaBf16H7168Top8E256) { weighted_round_trip(kBf16Big, MEP_LL_TRANSPORT_LSA); }
TEST_F(LlGpu, WeightedLsaFp8H7168Top8ZeroTokensOnRank1) { weighted_round_trip(kFp8Big, MEP_LL_TRANSPORT_LSA); }
TEST_F(LlGpu, WeightedLsaBf16H2056Top1OneToken) { weighted_round_trip(kBf16Odd, MEP_LL_TRANSPORT_LSA); }
TEST_F(LlGpu, WeightedLsaFp8PackedI64H2176Top4E64) { weighted_round_trip(kFp8PackedI64Odd, MEP_LL_TRANSPORT_LSA); }
// The flagged round trip, and proof that it took the flagged path: words
// of this combine's epoch in this rank's comb_flag, either half (its own
// partials at least; a combine of lines writes none there).
TEST_F(LlGpu, LsaBf16H7168FlaggedPartials) {
  Group &g = G();
  const mep_ll_set_layout_t lay = mep_ll_set_layout(&g.ctx.dims);
  std::vector<uint64_t> w(2 * lay.comb_flag_half / 8);
  // Earlier small calls left words here: clear them first (on the stream,
  // so before this rank's dispatch, hence before any peer's combine).
  char *region = (char *)g.ctx.window_local + lay.comb_flag;
  CUDA_OK(cudaMemsetAsync(region, 0, w.size() * 8, g.stream));
  round_trip(bf16_flagged(), MEP_LL_TRANSPORT_LSA);
  if (HasFatalFailure()) return;
  CUDA_OK(cudaMemcpy(w.data(), region, w.size() * 8, cudaMemcpyDeviceToHost));
  size_t tagged = 0;
  for (uint64_t x : w) tagged += (x >> 32) != 0;
  EXPECT_GT(tagged, 0u) << "rank " << g_rank << ": no flagged word in set 0's comb_flag";
}
TEST_F(LlGpu, WeightedLsaBf16H7168FlaggedPartials) { weighted_round_trip(bf16_flagged(), MEP_LL_TRANSPORT_LSA); }
TEST_F(LlGpu, LsaFp8FlaggedAndLineSources) { round_trip(fp8_flag_edge(), MEP_LL_TRANSPORT_LSA); }
TEST_F(LlGpu, LsaBf16FlaggedPartialsFused) { round_trip(bf16_flagged(), MEP_LL_TRANSPORT_LSA, true); }
TEST_F(LlGpu, WeightedLsaFp8FlaggedAndLineSourcesFused) {
  weighted_ = 1;
  round_trip(fp8_flag_edge(), MEP_LL_TRANSPORT_LSA, true);
}
// Flagged, lines, flagged again on set 0 with other inputs: the last
// combine's words must be told from the first's (an older epoch) and the
// lines' receive must find no arrival left over by a flagged one.
TEST_F(LlGpu, LsaFlaggedLinesFlaggedOnOneSet) {
  round_trip(bf16_flagged(), MEP_LL_TRANSPORT_LSA);
  if (HasFatalFailure()) return;
  round_trip(kBf16Big, MEP_LL_TRANSPORT_LSA);
  if (HasFatalFailure()) return;
  round_trip(bf16_flagged(true), MEP_LL_TRANSPORT_LSA, true);
}
// Line partials whose last 240-channel step is cut at 232 channels
// (hidden 2152 = 8 * 240 + 232): there the flag lanes of groups 0 and 1
// carry channels and those of groups 2 and 3 none. Plain, fused, weighted.
Case bf16_lines_cut() {
  Case c = bf16_lines();
  c.hidden = 2152;
  c.seed = 31;
  return c;
}
TEST_F(LlGpu, LsaBf16LinesH2152CutLastStep) {
  round_trip(bf16_lines_cut(), MEP_LL_TRANSPORT_LSA);
  if (HasFatalFailure()) return;
  round_trip(bf16_lines_cut(), MEP_LL_TRANSPORT_LSA, true);
  if (HasFatalFailure()) return;
  weighted_round_trip(bf16_lines_cut(), MEP_LL_TRANSPORT_LSA);
}
TEST_F(LlGpu, WeightedLsaFp8FlaggedAndLineSources) { weighted_round_trip(fp8_flag_edge(), MEP_LL_TRANSPORT_LSA); }
TEST_F(LlGpu, WeightedGinEmuFp8H7168Top8ZeroTokensOnRank1) { weighted_round_trip(kFp8Big, MEP_LL_TRANSPORT_GIN_EMULATED); }
TEST_F(LlGpu, WeightedGinEmuFp8PackedI64H2176Top4E64) { weighted_round_trip(kFp8PackedI64Odd, MEP_LL_TRANSPORT_GIN_EMULATED); }
TEST_F(LlGpu, WeightedGinEmuBf16H2056Top1OneToken) { weighted_round_trip(kBf16Odd, MEP_LL_TRANSPORT_GIN_EMULATED); }
// Ranks differ: even ranks send weights, odd ranks do not; each source gets
// what it asked for in the same combine.
TEST_F(LlGpu, WeightedOnSomeRanksOnly) {
  weighted_ = g_rank % 2 == 0;
  for (int transport : {MEP_LL_TRANSPORT_LSA, MEP_LL_TRANSPORT_GIN_EMULATED}) {
    round_trip(kBf16Big, transport);
    round_trip(kFp8PackedI64Big, transport);
  }
}

TEST_F(LlGpu, MixedLayersBackToBack) {
  // Layers with different hidden/top_k on the same buffers, alternating transports.
  for (int i = 0; i < 3; ++i) {
    round_trip(kFp8PackedSmall, MEP_LL_TRANSPORT_LSA);
    round_trip(kBf16Big, MEP_LL_TRANSPORT_GIN_EMULATED);
    round_trip(kFp8Ue8m0, MEP_LL_TRANSPORT_LSA);
  }
}

// Two operations in flight: send set 0, send set 1, then both receives.
TEST_F(LlGpu, DoubleBufferedSplitSendRecv) {
  for (int transport : {MEP_LL_TRANSPORT_LSA, MEP_LL_TRANSPORT_GIN_EMULATED}) {
    Group &g = G();
    g.ctx.transport = transport;
    Case a = kFp8Big, b = kFp8Big;
    a.tokens = {128, 1};
    b.seed = 99;
    b.tokens = {0, 128};
    const Inputs ia = make_inputs(a, g_rank), ib = make_inputs(b, g_rank);
    // second input set lives in the combine output region of the big buffers
    void *xb, *tb, *wb;
    CUDA_OK(cudaMalloc(&xb, (size_t)kMaxTokens * kMaxHidden * 2));
    CUDA_OK(cudaMalloc(&tb, (size_t)kMaxTokens * kMaxTopK * 8));
    CUDA_OK(cudaMalloc(&wb, (size_t)kMaxTokens * kMaxTopK * 4));
    upload(a, g, ia, g.x, g.topk, g.w);
    upload(b, g, ib, xb, tb, wb);
    mep_ll_dispatch_args_t da = dargs(a, g, 0, g.x, g.topk, g.w),
                           db = dargs(b, g, 1, xb, tb, wb);
    MEP_OK(mep_ll_dispatch_send(&g.ctx, &da, g.stream));
    MEP_OK(mep_ll_dispatch_send(&g.ctx, &db, g.stream));
    MEP_OK(mep_ll_dispatch_recv(&g.ctx, &da, g.stream));
    CUDA_OK(cudaStreamSynchronize(g.stream));
    verify_dispatch_and_make_y(a, g, 5);
    mep_ll_combine_args_t ca = cargs(a, g, 0, g.topk, g.w);
    MEP_OK(mep_ll_combine_send(&g.ctx, &ca, g.stream));
    MEP_OK(mep_ll_combine_recv(&g.ctx, &ca, g.stream));
    CUDA_OK(cudaStreamSynchronize(g.stream));
    verify_combine(a, g, 5);
    MEP_OK(mep_ll_dispatch_recv(&g.ctx, &db, g.stream));
    CUDA_OK(cudaStreamSynchronize(g.stream));
    verify_dispatch_and_make_y(b, g, 6);
    mep_ll_combine_args_t cbb = cargs(b, g, 1, tb, wb);
    MEP_OK(mep_ll_combine_send(&g.ctx, &cbb, g.stream));
    MEP_OK(mep_ll_combine_recv(&g.ctx, &cbb, g.stream));
    CUDA_OK(cudaStreamSynchronize(g.stream));
    verify_combine(b, g, 6);
    ASSERT_EQ(g.rec->flag, 0) << rec_text();
    cudaFree(xb);
    cudaFree(tb);
    cudaFree(wb);
  }
}

// Two-batch overlap's order with double buffering, with the sets the
// runtime gives it (dispatch A set 0, combine A set 1, dispatch B set 0,
// combine B set 1): combine A's receive runs after dispatch B's send, and
// on rank 0 only once every other rank's combine B has reached rank 0's
// count signal (polled from the host, bounded: over LSA every block's
// arrival, over GIN-emulated the last block's add), while the other ranks
// go straight on to combine B on set 1. Combine B uses the other half of
// set 1's combine regions and signals (mep_ll_comb_half), so its partials
// and arrivals cannot land on what rank 0's combine A receive has yet to
// read: both combines are exact on every rank whatever the timing. Over LSA: weights
// at dispatch with combines of lines, then pushed weights with flagged
// combines (either way combine B's early relaxed arrival would pile onto
// combine A's count); over GIN-emulated, weights at dispatch. A fresh group: a failure
// would leave the sets out of step.
TEST_F(LlGpu, LateCombineReceiveIsNotOvertakenByTheNextCombineOnItsSet) {
  if (g_world < 2) GTEST_SKIP() << "needs a peer";
  ASSERT_NO_FATAL_FAILURE(use_fresh_group());
  Group &g = G();
  void *xb, *tb, *wb;
  CUDA_OK(cudaMalloc(&xb, (size_t)kMaxTokens * kMaxHidden * 2));
  CUDA_OK(cudaMalloc(&tb, (size_t)kMaxTokens * kMaxTopK * 8));
  CUDA_OK(cudaMalloc(&wb, (size_t)kMaxTokens * kMaxTopK * 4));
  const struct {
    int transport, weighted;
  } runs[] = {{MEP_LL_TRANSPORT_LSA, 1}, {MEP_LL_TRANSPORT_LSA, 0},
              {MEP_LL_TRANSPORT_GIN_EMULATED, 1}};
  for (const auto &run : runs) {
    g.ctx.transport = run.transport;
    weighted_ = run.weighted;
    const bool flagged = run.transport == MEP_LL_TRANSPORT_LSA && !run.weighted;
    Case a = flagged ? bf16_flagged() : kFp8Big, b = a;
    if (!flagged) a.tokens = {64, 96};
    b.tokens = flagged ? bf16_flagged(true).tokens : std::vector<int>{128, 37};
    b.seed = a.seed + 50;
    const Inputs ia = make_inputs(a, g_rank), ib = make_inputs(b, g_rank);
    upload(a, g, ia, g.x, g.topk, g.w);
    upload(b, g, ib, xb, tb, wb);
    mep_ll_dispatch_args_t da = dargs(a, g, 0, g.x, g.topk, g.w), db = dargs(b, g, 0, xb, tb, wb);
    MEP_OK(mep_ll_dispatch_send(&g.ctx, &da, g.stream));
    MEP_OK(mep_ll_dispatch_recv(&g.ctx, &da, g.stream));
    CUDA_OK(cudaStreamSynchronize(g.stream));
    ASSERT_EQ(g.rec->flag, 0) << rec_text();
    verify_dispatch_and_make_y(a, g, 5);
    // Rank 0's count signals of combine B's half on set 1 (the other
    // parity than combine A's epoch), read before any rank can send B:
    // that needs rank 0's dispatch B.
    uint32_t epoch_was = 0;  // set 1's epoch, block 0's copy (tag word R + 1)
    CUDA_OK(cudaMemcpy(&epoch_was, set_tags(g, 1) + (size_t)(g_world + 1) * 4, 4,
                       cudaMemcpyDeviceToHost));
    const int half_b = mep_ll_comb_half(mep_ll_next_epoch(mep_ll_next_epoch(epoch_was)));
    bool copied = true;  // every read of a count signal succeeded
    auto count_b = [&](int r) -> uint64_t {
      uint64_t v = 0;
      const char *sig = set_window(g, 1) + (size_t)mep_ll_sig_comb_cnt(&g.ctx.dims, half_b, r) * 8;
      copied = copied && cudaMemcpy(&v, sig, 8, cudaMemcpyDeviceToHost) == cudaSuccess;
      return v;
    };
    std::vector<uint64_t> before(g_world);
    for (int r = 0; r < g_world; ++r) before[r] = count_b(r);
    mep_ll_combine_args_t ca = cargs(a, g, 1, g.topk, g.w);
    MEP_OK(mep_ll_combine_send(&g.ctx, &ca, g.stream));
    MEP_OK(mep_ll_dispatch_send(&g.ctx, &db, g.stream));
    if (g_rank == 0) {
      CUDA_OK(cudaStreamSynchronize(g.stream));
      // Rank 1 checks combine A and dispatch B against the oracle on the
      // host before it sends combine B (the whole test, three runs, takes
      // about 8 s on 2 x H200): the deadline only ends a failing run.
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      // whether rank r's combine B is all in: LSA counts every block's
      // arrival (mep_ll_arrival_state), staged transports add once
      auto arrived = [&](int r) {
        const uint64_t v = count_b(r);
        uint64_t code = 0;
        return run.transport == MEP_LL_TRANSPORT_LSA
                   ? mep_ll_arrival_state(v - before[r], &code) == 1
                   : v != before[r];
      };
      for (int r = 1; r < g_world; ++r) {
        bool in = arrived(r);
        while (!in && copied && std::chrono::steady_clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
          in = arrived(r);
        }
        ASSERT_TRUE(copied) << "rank 0: reading its count signals failed";
        ASSERT_TRUE(in) << "rank 0: rank " << r << "'s combine B never fully reached half "
                        << half_b << " of set 1 before combine A's receive (transport "
                        << run.transport << ", signal " << count_b(r) << ", before "
                        << before[r] << ")";
      }
    }
    MEP_OK(mep_ll_combine_recv(&g.ctx, &ca, g.stream));
    CUDA_OK(cudaStreamSynchronize(g.stream));
    ASSERT_EQ(g.rec->flag, 0) << rec_text();
    verify_combine(a, g, 5);
    MEP_OK(mep_ll_dispatch_recv(&g.ctx, &db, g.stream));
    CUDA_OK(cudaStreamSynchronize(g.stream));
    ASSERT_EQ(g.rec->flag, 0) << rec_text();
    verify_dispatch_and_make_y(b, g, 6);
    mep_ll_combine_args_t cb = cargs(b, g, 1, tb, wb);
    MEP_OK(mep_ll_combine_send(&g.ctx, &cb, g.stream));
    MEP_OK(mep_ll_combine_recv(&g.ctx, &cb, g.stream));
    CUDA_OK(cudaStreamSynchronize(g.stream));
    ASSERT_EQ(g.rec->flag, 0) << rec_text();
    verify_combine(b, g, 6);
  }
  cudaFree(xb);
  cudaFree(tb);
  cudaFree(wb);
}

// The combine epoch comes round after MEP_LL_LAST_EPOCH (then 2): at the
// last combine of a cycle and the first of the next, as comb_weights and
// each half of comb_flag and comb_recv see them, each rank zeroes every
// word there that no rank writes in that combine (ll_combine_wrap.cuh).
// After one ordinary round, set 1's epoch copies are set so that its next
// combine has epoch MEP_LL_LAST_EPOCH - 1, and its regions are filled with
// NaN payloads of the epochs that next match there (comb_weights and the
// even halves 2, the odd halves 3; in comb_recv every line's flag word), as
// if left a cycle ago. Then four combines (epochs LAST - 1, LAST, 2, 3:
// flagged, mixed, lines, mixed the other way round; the last two at hidden
// 2176 and top-4, under the set's 7168 and top-8): each must be exact,
// and after each every word of comb_weights and of the combine's half of
// comb_flag must be 0 or carry its epoch, and so must every flag word of
// the combine's half of comb_recv. Dispatches on set 0, combines on set 1,
// as the runtime alternates them; pushed weights, flagged words and lines,
// so every region is in use. A fresh group.
TEST_F(LlGpu, LsaEpochWrapZeroesStaleWeightAndPartialWords) {
  ASSERT_NO_FATAL_FAILURE(use_fresh_group());
  Group &g = G();
  if (mep_ll_num_sets(&g.ctx.dims) < 2) GTEST_SKIP() << "needs two buffer sets";
  g.ctx.transport = MEP_LL_TRANSPORT_LSA;
  weighted_ = 0;
  auto run = [&](const Case &c) {
    ASSERT_NO_FATAL_FAILURE(dispatch_set0(c, g, MEP_LL_TRANSPORT_LSA));
    verify_dispatch_and_make_y(c, g, c.seed + 1);
    mep_ll_combine_args_t cb = cargs(c, g, 1, g.topk, g.w);
    MEP_OK(mep_ll_combine_send(&g.ctx, &cb, g.stream));
    MEP_OK(mep_ll_combine_recv(&g.ctx, &cb, g.stream));
    CUDA_OK(cudaStreamSynchronize(g.stream));
    ASSERT_EQ(g.rec->flag, 0) << rec_text();
    verify_combine(c, g, c.seed + 1);
  };
  ASSERT_NO_FATAL_FAILURE(run(kBf16Big));

  const mep_ll_set_layout_t lay = mep_ll_set_layout(&g.ctx.dims);
  const uint32_t tw = mep_ll_tag_words(g_world);
  std::vector<uint32_t> tags((size_t)MEP_LL_SHADOW_SLOTS * tw);  // set 1's copies
  char *tags1 = set_tags(g, 1);
  CUDA_OK(cudaMemcpy(tags.data(), tags1, tags.size() * 4, cudaMemcpyDeviceToHost));
  for (int b = 0; b < MEP_LL_SHADOW_SLOTS; ++b)
    tags[(size_t)b * tw + g_world + 1] = MEP_LL_LAST_EPOCH - 2;
  CUDA_OK(cudaMemcpy(tags1, tags.data(), tags.size() * 4, cudaMemcpyHostToDevice));
  // set 1's comb_weights, then both halves of comb_flag, as 8-byte words
  const uint64_t weight_words = (lay.comb_flag - lay.comb_weights) / 8;
  const uint64_t half_words = lay.comb_flag_half / 8;
  const uint64_t n = weight_words + 2 * half_words;
  ASSERT_EQ(lay.comb_flag + 2 * lay.comb_flag_half, lay.comb_weights + n * 8);
  std::vector<uint64_t> w(n);
  for (uint64_t i = 0; i < n; ++i) {
    if (i < weight_words)
      w[i] = (0x7fc12345ull << 32) | 2u;  // NaN weight, epoch 2
    else  // two NaN bf16, epoch 2 (even half) or 3 (odd half)
      w[i] = ((i < weight_words + half_words ? 2ull : 3ull) << 32) | 0x7fc17fc1u;
  }
  char *region = set_window(g, 1) + lay.comb_weights;
  CUDA_OK(cudaMemcpy(region, w.data(), n * 8, cudaMemcpyHostToDevice));
  // both halves of comb_recv as lines: NaN data, flag words (the last 8
  // bytes of every 128-byte line) of epoch 2 (even half) or 3 (odd half)
  const uint64_t line_words = lay.comb_recv_half / 8;  // per half
  std::vector<uint64_t> lw(2 * line_words);
  for (uint64_t i = 0; i < lw.size(); ++i) {
    const uint64_t e = i < line_words ? 2u : 3u;
    lw[i] = i % 16 == 15 ? (e << 32 | e) : 0x7fc17fc17fc17fc1ull;
  }
  char *lines = set_window(g, 1) + mep_ll_comb_recv_off(&lay, 0);
  CUDA_OK(cudaMemcpy(lines, lw.data(), lw.size() * 8, cudaMemcpyHostToDevice));
  CUDA_OK(cudaDeviceSynchronize());  // before any launch on the group's stream

  // Every word of comb_weights and of the epoch's half of comb_flag is 0 or
  // carries the epoch.
  auto check = [&](uint32_t epoch) {
    CUDA_OK(cudaMemcpy(w.data(), region, n * 8, cudaMemcpyDeviceToHost));
    const uint64_t half0 = weight_words + (epoch & 1u) * half_words;
    uint64_t bad = n;
    for (uint64_t i = 0; i < n && bad == n; ++i) {
      if (i >= weight_words && (i < half0 || i >= half0 + half_words)) continue;
      const uint32_t e = i < weight_words ? (uint32_t)w[i] : (uint32_t)(w[i] >> 32);
      if (w[i] != 0 && e != epoch) bad = i;
    }
    ASSERT_EQ(bad, n) << "rank " << g_rank << ": word " << bad << " of set 1's "
                      << (bad < weight_words ? "comb_weights" : "comb_flag") << " is 0x"
                      << std::hex << w[bad] << std::dec << " after the combine of epoch " << epoch;
    // the flag words (the last 8 bytes of every 128-byte line) of the
    // epoch's half of comb_recv
    CUDA_OK(cudaMemcpy(lw.data(), lines, lw.size() * 8, cudaMemcpyDeviceToHost));
    const uint64_t h0 = (epoch & 1u) * line_words, flag = (uint64_t)epoch << 32 | epoch;
    uint64_t bad_line = lw.size();
    for (uint64_t i = h0 + 15; i < h0 + line_words && bad_line == lw.size(); i += 16)
      if (lw[i] != 0 && lw[i] != flag) bad_line = i;
    ASSERT_EQ(bad_line, lw.size())
        << "rank " << g_rank << ": the flag word at word " << bad_line - h0 << " of set 1's comb_recv half "
        << (epoch & 1u) << " is 0x" << std::hex << lw[bad_line] << std::dec
        << " after the combine of epoch " << epoch;
  };
  const uint32_t epochs[] = {MEP_LL_LAST_EPOCH - 1, MEP_LL_LAST_EPOCH, 2u, 3u};
  // The new cycle's two combines on a narrower shape (hidden 2176, top-4):
  // the stale words past its rows and beyond its top_k's layout are the
  // ones the zeroing must reach there.
  auto narrow = [](Case c) {
    c.hidden = 2176;
    c.top_k = 4;
    return c;
  };
  for (int i = 0; i < 4; ++i) {
    const Case c[] = {bf16_flagged(), bf16_mixed_kinds(), narrow(bf16_lines()),
                      narrow(bf16_mixed_kinds(true))};
    ASSERT_NO_FATAL_FAILURE(run(c[i])) << "epoch " << epochs[i];
    ASSERT_NO_FATAL_FAILURE(check(epochs[i]));
  }
  CUDA_OK(cudaMemcpy(tags.data(), tags1, tags.size() * 4, cudaMemcpyDeviceToHost));
  EXPECT_EQ(tags[g_world + 1], 3u) << "rank " << g_rank << ": block 0's epoch copy after the wrap";
}

// Dispatch (send+recv) and combine (send+recv) captured as two graphs and
// replayed on changing inputs; every replay is checked.
TEST_F(LlGpu, GraphReplayChangingInputs) {
  for (int mode = 0; mode < 4; ++mode) {
    const int transport = mode % 2 ? MEP_LL_TRANSPORT_GIN_EMULATED : MEP_LL_TRANSPORT_LSA;
    weighted_ = mode / 2;
    Group &g = G();
    g.ctx.transport = transport;
    Case c = kFp8Big;
    c.tokens = {128, 128};
    cudaGraph_t gd, gc;
    cudaGraphExec_t ed, ec;
    mep_ll_dispatch_args_t d = dargs(c, g, 1, g.x, g.topk, g.w);
    mep_ll_combine_args_t cb = cargs(c, g, 1, g.topk, g.w);
    CUDA_OK(cudaStreamBeginCapture(g.stream, cudaStreamCaptureModeThreadLocal));
    MEP_OK(mep_ll_dispatch_send(&g.ctx, &d, g.stream));
    MEP_OK(mep_ll_dispatch_recv(&g.ctx, &d, g.stream));
    CUDA_OK(cudaStreamEndCapture(g.stream, &gd));
    CUDA_OK(cudaStreamBeginCapture(g.stream, cudaStreamCaptureModeThreadLocal));
    MEP_OK(mep_ll_combine_send(&g.ctx, &cb, g.stream));
    MEP_OK(mep_ll_combine_recv(&g.ctx, &cb, g.stream));
    CUDA_OK(cudaStreamEndCapture(g.stream, &gc));
    CUDA_OK(cudaGraphInstantiate(&ed, gd, 0));
    CUDA_OK(cudaGraphInstantiate(&ec, gc, 0));
    for (int rep = 0; rep < 4; ++rep) {
      c.seed = 1000 + rep;
      const Inputs in = make_inputs(c, g_rank);
      upload(c, g, in, g.x, g.topk, g.w);
      CUDA_OK(cudaGraphLaunch(ed, g.stream));
      CUDA_OK(cudaStreamSynchronize(g.stream));
      ASSERT_EQ(g.rec->flag, 0) << rec_text();
      verify_dispatch_and_make_y(c, g, 77 + rep);
      CUDA_OK(cudaGraphLaunch(ec, g.stream));
      CUDA_OK(cudaStreamSynchronize(g.stream));
      ASSERT_EQ(g.rec->flag, 0) << rec_text();
      verify_combine(c, g, 77 + rep);
    }
    cudaGraphExecDestroy(ed);
    cudaGraphExecDestroy(ec);
    cudaGraphDestroy(gd);
    cudaGraphDestroy(gc);
  }
}

// Every LSA dispatch rewrites its whole slot list at every destination
// (max_tokens * the group's top_k words) with its tag, whatever its own
// top_k: after a top-8 call and then a top-1 call on the same set, every
// word this rank received carries the top-1 call's tag, so no older word
// can come round to a later call's tag (mep_ll_list_word).
TEST_F(LlGpu, LsaListWordsAllCarryTheLastTag) {
  Group &g = G();
  round_trip(kFp8Big, MEP_LL_TRANSPORT_LSA);   // top-8
  round_trip(kBf16Odd, MEP_LL_TRANSPORT_LSA);  // top-1
  const mep_ll_set_layout_t lay = mep_ll_set_layout(&g.ctx.dims);
  const uint64_t list_bytes = mep_ll_list_bytes(&g.ctx.dims);
  const int words = g.ctx.dims.max_tokens * g.ctx.dims.top_k;
  std::vector<uint64_t> w(MEP_LL_LIST_HEAD_BYTES / 8 + words);
  for (int r = 0; r < g_world; ++r) {
    // set 0 starts the window; source r's list: head, padding, words
    const char *src = (const char *)g.ctx.window_local + lay.disp_list + r * list_bytes;
    CUDA_OK(cudaMemcpy(w.data(), src, w.size() * 8, cudaMemcpyDeviceToHost));
    const uint32_t tag = mep_ll_list_tag(w[0]);
    ASSERT_NE(tag, 0u) << "rank " << g_rank << " source " << r << ": no head written";
    for (int i = 0; i < words; ++i) {
      const uint64_t v = w[MEP_LL_LIST_HEAD_BYTES / 8 + i];
      ASSERT_EQ(mep_ll_list_tag(v), tag)
          << "rank " << g_rank << " source " << r << " word " << i << " of " << words
          << " (expert " << mep_ll_list_expert(v) << "): tag " << mep_ll_list_tag(v)
          << ", the head's " << tag;
    }
  }
}

// An expert repeated within tokens (the host backend refuses it at prepare,
// the nccl backend reports it after the dispatch; the kernels must stay
// exact and in bounds anyway): every rank sends max_tokens tokens naming
// expert 0 top_k times, so rank 0's expert 0 gets max_tokens * top_k hits
// per source. LSA: the expert list holds the first
// max_tokens and the receive marks the rest from the slot list; staged:
// the scan caps each source. Each source keeps its first max_tokens slots
// in (token, k) order, the rest route DROPPED. The fused kernel and the
// split kernels, LSA and GIN-emulated.
TEST_F(LlGpu, RepeatedExpertKeepsFirstMaxTokensPerSource) {
  for (int transport : {MEP_LL_TRANSPORT_LSA, MEP_LL_TRANSPORT_GIN_EMULATED}) {
    SCOPED_TRACE(transport == MEP_LL_TRANSPORT_LSA ? "lsa" : "gin_emulated");
    repeated_expert(transport);
    if (HasFatalFailure()) return;
  }
}

void LlGpu::repeated_expert(int transport) {
  Group &g = G();
  g.ctx.transport = transport;
  const int M = kMaxTokens, K = kMaxTopK, R = g_world;
  const Case c = {2048, K, kMaxExperts, 0, 0, 4, {M, M}, 21};
  Inputs in = make_inputs(c, g_rank);
  std::fill(in.topk.begin(), in.topk.end(), 0);
  upload(c, g, in, g.x, g.topk, g.w);
  // Rank 0's expert 0 after a dispatch: every source's first M slots.
  auto check = [&](int fused, uint64_t seed) {
    const int cap = R * M;
    int32_t cnt = -1;
    std::vector<int32_t> slot(cap), srcc(R);
    std::vector<mep_ll_route_t> route((size_t)R * M * K);
    CUDA_OK(cudaMemcpy(&cnt, g.recv_count, 4, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(slot.data(), g.slot_src, cap * 4, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(srcc.data(), g.src_count, R * 4, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(route.data(), g.route, route.size() * sizeof(mep_ll_route_t),
                       cudaMemcpyDeviceToHost));
    ASSERT_EQ(cnt, cap) << "fused " << fused << " seed " << seed;
    for (int r = 0; r < R; ++r) {
      ASSERT_EQ(srcc[r], M) << "fused " << fused << " source " << r;
      for (int j = 0; j < M; ++j)
        ASSERT_EQ(slot[r * M + j], MEP_LL_SLOT_PACK(r, j / K, j % K))
            << "fused " << fused << " source " << r << " slot " << j << " seed " << seed;
      for (int i = 0; i < M * K; ++i)
        ASSERT_EQ(route[(size_t)r * M * K + i].slot, i < M ? r * M + i : MEP_LL_ROUTE_DROPPED)
            << "fused " << fused << " source " << r << " word " << i << " seed " << seed;
    }
  };
  for (int fused = 0; fused < 2; ++fused) {
    mep_ll_dispatch_args_t d = dargs(c, g, 0, g.x, g.topk, g.w);
    if (fused) {
      MEP_OK(mep_ll_dispatch(&g.ctx, &d, g.stream));
    } else {
      MEP_OK(mep_ll_dispatch_send(&g.ctx, &d, g.stream));
      MEP_OK(mep_ll_dispatch_recv(&g.ctx, &d, g.stream));
    }
    CUDA_OK(cudaStreamSynchronize(g.stream));
    ASSERT_EQ(g.rec->flag, 0) << rec_text();
    if (g_rank == 0) check(fused, c.seed);
    // A combine keeps the ranks in step before the next dispatch on set 0.
    mep_ll_combine_args_t cb = cargs(c, g, 0, g.topk, g.w);
    MEP_OK(mep_ll_combine(&g.ctx, &cb, g.stream));
    CUDA_OK(cudaStreamSynchronize(g.stream));
    ASSERT_EQ(g.rec->flag, 0) << rec_text();
  }
}

// The LSA receive zeroes every expert-list word it read, so between calls
// the lists hold nothing: a word is zero or the current call's (no tag can
// come round). After mixed calls on set 0 (top-8 fp8, top-1 bf16, weighted;
// split kernels, then the fused ones), every expert-list word of set 0 in
// this rank's window is zero. A round trip on set 1 then keeps the peer
// from starting its next test's dispatch on set 0 before this check.
TEST_F(LlGpu, LsaExpertListsAreZeroAfterEveryReceive) {
  Group &g = G();
  round_trip(kFp8Big, MEP_LL_TRANSPORT_LSA);
  round_trip(kBf16Odd, MEP_LL_TRANSPORT_LSA);
  weighted_round_trip(kFp8Big, MEP_LL_TRANSPORT_LSA);
  auto fused = [&](int set) {
    const Inputs in = make_inputs(kFp8Big, g_rank);
    upload(kFp8Big, g, in, g.x, g.topk, g.w);
    mep_ll_dispatch_args_t d = dargs(kFp8Big, g, set, g.x, g.topk, g.w);
    mep_ll_combine_args_t cb = cargs(kFp8Big, g, set, g.topk, g.w);
    MEP_OK(mep_ll_dispatch(&g.ctx, &d, g.stream));
    MEP_OK(mep_ll_combine(&g.ctx, &cb, g.stream));
    CUDA_OK(cudaStreamSynchronize(g.stream));
    ASSERT_EQ(g.rec->flag, 0) << rec_text();
  };
  fused(0);
  const mep_ll_set_layout_t lay = mep_ll_set_layout(&g.ctx.dims);
  const uint64_t words = mep_ll_elist_bytes(&g.ctx.dims) / 8;
  std::vector<uint64_t> w((size_t)g.ctx.dims.local_experts * g_world * words);
  CUDA_OK(cudaMemcpy(w.data(), (const char *)g.ctx.window_local + lay.disp_elist, w.size() * 8,
                     cudaMemcpyDeviceToHost));
  size_t bad = w.size();
  for (size_t i = 0; i < w.size() && bad == w.size(); ++i)
    if (w[i] != 0) bad = i;
  if (mep_ll_num_sets(&g.ctx.dims) > 1) fused(1);
  ASSERT_EQ(bad, w.size()) << "rank " << g_rank << " set 0 local expert " << bad / words / g_world
                           << " source " << bad / words % g_world << " word " << bad % words
                           << ": " << w[bad] << " (tag " << mep_ll_list_tag(w[bad]) << ")";
}

// A corrupt or mismatched peer must not make the LSA receive index past a
// source's routes: after the send half, this rank's own expert list for the
// first token's expert is overwritten (keeping the call's tag), and the
// receive must refuse it with BAD_SIGNAL naming the source and the local
// expert, and write no slot. Set 0: a count word with more hits than the
// head's tokens * top_k allow; set 1: an entry whose token is past the
// head's tokens. EP1 only (the rank corrupts what it sent itself, with no
// peer in flight). The refused receives leave both sets out of step, so the
// test runs on a fresh group of its own.
TEST_F(LlGpu, CorruptExpertListIsRefusedWithBadSignal) {
  if (g_world != 1) GTEST_SKIP() << "EP1 only";
  ASSERT_NO_FATAL_FAILURE(use_fresh_group());
  Group &g = G();
  g.ctx.transport = MEP_LL_TRANSPORT_LSA;
  const Case c = kFp8Big;
  const int T = tokens_of(c, g_rank), K = c.top_k;
  const Inputs in = make_inputs(c, g_rank);
  upload(c, g, in, g.x, g.topk, g.w);
  const int le = (int)in.topk[0];  // EP1: every expert is local
  ASSERT_GE(le, 0);
  const mep_ll_set_layout_t lay = mep_ll_set_layout(&g.ctx.dims);
  for (int set = 0; set < 2 && set < mep_ll_num_sets(&g.ctx.dims); ++set) {
    SCOPED_TRACE(set == 0 ? "count word" : "entry");
    ASSERT_NO_FATAL_FAILURE(clear_record());
    mep_ll_dispatch_args_t d = dargs(c, g, set, g.x, g.topk, g.w);
    MEP_OK(mep_ll_dispatch_send(&g.ctx, &d, g.stream));
    CUDA_OK(cudaStreamSynchronize(g.stream));
    // expert list (le, source 0): the count word, then the entries
    uint64_t *list = (uint64_t *)(set_window(g, set) + lay.disp_elist +
                                  (uint64_t)le * mep_ll_elist_bytes(&g.ctx.dims));
    uint64_t count = 0;
    CUDA_OK(cudaMemcpy(&count, list, 8, cudaMemcpyDeviceToHost));
    const uint32_t tag = mep_ll_list_tag(count);
    ASSERT_NE(tag, 0u) << "set " << set << ": no count word for expert " << le;
    ASSERT_GE(mep_ll_elist_hits(count), 1u) << "token 0 names expert " << le;
    const uint64_t bad = set == 0 ? mep_ll_elist_count((uint32_t)(T * K + 1), T, tag)
                                  : mep_ll_elist_entry(T, 0, tag);
    CUDA_OK(cudaMemcpy(list + (set == 0 ? 0 : 1), &bad, 8, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(g.recv_count, 0xff, (size_t)c.experts * 4));
    CUDA_OK(cudaStreamSynchronize(cudaStreamLegacy));  // both landed before the launch
    MEP_OK(mep_ll_dispatch_recv(&g.ctx, &d, g.stream));
    CUDA_OK(cudaStreamSynchronize(g.stream));
    ASSERT_EQ(g.rec->flag, 2) << "set " << set << ": the receive took the corrupt word " << bad;
    EXPECT_EQ(g.rec->op, MEP_LL_OP_BAD_SIGNAL) << rec_text();
    EXPECT_EQ(g.rec->peer, 0) << rec_text();
    EXPECT_EQ(g.rec->expert, le) << rec_text();
    EXPECT_EQ(g.rec->seen, bad) << rec_text();
    int32_t cnt = 0;
    CUDA_OK(cudaMemcpy(&cnt, g.recv_count + le, 4, cudaMemcpyDeviceToHost));
    if (set == 0) {
      EXPECT_EQ(cnt, 0) << "expert " << le << ": a refused count fills no slot";
    }
  }
}

// Rank 1 skips a dispatch: every other rank's receive waits for it, must
// record a timeout naming itself as the waiting rank and rank 1 as the
// peer, and return within the (300 ms) timeout. On a fresh group of its
// own: the skipped call leaves that group's ranks out of step.
TEST_F(LlGpu, AbsentPeerTimesOutOnEveryWaitingRank) {
  if (g_world < 2) GTEST_SKIP() << "needs 2 ranks";
  ASSERT_NO_FATAL_FAILURE(use_fresh_group());
  Group &g = G();
  g.ctx.transport = MEP_LL_TRANSPORT_LSA;
  const Case c = kBf16Odd;
  if (g_rank == 1) return;  // the absent peer (it still frees the group in TearDown)
  MEP_OK(mep_ll_timeout_cycles(g_rank, 300, &g.ctx.timeout_cycles));
  const Inputs in = make_inputs(c, g_rank);
  upload(c, g, in, g.x, g.topk, g.w);
  mep_ll_dispatch_args_t d = dargs(c, g, 0, g.x, g.topk, g.w);
  const auto t0 = std::chrono::steady_clock::now();
  MEP_OK(mep_ll_dispatch_send(&g.ctx, &d, g.stream));
  MEP_OK(mep_ll_dispatch_recv(&g.ctx, &d, g.stream));
  CUDA_OK(cudaStreamSynchronize(g.stream));
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(g.rec->flag, 2) << "rank " << g_rank << ": no timeout recorded while rank 1 was absent";
  // LSA receives read the slot lists first: the missing peer shows there.
  EXPECT_TRUE(g.rec->op == MEP_LL_OP_DISPATCH_LIST || g.rec->op == MEP_LL_OP_DISPATCH_RECV)
      << "rank " << g_rank << ": " << rec_text();
  EXPECT_EQ(g.rec->rank, g_rank) << "the record must name the rank that waited: " << rec_text();
  EXPECT_EQ(g.rec->peer, 1) << "rank " << g_rank << ": the record must name the absent rank: "
                            << rec_text();
  printf("TIMEOUT record on rank %d: op %d rank %d peer %d expert %d set %d expected %llu seen %llu after %.0f ms\n",
         g_rank, g.rec->op, g.rec->rank, g.rec->peer, g.rec->expert, g.rec->buffer_set,
         (unsigned long long)g.rec->expected, (unsigned long long)g.rec->seen, ms);
  EXPECT_LT(ms, 5000) << "rank " << g_rank;
}

// An absent peer at combine: over LSA a combine whose dispatch carried no
// weights waits in its send half for the other ranks' pushed weights; with
// rank 1 gone after the dispatch that wait expires and is recorded as
// COMBINE_WEIGHTS, naming the rank that waited and the absent one.
TEST_F(LlGpu, AbsentPeerAtCombineTimesOutInTheSendHalf) {
  if (g_world < 2) GTEST_SKIP() << "needs 2 ranks";
  // kBf16Big: rank 1 routes tokens to rank 0's experts
  combine_without_rank1(kBf16Big, false, MEP_LL_OP_COMBINE_WEIGHTS);
}

// An absent peer at a flagged combine (LSA, at most mep_ll_flag_tokens
// tokens, weights at dispatch so the send half waits for nothing): the
// receive waits every rank's count before it reads a word, whether or not
// this rank's tokens reach the peer, so the absent rank shows as
// COMBINE_RECV naming both ranks, within the timeout.
TEST_F(LlGpu, AbsentPeerAtFlaggedCombineTimesOutOnItsCount) {
  if (g_world < 2) GTEST_SKIP() << "needs 2 ranks";
  ASSERT_LE(bf16_flagged().tokens[0], mep_ll_flag_tokens(&G().ctx.dims));
  weighted_ = 1;
  combine_without_rank1(bf16_flagged(), true, MEP_LL_OP_COMBINE_RECV);
}

// A combine called with fewer tokens than its dispatch sent, so few that
// this rank takes flagged partials while every expert rank, which counts
// the dispatch's tokens, sends lines: the receive checks each sender's
// arrival code against its own view before it reads a word, and must stop
// with BAD_SIGNAL (expected the flagged code 2, seen the lines' code 1)
// naming this rank, not wait for words that never come. Every rank
// does the same; on a fresh group (the refused receive leaves it out of
// step).
TEST_F(LlGpu, FlaggedReceiveOfLinePartialsIsBadSignal) {
  ASSERT_NO_FATAL_FAILURE(use_fresh_group());
  Group &g = G();
  weighted_ = 1;  // weights at dispatch: the send half waits for nothing
  const Case c = kBf16Big;
  ASSERT_GT(tokens_of(c, g_rank), mep_ll_flag_tokens(&g.ctx.dims));
  ASSERT_NO_FATAL_FAILURE(dispatch_set0(c, g, MEP_LL_TRANSPORT_LSA));
  MEP_OK(mep_ll_timeout_cycles(g_rank, 300, &g.ctx.timeout_cycles));
  mep_ll_combine_args_t cb = cargs(c, g, 0, g.topk, g.w);
  cb.num_tokens = mep_ll_flag_tokens(&g.ctx.dims) / 2;
  MEP_OK(mep_ll_combine(&g.ctx, &cb, g.stream));
  CUDA_OK(cudaStreamSynchronize(g.stream));
  ASSERT_EQ(g.rec->flag, 2) << "rank " << g_rank << ": the mismatched combine recorded nothing";
  EXPECT_EQ(g.rec->op, MEP_LL_OP_BAD_SIGNAL) << "rank " << g_rank << ": " << rec_text();
  EXPECT_EQ(g.rec->rank, g_rank) << rec_text();
  EXPECT_EQ(g.rec->buffer_set, 0) << "rank " << g_rank << ": " << rec_text();
  EXPECT_GE(g.rec->peer, 0) << "rank " << g_rank << ": " << rec_text();
  EXPECT_LT(g.rec->peer, g_world) << "rank " << g_rank << ": " << rec_text();
  // The codes: flagged words expected, lines seen (the low two bits), the
  // same dispatch answered (mep_ll_comb_code: the bits above).
  EXPECT_EQ(g.rec->expected & 3u, 2u) << "rank " << g_rank << ": " << rec_text();
  EXPECT_EQ(g.rec->seen & 3u, 1u) << "rank " << g_rank << ": " << rec_text();
  EXPECT_EQ(g.rec->expected >> 2, g.rec->seen >> 2) << "rank " << g_rank << ": " << rec_text();
}

// GIN cannot run without an RDMA NIC: asking for it must fail cleanly with
// NCCL's reason (or succeed where GIN exists). Its own window on the
// shared communicator, released before the next test.
TEST_F(LlGpu, GinRequestWithoutNicFailsClearly) {
  if (!getenv("MOE_EP_TEST_GIN")) GTEST_SKIP() << "set MOE_EP_TEST_GIN=1 (collective NCCL setup)";
  mep_nccl_params_t p = {};
  p.rank = g_rank;
  p.world = g_world;
  p.cuda_device = g_rank;
  p.timeout_ms = 30000;
  p.transport = MOE_EP_TRANSPORT_GIN;
  p.window_bytes = 1 << 20;
  p.gin_signal_count = 64;
  p.adopt_comm = mep_nccl_comm(G().nccl);
  mep_nccl_t *n = nullptr;
  moe_ep_status_t st = mep_nccl_create(&p, &n);
  printf("GIN request on rank %d: status %d: %s\n", g_rank, (int)st, st ? mep_last_error() : "ok");
  if (st == MOE_EP_OK) {
    mep_nccl_destroy(n, 0);
  } else {
    EXPECT_EQ(st, MOE_EP_ERR_NCCL);
  }
}

}  // namespace

int main(int argc, char **argv) {
  const char *r = getenv("MOE_EP_RANK"), *w = getenv("MOE_EP_WORLD_SIZE");
  if (!r || !w) return spawn_ranks(argv, "ll_gpu_test");
  g_rank = atoi(r);
  g_world = atoi(w);
  setvbuf(stdout, nullptr, _IONBF, 0);  // nothing lost if the rank is killed
  ::testing::InitGoogleTest(&argc, argv);
  if (cudaSetDevice(g_rank) != cudaSuccess) return 6;
  g_group = group_create(nullptr);
  if (g_group == nullptr) return 3;
  const int rc = RUN_ALL_TESTS();
  group_free(g_group);  // collective; every test left its waits bounded
  return rc;
}
