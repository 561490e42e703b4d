// ll_world_check.cc: see ll_world_check.h.
#include "tests/gpu/ll_world_check.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "tests/gpu/cuda_ok.h"
#include "tests/gpu/one_gpu_world.h"

namespace mep_world {

namespace o = moe_ep_oracle;

mep_ll_dims_t DimsFor(const o::Problem &p, int transport) {
  mep_ll_dims_t dims = {};
  dims.local_experts = p.num_experts / p.world;
  dims.world = p.world;
  dims.max_tokens = p.max_tokens_per_rank;
  dims.hidden = p.hidden;
  dims.top_k = p.top_k;
  dims.num_sets = 2;
  dims.lsa_only = transport == MEP_LL_TRANSPORT_LSA;
  return dims;
}

std::string MakeRanks(const World &w, const mep_ll_dims_t &dims, int transport,
                      int num_sms, int timeout_ms, Dev *dev,
                      std::vector<RankBufs> *rb) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return "cudaGetDevice failed";
  uint64_t cycles = 0;
  if (mep_ll_timeout_cycles(device, timeout_ms, &cycles) != MEP_KSTATUS_OK)
    return mep_kernels_last_error();
  const int R = dims.world;
  rb->assign(R, RankBufs());
  for (int r = 0; r < R; ++r) {
    RankBufs &b = (*rb)[r];
    b.ctx.dims = dims;
    b.ctx.transport = transport;
    b.ctx.num_sms = num_sms;
    b.ctx.timeout_cycles = cycles;
    const std::string st =
        PointAtRank(w, r, mep_ll_state_bytes(&dims), dev, &b.ctx);
    if (!st.empty()) return "rank " + std::to_string(r) + ": " + st;
    if (!AllocCallBuffers(dims, dev, &b))
      return "rank " + std::to_string(r) + ": cudaMalloc failed";
  }
  return "";
}

bool AllocCallBuffers(const mep_ll_dims_t &dims, Dev *dev, RankBufs *b) {
  const int R = dims.world, H = dims.hidden;
  const int64_t slots =
      static_cast<int64_t>(dims.local_experts) * R * dims.max_tokens;
  b->recv_x = dev->alloc<uint16_t>(slots * H);  // a bf16 row holds an fp8 one
  b->recv_scales = dev->alloc<int32_t>(slots * std::max(H / 128, 1));
  b->y = dev->alloc<uint16_t>(slots * H);
  b->out = dev->alloc<uint16_t>(static_cast<size_t>(dims.max_tokens) * H);
  b->recv_count = dev->alloc<int32_t>(dims.local_experts);
  b->slot_src = dev->alloc<int32_t>(slots);
  b->src_count =
      dev->alloc<int32_t>(static_cast<size_t>(dims.local_experts) * R);
  b->src_tokens = dev->alloc<int32_t>(R);
  b->route = dev->alloc<mep_ll_route_t>(static_cast<size_t>(R) *
                                        dims.max_tokens * dims.top_k);
  return b->recv_x && b->recv_scales && b->y && b->out && b->recv_count &&
         b->slot_src && b->src_count && b->src_tokens && b->route;
}

void CheckReceiveMakeY(const o::Problem &p,
                       const std::vector<o::RankInputs> &all, int r,
                       const RankBufs &b, const std::string &where,
                       std::vector<uint16_t> *y,
                       std::vector<std::vector<const uint16_t *>> *y_of_slot) {
  const int R = p.world, H = p.hidden, EL = p.num_experts / R;
  const bool fp8 = p.dispatch_dtype == o::DispatchDtype::kFp8;
  const bool packed = fp8 && p.scale_format == o::ScaleFormat::kUe8m0Packed;
  const int G = H / 128, words = packed ? (G + 3) / 4 : G;
  const size_t row_bytes = fp8 ? H : 2 * H;
  const int64_t slots = EL * static_cast<int64_t>(R) * p.max_tokens_per_rank;
  const int K = p.top_k;
  const o::LlDispatchExpected d = o::ll_dispatch_expected(p, all, r);
  const auto cnt = Download<int32_t>(b.recv_count, EL);
  ASSERT_EQ(o::compare_exact_i32("recv_count", cnt.data(), d.recv_count.data(),
                                 EL, 0),
            "")
      << where;
  const auto src = Download<int32_t>(b.slot_src, slots);
  const auto rx = Download<uint8_t>(b.recv_x, slots * row_bytes);
  const auto rs = Download<int32_t>(b.recv_scales, fp8 ? slots * words : 0);
  y->assign(static_cast<size_t>(slots) * H, 0);
  std::vector<float> f(H), sc(G);
  for (int e = 0; e < EL; ++e) {
    for (int i = 0; i < cnt[e]; ++i) {
      const o::LlSlot &sl = d.slots[d.row(e, i)];
      const int64_t full = d.full_row(e, i), row = d.row(e, i);
      ASSERT_EQ(src[full], MEP_LL_SLOT_PACK(sl.src_rank, sl.src_token, sl.k))
          << where << "slot_src of expert " << e << " slot " << i;
      const uint8_t *got = &rx[full * row_bytes];
      if (fp8) {
        const uint8_t *want = &d.x_fp8[row * H];
        // Every scale format quantises by an exact division, as the
        // oracle does (compare.h).
        const std::string m = o::compare_exact_u8("recv_x", got, want, H, H);
        ASSERT_EQ(m, "") << where << "expert " << e << " slot " << i;
        const int32_t *gs = &rs[full * words];
        if (packed) {
          ASSERT_EQ(
              o::compare_exact_i32("recv_scales", gs,
                                   &d.scales_packed[row * words], words, words),
              "")
              << where << "expert " << e;
          o::unpack_ue8m0(gs, G, sc.data());
        } else {
          const float *gf = reinterpret_cast<const float *>(gs);
          ASSERT_EQ(
              o::compare_exact_f32("recv_scales", gf, &d.scales[row * G], G, G),
              "")
              << where << "expert " << e;
          sc.assign(gf, gf + G);
        }
        o::dequantize_row(got, sc.data(), H, f.data());
      } else {
        const uint16_t *g16 = reinterpret_cast<const uint16_t *>(got);
        ASSERT_EQ(o::compare_exact_u16("recv_x", g16, &d.x_bf16[row * H], H, H),
                  "")
            << where << "expert " << e << " slot " << i;
        for (int h = 0; h < H; ++h) f[h] = o::bf16_to_float(g16[h]);
      }
      uint16_t *yr = &(*y)[full * H];
      o::expert_fn_row(r * EL + e, f.data(), H, yr);
      (*y_of_slot)[sl.src_rank][static_cast<size_t>(sl.src_token) * K + sl.k] =
          yr;
    }
  }
  CUDA_OK(cudaMemcpy(b.y, y->data(), y->size() * 2, cudaMemcpyHostToDevice));
  // Landed (the legacy stream holds the copy) before any rank's
  // non-blocking stream launches the combine; not a device sync, which
  // would wait for ranks' kernels that wait for each other.
  CUDA_OK(cudaStreamSynchronize(cudaStreamLegacy));
}

void UseBuffers(const RankBufs &b, mep_ll_dispatch_args_t *a) {
  a->recv_x = b.recv_x;
  a->recv_scales = b.recv_scales;
  a->recv_count = b.recv_count;
  a->slot_src = b.slot_src;
  a->src_count = b.src_count;
  a->route = b.route;
  a->src_tokens = b.src_tokens;
}

void UseBuffers(const RankBufs &b, mep_ll_combine_args_t *a) {
  a->y = b.y;
  a->out = b.out;
  a->recv_count = b.recv_count;
  a->slot_src = b.slot_src;
  a->src_count = b.src_count;
  a->route = b.route;
  a->src_tokens = b.src_tokens;
}

void MakeCall(const o::Problem &p, uint64_t seed, int set, int comb_set,
              const std::vector<RankBufs> &rb, Dev *dev, Call *c,
              bool weights_at_dispatch) {
  const int R = p.world, K = p.top_k;
  c->all = o::make_all_inputs(p, seed);
  c->da.assign(R, {});
  c->ca.assign(R, {});
  c->y.assign(R, {});
  c->y_of_slot.assign(R, {});
  for (int r = 0; r < R; ++r) {
    const o::RankInputs &in = c->all[r];
    c->y_of_slot[r].assign(static_cast<size_t>(in.num_tokens) * K, nullptr);
    const void *topk = dev->upload(in.topk_idx);
    mep_ll_dispatch_args_t &a = c->da[r];
    a.x = dev->upload(in.x);
    a.topk_idx = topk;
    a.topk_idx_bytes = 8;
    a.num_tokens = in.num_tokens;
    a.hidden = p.hidden;
    a.top_k = K;
    a.num_experts = p.num_experts;
    a.buffer_set = set;
    UseBuffers(rb[r], &a);
    const float *w = dev->upload(in.topk_weights);
    a.weighted = weights_at_dispatch;
    a.topk_weights = weights_at_dispatch ? w : nullptr;
    mep_ll_combine_args_t &b = c->ca[r];
    UseBuffers(rb[r], &b);
    b.topk_idx = topk;
    b.topk_idx_bytes = 8;
    b.num_tokens = in.num_tokens;
    b.hidden = p.hidden;
    b.top_k = K;
    b.num_experts = p.num_experts;
    b.buffer_set = comb_set;
    b.topk_weights = weights_at_dispatch ? nullptr : w;
    b.dispatch_set = set;
    b.partials = weights_at_dispatch;
  }
}

void CheckCombine(const o::Problem &p, const Call &c,
                  const std::vector<RankBufs> &rb, uint64_t seed) {
  const int K = p.top_k;
  for (int s = 0; s < p.world; ++s) {
    const auto &slot_y = c.y_of_slot[s];
    const std::vector<uint16_t> want =
        o::ll_combine_reduce(p, c.all[s], [&](int t, int k) {
          return slot_y[static_cast<size_t>(t) * K + k];
        });
    const auto got = Download<uint16_t>(rb[s].out, want.size());
    EXPECT_EQ(o::compare_exact_bf16("combine out", got.data(), want.data(),
                                    want.size(), p.hidden),
              "")
        << "rank " << s << ", seed " << seed;
  }
}

}  // namespace mep_world
