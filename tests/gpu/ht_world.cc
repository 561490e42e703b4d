// ht_world.cc: the HT world tests' shared parts (ht_world.h).
#include "tests/gpu/ht_world.h"

#include <cuda_runtime_api.h>

#include "kernels/ht/ht_layout.h"
#include "kernels/ll/ll.h"
#include "tests/gpu/scale_mode.h"

namespace ht_world {

using mep_world::Dev;
using mep_world::Download;

std::ostream &operator<<(std::ostream &os, const Case &c) {
  return os << c.name;
}

o::Problem ProblemOf(const Case &c) {
  o::Problem p;
  p.world = c.world;
  p.num_experts = c.experts;
  p.hidden = c.hidden;
  p.top_k = c.top_k;
  p.max_tokens_per_rank = c.max_tokens;
  p.generator = c.gen;
  p.dispatch_dtype = c.fp8 ? o::DispatchDtype::kFp8 : o::DispatchDtype::kBf16;
  p.scale_format = c.scales;
  p.node_ranks = c.sum_nodes ? c.node_ranks : 0;
  return p;
}

static int ScaleMode(const Case &c) { return c.fp8 ? mep_world::ScaleMode(c.scales) : -1; }

int ScaleWords(const Case &c) { return mep_fp8_scale_words(c.hidden, ScaleMode(c)); }

std::string AllocOutputs(const Case &c, Dev *dev, RankIo *io) {
  const int64_t cap = Capacity(c);
  const int words = ScaleWords(c);
  const size_t row_bytes = c.fp8 ? c.hidden : 2 * c.hidden;
  io->recv_x = dev->alloc<uint8_t>(cap * row_bytes);
  io->recv_scales = dev->alloc<int32_t>(cap * (words > 0 ? words : 1));
  io->recv_idx = dev->alloc<int32_t>(cap * c.top_k);
  io->recv_w = dev->alloc<float>(cap * c.top_k);
  io->recv_count = dev->alloc<int32_t>(c.experts / c.world);
  io->num_recv = dev->alloc<int64_t>(1);
  io->out = dev->alloc<uint16_t>(static_cast<size_t>(c.max_tokens) * c.hidden);
  if (io->recv_x && io->recv_scales && io->recv_idx && io->recv_w &&
      io->recv_count && io->num_recv && io->out)
    return "";
  return "cudaMalloc of a rank's outputs failed";
}

std::string MakeGroup(const Case &c, int timeout_ms, HtGroup *g) {
  const int R = c.world;
  mep_ht_dims_t dims = {};
  dims.world = R;
  dims.local_experts = c.experts / R;
  dims.max_tokens = c.max_tokens;
  dims.hidden = c.hidden;
  dims.top_k = c.top_k;
  dims.node_ranks = c.node_ranks;
  dims.sum_by_node = c.sum_nodes;
  std::string err;
  g->world = mep_world::World::Create(R, mep_ht_buffer_bytes(&dims), &err);
  if (g->world == nullptr) return err;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return "cudaGetDevice failed";
  uint64_t cycles = 0;
  if (mep_ll_timeout_cycles(device, timeout_ms, &cycles) != MEP_KSTATUS_OK)
    return "mep_ll_timeout_cycles failed";
  g->io.resize(R);
  for (int r = 0; r < R; ++r) {
    mep_ht_ctx_t &x = g->io[r].ctx;
    x.dims = dims;
    x.num_sms = c.num_sms;
    x.transport = c.transport;
    x.timeout_cycles = cycles;
    err = mep_world::PointAtRank(*g->world, r, mep_ht_state_bytes(&dims),
                                 &g->dev, &x);
    if (err.empty()) err = AllocOutputs(c, &g->dev, &g->io[r]);
    if (!err.empty()) return "rank " + std::to_string(r) + ": " + err;
  }
  return "";
}

CallData MakeCall(const Case &c, const o::Problem &p, int call) {
  CallData d;
  d.seed = 1000 * (call + 1) + c.world;
  d.set = call % MEP_NUM_BUFFER_SETS;
  d.all = o::make_all_inputs(p, d.seed);
  d.want.resize(c.world);
  d.ys.resize(c.world);
  for (int r = 0; r < c.world; ++r) {
    d.want[r] = o::ht_dispatch_expected(p, d.all, r);
    d.ys[r] = o::ht_wide_partials(d.want[r].num_recv, c.hidden, d.seed * 31 + r);
  }
  return d;
}

mep_ht_dispatch_args_t DispatchArgs(const Case &c, const o::Problem &p,
                                    const CallData &d, int r,
                                    const RankIo &io, Dev *dev) {
  const o::RankInputs &in = d.all[r];
  mep_ht_dispatch_args_t a = {};
  if (c.fp8) {
    const o::HtFp8Input q = o::ht_fp8_input(p, in);
    a.x = dev->upload(q.x);
    a.x_scales = c.scales == o::ScaleFormat::kUe8m0Packed
                     ? static_cast<const void *>(dev->upload(q.packed))
                     : static_cast<const void *>(dev->upload(q.scales));
  } else {
    a.x = dev->upload(in.x);
  }
  a.fp8 = c.fp8;
  a.scale_words = ScaleWords(c);
  a.scale_mode = c.fp8 ? ScaleMode(c) : MEP_FP8_SCALE_F32;
  a.topk_idx = dev->upload(in.topk_idx);
  a.topk_idx_bytes = 8;
  a.num_tokens = in.num_tokens;
  a.hidden = c.hidden;
  a.top_k = c.top_k;
  a.num_experts = c.experts;
  a.buffer_set = d.set;
  a.topk_weights = dev->upload(in.topk_weights);
  a.recv_x = io.recv_x;
  a.recv_scales = io.recv_scales;
  a.recv_topk_idx = static_cast<int32_t *>(io.recv_idx);
  a.recv_topk_weights = static_cast<float *>(io.recv_w);
  a.recv_count = io.recv_count;
  a.recv_capacity = Capacity(c);
  a.pad = c.pad;
  a.num_recv = io.num_recv;
  return a;
}

mep_ht_combine_args_t CombineArgs(const Case &c, const CallData &d, int r,
                                  const mep_ht_dispatch_args_t &da,
                                  const RankIo &io, Dev *dev) {
  std::vector<uint16_t> y = d.ys[r];
  if (c.pad)
    y.resize(static_cast<size_t>(Capacity(c)) * c.hidden, 0x7fc0);  // NaN
  mep_ht_combine_args_t a = {};
  a.y = dev->upload(y);
  a.topk_idx = da.topk_idx;
  a.topk_idx_bytes = 8;
  a.num_tokens = d.all[r].num_tokens;
  a.hidden = c.hidden;
  a.top_k = c.top_k;
  a.num_experts = c.experts;
  a.layout_set = d.set;
  a.channels = mep_ht_channels(&io.ctx);
  a.out = io.out;
  return a;
}

std::string CheckDispatch(const Case &c, const CallData &d, int r,
                          const RankIo &io) {
  const o::HtDispatchExpected &e = d.want[r];
  const int H = c.hidden, K = c.top_k, words = ScaleWords(c);
  const int64_t n = Download<int64_t>(io.num_recv, 1)[0];
  if (n != e.num_recv)
    return "N_recv " + std::to_string(n) + ", expected " +
           std::to_string(e.num_recv);
  const int64_t rows = c.pad ? Capacity(c) : n;
  const auto idx = Download<int32_t>(io.recv_idx, rows * K);
  const auto w = Download<float>(io.recv_w, rows * K);
  std::string err = o::compare_exact_i32("recv_topk_idx", idx.data(),
                                         e.recv_topk_idx.data(), n * K, K);
  if (err.empty())
    err = o::compare_exact_f32("recv_topk_weights", w.data(),
                               e.recv_topk_weights.data(), n * K, K);
  for (int64_t i = n * K; err.empty() && i < rows * K; ++i)
    if (idx[i] != -1 || w[i] != 0.0f)
      err = "padded row " + std::to_string(i / K) + " slot " +
            std::to_string(i % K) + ": idx " + std::to_string(idx[i]) +
            " weight " + std::to_string(w[i]) + ", expected -1 and 0";
  if (!err.empty()) return err;
  const auto cnt = Download<int32_t>(io.recv_count, c.experts / c.world);
  err = o::compare_exact_i32("recv_count", cnt.data(),
                             e.num_recv_tokens_per_expert.data(), cnt.size(), 0);
  if (!err.empty()) return err;
  if (!c.fp8) {
    const auto xs = Download<uint16_t>(io.recv_x, n * H);
    return o::compare_exact_u16("recv_x", xs.data(), e.recv_x.data(), n * H, H);
  }
  const auto xs = Download<uint8_t>(io.recv_x, n * H);
  err = o::compare_exact_u8("recv_x", xs.data(), e.recv_x_fp8.data(), n * H, H);
  if (!err.empty()) return err;
  if (c.scales == o::ScaleFormat::kUe8m0Packed) {
    const auto sc = Download<int32_t>(io.recv_scales, n * words);
    return o::compare_exact_i32("recv_scales", sc.data(),
                                e.recv_scales_packed.data(), n * words, words);
  }
  const auto sc = Download<float>(io.recv_scales, n * words);
  return o::compare_exact_f32("recv_scales", sc.data(), e.recv_scales.data(),
                              n * words, words);
}

std::string CheckCombine(const Case &c, const o::Problem &p, const CallData &d,
                         int r, const RankIo &io, int64_t *order_matters) {
  std::vector<const uint16_t *> y_by_rank(c.world);
  for (int q = 0; q < c.world; ++q) y_by_rank[q] = d.ys[q].data();
  const std::vector<uint16_t> expect =
      o::ht_combine_reduce(p, d.all, r, y_by_rank);
  if (p.node_ranks > 1 && p.node_ranks < c.world) {
    o::Problem flat = p;
    flat.node_ranks = 0;
    const std::vector<uint16_t> one_sum =
        o::ht_combine_reduce(flat, d.all, r, y_by_rank);
    for (size_t i = 0; i < expect.size(); ++i)
      *order_matters += expect[i] != one_sum[i];
  }
  const auto got = Download<uint16_t>(io.out, expect.size());
  return o::compare_exact_bf16("combine out", got.data(), expect.data(),
                               expect.size(), c.hidden);
}

void AddNetworkRows(const Case &c, const o::Problem &p,
                    const std::vector<o::RankInputs> &all,
                    std::vector<int64_t> *want) {
  const int R = c.world, n = c.node_ranks, e_local = c.experts / R;
  for (int s = 0; s < R; ++s) {
    const o::RankInputs &in = all[s];
    for (int t = 0; t < in.num_tokens; ++t) {
      uint64_t nodes = 0;
      for (int k = 0; k < p.top_k; ++k) {
        const int64_t e = in.topk_idx[static_cast<size_t>(t) * p.top_k + k];
        if (e >= 0 && e < c.experts) nodes |= 1ull << (e / e_local / n);
      }
      for (int b = 0; b < R / n; ++b)
        if (b != s / n && ((nodes >> b) & 1u))
          ++(*want)[static_cast<size_t>(s) * R + b * n + s % n];
    }
  }
}

std::string CheckRelayedCombineRows(const Case &c, const HtGroup &g,
                                    const std::vector<int64_t> &want) {
  const int R = c.world, n = c.node_ranks;
  const mep_ht_state_t st = mep_ht_state_layout(&g.io[0].ctx.dims);
  for (int x = 0; x < R; ++x) {
    const auto tails = Download<uint64_t>(
        static_cast<const char *>(g.io[x].ctx.state) + st.send_tail_c,
        static_cast<size_t>(R) * MEP_HT_MAX_CHANNELS);
    for (int s = x % n; s < R; s += n) {
      if (s / n == x / n) continue;
      int64_t got = 0;
      for (int ch = 0; ch < MEP_HT_MAX_CHANNELS; ++ch)
        got += static_cast<int64_t>(tails[s * MEP_HT_MAX_CHANNELS + ch]);
      const int64_t expect = 2 * want[static_cast<size_t>(s) * R + x];
      if (got != expect)
        return "relay " + std::to_string(x) + " put " + std::to_string(got) +
               " combine slots back to rank " + std::to_string(s) +
               "; expected " + std::to_string(expect) +
               " (one f32 row, two slots, per token with an expert on its "
               "node)";
    }
  }
  return "";
}

std::string CheckNetworkRows(const Case &c, const HtGroup &g,
                             const std::vector<int64_t> &want) {
  const int R = c.world, n = c.node_ranks;
  const mep_ht_state_t st = mep_ht_state_layout(&g.io[0].ctx.dims);
  for (int s = 0; s < R; ++s) {
    const auto tails = Download<uint64_t>(
        static_cast<const char *>(g.io[s].ctx.state) + st.send_tail_d,
        static_cast<size_t>(R) * MEP_HT_MAX_CHANNELS);
    for (int d = 0; d < R; ++d) {
      if (d / n == s / n) continue;
      int64_t got = 0;
      for (int ch = 0; ch < MEP_HT_MAX_CHANNELS; ++ch)
        got += static_cast<int64_t>(tails[d * MEP_HT_MAX_CHANNELS + ch]);
      const int64_t expect = want[static_cast<size_t>(s) * R + d];
      if (got != expect)
        return "rank " + std::to_string(s) + " put " + std::to_string(got) +
               " rows into its network ring at rank " + std::to_string(d) +
               "; expected " + std::to_string(expect) +
               (d % n == s % n ? " (one per token with an expert on its node)"
                               : " (that rank's rows come through its relay)");
    }
  }
  return "";
}

}  // namespace ht_world
