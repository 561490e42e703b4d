// ll_gpu_test.cc: multi-process GPU test of the LL data path (one process per
// GPU, re-exec'd by the parent with MOE_EP_RANK/MOE_EP_WORLD_SIZE): NCCL setup
// through runtime/nccl, dispatch + combine over LSA and GIN-emulated checked
// against a CPU reference built from every rank's seeds (fp8 bytes and scales
// exactly against tests/oracle's quantizer), double buffering, CUDA graph
// replays, a timeout record, and a latency micro-benchmark. Runs with any
// world size, 1 included (MOE_EP_TEST_WORLD=1, or a 1-GPU machine).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "kernels/ll.h"
#include "runtime/error.h"
#include "runtime/nccl/nccl_setup.h"
#include "tests/oracle/quant.h"

extern char **environ;

namespace {

#define CUDA_OK(x)                                                                   \
  do {                                                                               \
    cudaError_t e_ = (x);                                                            \
    ASSERT_EQ(e_, cudaSuccess) << #x << ": " << cudaGetErrorString(e_);              \
  } while (0)
#define MEP_OK(x) ASSERT_EQ((x), MOE_EP_OK) << #x << ": " << mep_kernels_last_error()

int g_rank = 0, g_world = 1;
const int kMaxTokens = 128, kMaxHidden = 7168, kMaxTopK = 8, kMaxExperts = 256;

// ---- reference helpers ----------------------------------------------------
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
float unit(uint64_t h) { return (float)((h >> 40) & 0xffffff) / 16777216.0f; }  // [0,1)
uint16_t f2bf(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
float bf2f(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
float e4m3_to_f(uint8_t b) {
  const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
  float v = e == 0 ? std::ldexp((float)m, -9) : std::ldexp(1.0f + m / 8.0f, e - 7);
  return s ? -v : v;
}
struct Case {
  int hidden, top_k, experts, fp8, scale_mode, idx_bytes;
  std::vector<int> tokens;  // per rank
  uint64_t seed;
  // Hot routing: slot k of every token names expert k, so every slot lands
  // on rank 0's first top_k experts (expert lists of many pieces; on a
  // 1-SM grid, one receive block holds all of them).
  bool hot = false;
};

int tokens_of(const Case &c, int r) { return c.tokens[r % c.tokens.size()]; }

// Inputs of rank r, reproducible on every rank.
struct Inputs {
  std::vector<uint16_t> x;      // [T, H]
  std::vector<int64_t> topk;    // [T, K]
  std::vector<float> w;         // [T, K]
};
Inputs make_inputs(const Case &c, int r) {
  Inputs in;
  const int T = tokens_of(c, r), H = c.hidden, K = c.top_k;
  in.x.resize((size_t)T * H);
  in.topk.resize((size_t)T * K);
  in.w.resize((size_t)T * K);
  for (int t = 0; t < T; ++t) {
    const float amp = 0.01f + 4.0f * unit(mix(c.seed ^ (r * 131 + t)));
    for (int h = 0; h < H; ++h)
      in.x[(size_t)t * H + h] =
          f2bf(amp * (2.0f * unit(mix(c.seed * 7 + ((uint64_t)r << 40) + (uint64_t)t * H + h)) - 1.0f));
    std::vector<int> chosen;
    for (int k = 0; k < K; ++k) {
      const uint64_t h = mix(c.seed * 13 + ((uint64_t)r << 32) + (uint64_t)t * 64 + k);
      int e = -1;
      if (h % 9 != 0) {  // ~1/9 of slots are -1
        e = (int)((h >> 8) % c.experts);
        while (std::find(chosen.begin(), chosen.end(), e) != chosen.end()) e = (e + 1) % c.experts;
        chosen.push_back(e);
      }
      if (c.hot) e = k;
      in.topk[(size_t)t * K + k] = e;
      in.w[(size_t)t * K + k] = 0.1f + unit(h * 3);
    }
  }
  return in;
}
// Expert output row for (source rank, token, global expert): what "y" holds.
float y_val(uint64_t seed, int r, int t, int e, int h) {
  return 2.0f * unit(mix(seed ^ ((uint64_t)r << 50) ^ ((uint64_t)t << 36) ^ ((uint64_t)e << 20) ^ (uint64_t)h)) - 1.0f;
}

// ---- the group -------------------------------------------------------------
moe_ep_status_t file_exchange(void *user, int32_t rank, int32_t world, void *uid, size_t n) {
  const std::string dir = (const char *)user;
  const std::string path = dir + "/nccl_uid", tmp = path + ".tmp";
  if (rank == 0) {
    FILE *f = fopen(tmp.c_str(), "wb");
    if (!f || fwrite(uid, 1, n, f) != n) return mep_error(MOE_EP_ERR_BOOTSTRAP, "cannot write %s", tmp.c_str());
    fclose(f);
    rename(tmp.c_str(), path.c_str());
    return MOE_EP_OK;
  }
  for (int i = 0; i < 6000; ++i) {
    FILE *f = fopen(path.c_str(), "rb");
    if (f) {
      size_t got = fread(uid, 1, n, f);
      fclose(f);
      if (got == n) return MOE_EP_OK;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return mep_error(MOE_EP_ERR_BOOTSTRAP, "no unique id at %s after 60 s", path.c_str());
}

struct Group {
  mep_nccl_t *nccl = nullptr;
  mep_ll_ctx_t ctx = {};
  mep_ll_error_record_t *rec = nullptr;
  cudaStream_t stream = nullptr;
  // device buffers, sized for the maxima
  void *x = nullptr, *topk = nullptr, *w = nullptr, *recv_x = nullptr, *scales = nullptr,
       *y = nullptr, *out = nullptr;
  int32_t *recv_count = nullptr, *slot_src = nullptr, *src_count = nullptr;
  mep_ll_route_t *route = nullptr;
  int32_t *src_tokens = nullptr;
  size_t slots = 0;
};
Group *g_group = nullptr;

class LlGpu : public ::testing::Test {
 protected:
  // This rank's dispatches carry topk_weights, so its combines receive
  // partials pre-reduced on the experts' ranks (ranks may differ).
  int weighted_ = 0;
  Group &G() { return *g_group; }
  // Each test starts with no timeout record and no abort flag, so one
  // failure does not cascade into the next test.
  static void clear_record() {
    memset((void *)g_group->rec, 0, sizeof *g_group->rec);
    ASSERT_EQ(mep_ll_clear_abort(&g_group->ctx, g_group->stream), MOE_EP_OK);
    ASSERT_EQ(cudaStreamSynchronize(g_group->stream), cudaSuccess);
  }
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(clear_record());
    fprintf(stderr, "rank %d: start %s\n", g_rank,
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  static std::string rec_text() {
    const mep_ll_error_record_t *r = g_group->rec;
    char b[256];
    snprintf(b, sizeof b, "timeout record flag %d op %d rank %d peer %d expert %d set %d expected %llu seen %llu",
             r->flag, r->op, r->rank, r->peer, r->expert, r->buffer_set,
             (unsigned long long)r->expected, (unsigned long long)r->seen);
    return b;
  }
  int local_experts(const Case &c) { return c.experts / g_world; }

  void upload(const Case &c, Group &g, const Inputs &in, void *x, void *topk, void *w) {
    const int T = tokens_of(c, g_rank);
    if (T == 0) return;
    ASSERT_EQ(cudaMemcpy(x, in.x.data(), in.x.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
    if (c.idx_bytes == 8) {
      ASSERT_EQ(cudaMemcpy(topk, in.topk.data(), in.topk.size() * 8, cudaMemcpyHostToDevice), cudaSuccess);
    } else {
      std::vector<int32_t> t32(in.topk.begin(), in.topk.end());
      ASSERT_EQ(cudaMemcpy(topk, t32.data(), t32.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    }
    ASSERT_EQ(cudaMemcpy(w, in.w.data(), in.w.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  }

  mep_ll_dispatch_args_t dargs(const Case &c, Group &g, int set, void *x, void *topk, void *w) {
    mep_ll_dispatch_args_t a = {};
    a.x = x;
    a.topk_idx = topk;
    a.topk_idx_bytes = c.idx_bytes;
    a.num_tokens = tokens_of(c, g_rank);
    a.hidden = c.hidden;
    a.top_k = c.top_k;
    a.num_experts = c.experts;
    a.fp8 = c.fp8;
    a.scale_mode = c.scale_mode;
    a.buffer_set = set;
    a.recv_x = g.recv_x;
    a.recv_scales = g.scales;
    a.recv_count = g.recv_count;
    a.slot_src = g.slot_src;
    a.src_count = g.src_count;
    a.route = g.route;
    a.src_tokens = g.src_tokens;
    a.weighted = weighted_;
    a.topk_weights = weighted_ ? (const float *)w : nullptr;
    return a;
  }
  mep_ll_combine_args_t cargs(const Case &c, Group &g, int set, void *topk, void *w) {
    mep_ll_combine_args_t a = {};
    a.y = g.y;
    a.topk_idx = topk;
    a.topk_idx_bytes = c.idx_bytes;
    a.topk_weights = (const float *)w;
    a.out = g.out;
    a.num_tokens = tokens_of(c, g_rank);
    a.hidden = c.hidden;
    a.top_k = c.top_k;
    a.num_experts = c.experts;
    a.buffer_set = set;
    a.recv_count = g.recv_count;
    a.slot_src = g.slot_src;
    a.src_count = g.src_count;
    a.route = g.route;
    a.src_tokens = g.src_tokens;
    a.partials = weighted_;
    // Weighted: the source side must not need its weights any more.
    if (weighted_) a.topk_weights = nullptr;
    return a;
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
              if (memcmp(&rx[s * row_bytes], xr, row_bytes) != 0 && bad++ < 3)
                ADD_FAILURE() << "bf16 row differs: rank " << g_rank << " expert " << le << " slot " << i;
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
                  if (std::fabs(q - xv) > std::fabs(xv) * 0.0625f + got_sc * 0.002f + 1e-7f && bad++ < 3)
                    ADD_FAILURE() << "fp8 value " << q << " want ~" << xv << " rank " << g_rank
                                  << " expert " << le << " slot " << i << " channel " << h;
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
        ASSERT_EQ(srcc[(size_t)le * g_world + r], from_r) << "src_count rank " << g_rank << " expert " << le << " src " << r;
      }
      ASSERT_EQ(cnt[le], i) << "recv_count rank " << g_rank << " expert " << le << " seed " << c.seed;
    }
    ASSERT_EQ(bad, 0);
    ASSERT_EQ(cudaMemcpy(g.y, yh.data(), yh.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  }

  // Expected out[t][h], exactly as documented: per slot w * y (fmaf, k
  // ascending, from 0) in f32; with partials, one such sum per expert rank
  // rounded to bf16, the partials added in f32 (from 0) in the order the
  // ranks first appear in the token's top-k, then bf16.
  float expected_out(const Case &c, const Inputs &in, uint64_t y_seed, int t, int h) {
    const int K = c.top_k, EL = local_experts(c);
    auto y = [&](int e) { return bf2f(f2bf(y_val(y_seed, g_rank, t, e, h))); };
    float acc = 0;
    if (!weighted_) {
      for (int k = 0; k < K; ++k) {
        const int e = (int)in.topk[(size_t)t * K + k];
        if (e >= 0) acc = std::fmaf(in.w[(size_t)t * K + k], y(e), acc);
      }
      return bf2f(f2bf(acc));
    }
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
    ASSERT_EQ(bad, 0);
  }

  void repeated_expert(int transport);  // RepeatedExpertKeepsFirstMaxTokensPerSource
  // Weights carried by dispatch: combine pre-reduced on the experts' ranks.
  void weighted_round_trip(const Case &c, int transport) {
    weighted_ = 1;
    round_trip(c, transport);
  }
  void round_trip(const Case &c, int transport) {
    Group &g = G();
    g.ctx.transport = transport;
    const Inputs in = make_inputs(c, g_rank);
    upload(c, g, in, g.x, g.topk, g.w);
    mep_ll_dispatch_args_t d = dargs(c, g, 0, g.x, g.topk, g.w);
    MEP_OK(mep_ll_dispatch_send(&g.ctx, &d, g.stream));
    MEP_OK(mep_ll_dispatch_recv(&g.ctx, &d, g.stream));
    CUDA_OK(cudaStreamSynchronize(g.stream));
    ASSERT_EQ(g.rec->flag, 0) << rec_text();
    verify_dispatch_and_make_y(c, g, c.seed + 1);
    mep_ll_combine_args_t cb = cargs(c, g, 0, g.topk, g.w);
    MEP_OK(mep_ll_combine_send(&g.ctx, &cb, g.stream));
    MEP_OK(mep_ll_combine_recv(&g.ctx, &cb, g.stream));
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
TEST_F(LlGpu, GinEmuBf16H2056Top1OneToken) { round_trip(kBf16Odd, MEP_LL_TRANSPORT_GIN_EMULATED); }
// Every slot on rank 0's experts 0..7 (run_device.sh also runs these on a
// 1-SM grid: every local expert, and 2048 slots, in one receive block).
TEST_F(LlGpu, LsaFp8HotExperts) { round_trip(kFp8Hot, MEP_LL_TRANSPORT_LSA); }
TEST_F(LlGpu, GinEmuFp8HotExperts) { round_trip(kFp8Hot, MEP_LL_TRANSPORT_GIN_EMULATED); }
TEST_F(LlGpu, WeightedLsaFp8HotExperts) { weighted_round_trip(kFp8Hot, MEP_LL_TRANSPORT_LSA); }
// Weights carried by dispatch: combine pre-reduced on the experts' ranks.
TEST_F(LlGpu, WeightedLsaBf16H7168Top8E256) { weighted_round_trip(kBf16Big, MEP_LL_TRANSPORT_LSA); }
TEST_F(LlGpu, WeightedLsaFp8H7168Top8ZeroTokensOnRank1) { weighted_round_trip(kFp8Big, MEP_LL_TRANSPORT_LSA); }
TEST_F(LlGpu, WeightedLsaBf16H2056Top1OneToken) { weighted_round_trip(kBf16Odd, MEP_LL_TRANSPORT_LSA); }
TEST_F(LlGpu, WeightedLsaFp8PackedI64H2176Top4E64) { weighted_round_trip(kFp8PackedI64Odd, MEP_LL_TRANSPORT_LSA); }
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

template <typename V>
double median(std::vector<V> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// 128 tokens, hidden 7168, top-8, 256 experts, fp8 dispatch / bf16 combine.
TEST_F(LlGpu, Bench) {
  Group &g = G();
  Case c = kFp8Big;
  c.tokens = {128, 128};
  const Inputs in = make_inputs(c, g_rank);
  upload(c, g, in, g.x, g.topk, g.w);
  for (int mode = 0; mode < 4; ++mode) {
    const int transport = mode % 2 ? MEP_LL_TRANSPORT_GIN_EMULATED : MEP_LL_TRANSPORT_LSA;
    weighted_ = mode / 2;
    g.ctx.transport = transport;
    mep_ll_dispatch_args_t d = dargs(c, g, 0, g.x, g.topk, g.w);
    mep_ll_combine_args_t cb = cargs(c, g, 0, g.topk, g.w);
    cudaEvent_t e0, e1, e2;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaEventCreate(&e2);
    std::vector<float> td, tc;
    for (int it = 0; it < 220; ++it) {
      cudaEventRecord(e0, g.stream);
      MEP_OK(mep_ll_dispatch_send(&g.ctx, &d, g.stream));
      MEP_OK(mep_ll_dispatch_recv(&g.ctx, &d, g.stream));
      cudaEventRecord(e1, g.stream);
      MEP_OK(mep_ll_combine_send(&g.ctx, &cb, g.stream));
      MEP_OK(mep_ll_combine_recv(&g.ctx, &cb, g.stream));
      cudaEventRecord(e2, g.stream);
      CUDA_OK(cudaEventSynchronize(e2));
      float a, b;
      cudaEventElapsedTime(&a, e0, e1);
      cudaEventElapsedTime(&b, e1, e2);
      if (it >= 20) {
        td.push_back(a * 1000);
        tc.push_back(b * 1000);
      }
    }
    ASSERT_EQ(g.rec->flag, 0) << rec_text();
    std::sort(td.begin(), td.end());
    std::sort(tc.begin(), tc.end());
    printf("BENCH rank %d transport %s %s sms %d: dispatch(fp8) median %.1f us p99 %.1f us | "
           "combine(bf16) median %.1f us p99 %.1f us\n",
           g_rank, transport == MEP_LL_TRANSPORT_LSA ? "lsa" : "gin_emulated",
           weighted_ ? "partials" : "per-slot", g.ctx.num_sms,
           median(td), td[td.size() * 99 / 100], median(tc), tc[tc.size() * 99 / 100]);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaEventDestroy(e2);
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

// An expert repeated within tokens (the public API refuses it at prepare;
// the kernels must stay exact and in bounds anyway): every rank sends
// max_tokens tokens naming expert 0 top_k times, so rank 0's expert 0 gets
// max_tokens * top_k hits per source. LSA: the expert list holds the first
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

// Where the fused dispatch's time goes: every block stamps %globaltimer at
// each phase boundary (mep_ll_ctx_t.stamps); per launch, each phase's
// min / median / max over blocks relative to the launch's first entry,
// then the median of those over launches. A diagnostic print, no assert
// on time (tools/bench/RESULTS.md quotes it); the outputs are still checked.
TEST_F(LlGpu, BenchPhaseStamps) {
  Group &g = G();
  const int grid_max = 256, P = MEP_LL_STAMP_POINTS;
  uint64_t *stamps = nullptr;
  CUDA_OK(cudaMalloc((void **)&stamps, grid_max * P * 8));
  for (int tokens : {1, 128}) {
    Case c = kFp8Big;
    c.tokens = {tokens, tokens};
    weighted_ = 1;
    g.ctx.transport = MEP_LL_TRANSPORT_LSA;
    const Inputs in = make_inputs(c, g_rank);
    upload(c, g, in, g.x, g.topk, g.w);
    mep_ll_dispatch_args_t d = dargs(c, g, 0, g.x, g.topk, g.w);
    mep_ll_combine_args_t cb = cargs(c, g, 0, g.topk, g.w);
    // per point: per-launch (min, median, max) over the blocks that reach it
    std::vector<std::vector<double>> lo(P), mid(P), hi(P);
    std::vector<double> ev;
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    std::vector<uint64_t> h(grid_max * P);
    for (int it = 0; it < 120; ++it) {
      CUDA_OK(cudaMemsetAsync(stamps, 0, grid_max * P * 8, g.stream));
      g.ctx.stamps = stamps;
      cudaEventRecord(e0, g.stream);
      MEP_OK(mep_ll_dispatch(&g.ctx, &d, g.stream));
      cudaEventRecord(e1, g.stream);
      g.ctx.stamps = nullptr;
      MEP_OK(mep_ll_combine(&g.ctx, &cb, g.stream));
      CUDA_OK(cudaStreamSynchronize(g.stream));
      ASSERT_EQ(g.rec->flag, 0) << rec_text();
      if (it < 20) continue;
      float ms;
      cudaEventElapsedTime(&ms, e0, e1);
      ev.push_back(ms * 1000);
      CUDA_OK(cudaMemcpy(h.data(), stamps, h.size() * 8, cudaMemcpyDeviceToHost));
      uint64_t t0 = UINT64_MAX;
      for (int b = 0; b < grid_max; ++b)
        if (h[b * P] != 0) t0 = std::min(t0, h[b * P]);
      for (int i = 0; i < P; ++i) {
        std::vector<double> v;
        for (int b = 0; b < grid_max; ++b) {
          if (i == MEP_LL_STAMP_WORD_WAITS) {
            if (h[b * P + MEP_LL_STAMP_ENTRY] != 0) v.push_back((double)h[b * P + i]);
          } else if (h[b * P + i] != 0) {
            v.push_back((h[b * P + i] - t0) / 1000.0);
          }
        }
        if (v.empty()) continue;
        std::sort(v.begin(), v.end());
        lo[i].push_back(v.front());
        mid[i].push_back(v[v.size() / 2]);
        hi[i].push_back(v.back());
      }
    }
    static const char *names[] = {"entry",  "sent",   "signalled", "heads",     "scanned",
                                  "seen",   "copied", "done",      "word waits", "1st words",
                                  "1st step", "counts"};
    static_assert(sizeof(names) / sizeof(names[0]) == MEP_LL_STAMP_POINTS, "a name per point");
    printf("PHASES rank %d tokens %d fused dispatch: event median %.1f us; per phase, us after "
           "the first block's entry (min / median / max over blocks; medians of 100 launches; "
           "word waits: a count per block)\n",
           g_rank, tokens, median(ev));
    for (int i = 0; i < P; ++i)
      if (!mid[i].empty())
        printf("PHASES rank %d tokens %d %-9s %6.2f %6.2f %6.2f\n", g_rank, tokens, names[i],
               median(lo[i]), median(mid[i]), median(hi[i]));
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
  }
  g.ctx.stamps = nullptr;
  cudaFree(stamps);
}

// A corrupt or mismatched peer must not make the LSA receive index past a
// source's routes: after the send half, this rank's own expert list for the
// first token's expert is overwritten (keeping the call's tag), and the
// receive must refuse it with BAD_SIGNAL naming the source and the local
// expert, and write no slot. Set 0: a count word with more hits than the
// head's tokens * top_k allow; set 1: an entry whose token is past the
// head's tokens. EP1 only (the rank corrupts what it sent itself, with no
// peer in flight); it leaves both sets' tags behind, so it runs after every
// test that dispatches.
TEST_F(LlGpu, ZzCorruptExpertListIsRefused) {
  if (g_world != 1) GTEST_SKIP() << "EP1 only";
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
    uint64_t *list = (uint64_t *)((char *)g.ctx.window_local + set * lay.set_bytes +
                                  lay.disp_elist + (uint64_t)le * mep_ll_elist_bytes(&g.ctx.dims));
    uint64_t count = 0;
    CUDA_OK(cudaMemcpy(&count, list, 8, cudaMemcpyDeviceToHost));
    const uint32_t tag = mep_ll_list_tag(count);
    ASSERT_NE(tag, 0u) << "set " << set << ": no count word for expert " << le;
    ASSERT_GE(mep_ll_elist_hits(count), 1u) << "token 0 names expert " << le;
    const uint64_t bad = set == 0 ? mep_ll_elist_count((uint32_t)(T * K + 1), T, tag)
                                  : mep_ll_elist_entry(T, 0, tag);
    CUDA_OK(cudaMemcpy(list + (set == 0 ? 0 : 1), &bad, 8, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(g.recv_count, 0xff, (size_t)c.experts * 4));
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
  ASSERT_NO_FATAL_FAILURE(clear_record());
}

// Runs last (name order is declaration order): rank 1 skips the dispatch;
// rank 0's receive must record TIMEOUT and return.
TEST_F(LlGpu, ZzTimeoutRecordNoHang) {
  if (g_world < 2) GTEST_SKIP() << "needs 2 ranks";
  Group &g = G();
  g.ctx.transport = MEP_LL_TRANSPORT_LSA;
  const Case c = kBf16Odd;
  if (g_rank == 1) return;
  uint64_t saved = g.ctx.timeout_cycles;
  MEP_OK(mep_ll_timeout_cycles(g_rank, 300, &g.ctx.timeout_cycles));
  const Inputs in = make_inputs(c, g_rank);
  upload(c, g, in, g.x, g.topk, g.w);
  mep_ll_dispatch_args_t d = dargs(c, g, 0, g.x, g.topk, g.w);
  const auto t0 = std::chrono::steady_clock::now();
  MEP_OK(mep_ll_dispatch_send(&g.ctx, &d, g.stream));
  MEP_OK(mep_ll_dispatch_recv(&g.ctx, &d, g.stream));
  CUDA_OK(cudaStreamSynchronize(g.stream));
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  g.ctx.timeout_cycles = saved;
  ASSERT_EQ(g.rec->flag, 2);
  // LSA receives read the slot lists first: the missing peer shows there.
  EXPECT_TRUE(g.rec->op == MEP_LL_OP_DISPATCH_LIST || g.rec->op == MEP_LL_OP_DISPATCH_RECV)
      << rec_text();
  EXPECT_EQ(g.rec->rank, 0);
  EXPECT_EQ(g.rec->peer, 1);
  printf("TIMEOUT record: op %d rank %d peer %d expert %d set %d expected %llu seen %llu after %.0f ms\n",
         g.rec->op, g.rec->rank, g.rec->peer, g.rec->expert, g.rec->buffer_set,
         (unsigned long long)g.rec->expected, (unsigned long long)g.rec->seen, ms);
  EXPECT_LT(ms, 5000);
}

// GIN cannot run without an RDMA NIC: asking for it must fail cleanly with
// NCCL's reason (or succeed where GIN exists).
TEST_F(LlGpu, ZzzGinRequestClearError) {
  if (!getenv("MOE_EP_TEST_GIN")) GTEST_SKIP() << "set MOE_EP_TEST_GIN=1 (collective NCCL setup)";
  mep_nccl_params_t p = {};
  p.rank = g_rank;
  p.world = g_world;
  p.cuda_device = g_rank;
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

void setup_group() {
  Group *g = new Group();
  const char *dir = getenv("MOE_EP_UID_DIR");
  mep_nccl_params_t p = {};
  p.rank = g_rank;
  p.world = g_world;
  p.cuda_device = g_rank;
  p.transport = MOE_EP_TRANSPORT_LSA;
  mep_ll_dims_t dims = {kMaxExperts / g_world, g_world, kMaxTokens, kMaxHidden, kMaxTopK, 0, 2};
  p.window_bytes = mep_ll_buffer_bytes(dims.local_experts, dims.world, dims.max_tokens,
                                       dims.hidden, dims.top_k, dims.fp8, dims.num_sets);
  p.gin_signal_count = (int32_t)(2 * mep_ll_set_layout(&dims).num_signals);
  p.exchange = file_exchange;
  p.exchange_user = (void *)(dir ? dir : "/tmp");
  if (mep_nccl_create(&p, &g->nccl) != MOE_EP_OK) {
    fprintf(stderr, "rank %d: nccl setup failed: %s\n", g_rank, mep_last_error());
    exit(3);
  }
  int32_t tr[64];
  mep_nccl_peer_transports(g->nccl, tr, 64);
  printf("rank %d: NCCL up, lsa size %d, window %llu bytes, peer transports:", g_rank,
         mep_nccl_lsa_size(g->nccl), (unsigned long long)mep_nccl_bytes_allocated(g->nccl));
  for (int i = 0; i < g_world && i < 64; ++i) printf(" %d", tr[i]);
  printf("\n");
  mep_ll_ctx_t &c = g->ctx;
  c.dev_comm = mep_nccl_dev_comm(g->nccl);
  c.window = mep_nccl_window(g->nccl);
  c.window_local = mep_nccl_window_local(g->nccl);
  c.window_bytes = mep_nccl_bytes_allocated(g->nccl);
  c.dims = dims;
  c.rank = g_rank;
  c.transport = MEP_LL_TRANSPORT_LSA;
  if (mep_ll_resolve_lsa(&c) != MOE_EP_OK) {
    fprintf(stderr, "rank %d: %s\n", g_rank, mep_kernels_last_error());
    exit(4);
  }
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, g_rank);
  const char *env_sms = getenv("MOE_EP_TEST_SMS");
  c.num_sms = env_sms ? atoi(env_sms) : sms;
  if (mep_ll_timeout_cycles(g_rank, 10000, &c.timeout_cycles) != MOE_EP_OK) exit(4);
  const uint64_t sb = mep_ll_state_bytes(&dims);
  bool ok = cudaMalloc(&c.state, sb) == cudaSuccess && cudaMemset(c.state, 0, sb) == cudaSuccess &&
            cudaHostAlloc((void **)&g->rec, sizeof *g->rec, cudaHostAllocMapped) == cudaSuccess;
  memset((void *)g->rec, 0, sizeof *g->rec);
  ok = ok && cudaHostGetDevicePointer((void **)&c.error_dev, g->rec, 0) == cudaSuccess;
  const size_t slots = (size_t)dims.local_experts * g_world * kMaxTokens;
  g->slots = slots;
  ok = ok && cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking) == cudaSuccess &&
       cudaMalloc(&g->x, (size_t)kMaxTokens * kMaxHidden * 2) == cudaSuccess &&
       cudaMalloc(&g->topk, (size_t)kMaxTokens * kMaxTopK * 8) == cudaSuccess &&
       cudaMalloc(&g->w, (size_t)kMaxTokens * kMaxTopK * 4) == cudaSuccess &&
       cudaMalloc(&g->recv_x, slots * kMaxHidden * 2) == cudaSuccess &&
       cudaMalloc(&g->scales, slots * (kMaxHidden / 128) * 4) == cudaSuccess &&
       cudaMalloc(&g->y, slots * kMaxHidden * 2) == cudaSuccess &&
       cudaMalloc(&g->out, (size_t)kMaxTokens * kMaxHidden * 2) == cudaSuccess &&
       cudaMalloc((void **)&g->recv_count, dims.local_experts * 4) == cudaSuccess &&
       cudaMalloc((void **)&g->slot_src, slots * 4) == cudaSuccess &&
       cudaMalloc((void **)&g->src_count, dims.local_experts * g_world * 4) == cudaSuccess &&
       cudaMalloc((void **)&g->route, (size_t)g_world * kMaxTokens * kMaxTopK *
                                          sizeof(mep_ll_route_t)) == cudaSuccess &&
       cudaMalloc((void **)&g->src_tokens, g_world * 4) == cudaSuccess;
  if (!ok) {
    fprintf(stderr, "rank %d: CUDA allocation failed: %s\n", g_rank, cudaGetErrorString(cudaGetLastError()));
    exit(5);
  }
  g_group = g;
}

int run_parent(int argc, char **argv) {
  int world = 0;
  if (const char *w = getenv("MOE_EP_TEST_WORLD")) world = atoi(w);
  if (world <= 0 && cudaGetDeviceCount(&world) != cudaSuccess) world = 0;
  if (world <= 0) {
    fprintf(stderr, "no CUDA device\n");
    return 2;
  }
  char dir[] = "/tmp/moe_ep_gpu_XXXXXX";
  if (!mkdtemp(dir)) return 2;
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> env;
    for (char **e = environ; *e; ++e) env.push_back(*e);
    env.push_back("MOE_EP_RANK=" + std::to_string(r));
    env.push_back("MOE_EP_WORLD_SIZE=" + std::to_string(world));
    env.push_back(std::string("MOE_EP_UID_DIR=") + dir);
    std::vector<char *> envp;
    for (auto &s : env) envp.push_back(&s[0]);
    envp.push_back(nullptr);
    pid_t pid;
    if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp.data()) != 0) return 2;
    pids.push_back(pid);
  }
  // A rank that fails makes the others time out; give them 30 s, then end
  // them so the suite never hangs.
  int rc = 0, left = world;
  auto deadline = std::chrono::steady_clock::time_point::max();
  while (left > 0) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      --left;
      const int rank = (int)(std::find(pids.begin(), pids.end(), pid) - pids.begin());
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        rc = 1;
        fprintf(stderr, "rank %d: %s %d\n", rank, WIFEXITED(status) ? "exit code" : "killed by signal",
                WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
        if (deadline == std::chrono::steady_clock::time_point::max())
          deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      }
      continue;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      for (pid_t q : pids) kill(q, SIGKILL);
      deadline = std::chrono::steady_clock::time_point::max();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  printf("moe_ep ll_gpu_test: %d ranks, %s\n", world, rc ? "FAILED" : "PASSED");
  return rc;
}

}  // namespace

int main(int argc, char **argv) {
  const char *r = getenv("MOE_EP_RANK"), *w = getenv("MOE_EP_WORLD_SIZE");
  if (!r || !w) return run_parent(argc, argv);
  g_rank = atoi(r);
  g_world = atoi(w);
  setvbuf(stdout, nullptr, _IONBF, 0);  // nothing lost if the rank is killed
  ::testing::InitGoogleTest(&argc, argv);
  if (cudaSetDevice(g_rank) != cudaSuccess) return 6;
  setup_group();
  const int rc = RUN_ALL_TESTS();
  // Destroying the communicator is collective; skip it after a timeout
  // test left rank 1 out of step? No: destroy only waits for local work.
  mep_nccl_destroy(g_group->nccl, 0);
  return rc;
}
