// ht_world_test.cc: the HT kernels at 3..16 ranks on one GPU (one_gpu_world.h),
// against the oracle: LSA, and GIN-emulated with nodes of 1, 2, 3, 4 and 8
// ranks and one node of the whole group (relays forward each token to the
// ranks of their node; the rows put over the network are counted), bf16
// and pre-quantised fp8, several calls
// per group (ring positions and the count words' epochs carry across
// calls), worst-case padding. Every rank's dispatch outputs and combined
// rows are compared bit for bit.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/ht/ht.h"
#include "kernels/ht/ht_layout.h"
#include "kernels/ll/ll.h"
#include "tests/gpu/cuda_ok.h"
#include "tests/gpu/one_gpu_world.h"
#include "tests/oracle/oracle.h"

namespace {

namespace o = moe_ep_oracle;
using mep_world::Dev;
using mep_world::Download;

struct Case {
  const char *name;
  int world, node_ranks, transport;  // node_ranks 0: LSA
  int experts, hidden, top_k, max_tokens;
  o::Generator gen;
  bool fp8;
  o::ScaleFormat scales;
  int num_sms;  // per rank
  bool pad;     // worst-case rows past N_recv
  // GIN-emulated with ranks_per_node set: combine sums per node (on the
  // relays when nodes have 2 or more ranks), then across nodes.
  bool sum_nodes = false;
};

std::ostream &operator<<(std::ostream &os, const Case &c) {
  return os << c.name;
}

constexpr int kLsa = MEP_HT_TRANSPORT_LSA, kEmu = MEP_HT_TRANSPORT_GIN_EMULATED;
constexpr int kCalls = 3;  // per group: epochs 0..2 (both count-word parities)
constexpr int kTimeoutMs = 20000;

// One rank's device side of one call.
struct RankIo {
  mep_ht_ctx_t ctx = {};
  void *x = nullptr, *scales = nullptr, *topk = nullptr, *w = nullptr;
  void *recv_x = nullptr, *recv_scales = nullptr, *recv_idx = nullptr,
       *recv_w = nullptr;
  int32_t *recv_count = nullptr;
  int64_t *num_recv = nullptr;
  void *out = nullptr;
};

// The oracle's description of case c's layer call.
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

// A group of c.world ranks on this GPU with every rank's outputs allocated
// for c's capacities.
struct HtGroup {
  std::unique_ptr<mep_world::World> world;
  Dev dev;
  std::vector<RankIo> io;
};

void MakeGroup(const Case &c, int timeout_ms, HtGroup *g) {
  const int H = c.hidden, K = c.top_k, R = c.world;
  const int words = !c.fp8 ? 0
                    : c.scales == o::ScaleFormat::kUe8m0Packed
                        ? (H / 128 + 3) / 4
                        : H / 128;
  const size_t row_bytes = c.fp8 ? H : 2 * H;
  const int64_t cap = static_cast<int64_t>(R) * c.max_tokens;
  mep_ht_dims_t dims = {};
  dims.world = R;
  dims.local_experts = c.experts / R;
  dims.max_tokens = c.max_tokens;
  dims.hidden = H;
  dims.top_k = K;
  dims.node_ranks = c.node_ranks;
  dims.sum_by_node = c.sum_nodes;
  std::string err;
  g->world = mep_world::World::Create(R, mep_ht_buffer_bytes(&dims), &err);
  ASSERT_NE(g->world, nullptr) << err;
  int device = 0;
  CUDA_OK(cudaGetDevice(&device));
  uint64_t cycles = 0;
  ASSERT_EQ(mep_ll_timeout_cycles(device, timeout_ms, &cycles), MEP_KSTATUS_OK);

  g->io.resize(R);
  std::vector<RankIo> &io = g->io;
  for (int r = 0; r < R; ++r) {
    mep_ht_ctx_t &x = io[r].ctx;
    x.dims = dims;
    x.num_sms = c.num_sms;
    x.transport = c.transport;
    x.timeout_cycles = cycles;
    ASSERT_EQ(mep_world::PointAtRank(*g->world, r, mep_ht_state_bytes(&dims),
                                     &g->dev, &x),
              "");
    io[r].recv_x = g->dev.alloc<uint8_t>(cap * row_bytes);
    io[r].recv_scales = g->dev.alloc<int32_t>(cap * (words > 0 ? words : 1));
    io[r].recv_idx = g->dev.alloc<int32_t>(cap * K);
    io[r].recv_w = g->dev.alloc<float>(cap * K);
    io[r].recv_count = g->dev.alloc<int32_t>(dims.local_experts);
    io[r].num_recv = g->dev.alloc<int64_t>(1);
    io[r].out = g->dev.alloc<uint16_t>(static_cast<size_t>(c.max_tokens) * H);
    ASSERT_TRUE(io[r].recv_x && io[r].recv_scales && io[r].recv_idx &&
                io[r].recv_w && io[r].recv_count && io[r].num_recv &&
                io[r].out);
  }
}

// Over a network transport, the rows each rank has put into its ring at
// every rank of another node (the sender's ring positions, summed over
// channels) must be what hierarchical forwarding promises: to the rank at
// its own index there (its relay), one row per token with an expert
// anywhere on that node; to every other rank there, none. `want` holds the
// running totals [source * R + destination] of all calls so far.
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

// After a combine summed on the relays, each relay has put back one f32 row
// (two ring slots) per row its network ring brought in from that source.
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

class HtWorld : public ::testing::TestWithParam<Case> {};

TEST_P(HtWorld, MatchesOracle) {
  const Case &c = GetParam();
  const o::Problem p = ProblemOf(c);
  const bool packed = c.scales == o::ScaleFormat::kUe8m0Packed;
  const int H = c.hidden, K = c.top_k, R = c.world;
  const int words = !c.fp8   ? 0
                    : packed ? p.packed_scale_words()
                             : p.scale_groups();
  const int64_t cap = static_cast<int64_t>(R) * c.max_tokens;

  HtGroup grp;
  ASSERT_NO_FATAL_FAILURE(MakeGroup(c, kTimeoutMs, &grp));
  const auto &world = grp.world;
  std::vector<RankIo> &io = grp.io;
  const mep_ht_dims_t &dims = io[0].ctx.dims;
  std::vector<int64_t> network_rows(static_cast<size_t>(R) * R, 0);
  // Combined values where the per-node order differs from one ascending
  // sum: the check can only tell the orders apart where there are some.
  int64_t order_matters = 0;

  for (int call = 0; call < kCalls; ++call) {
    const uint64_t seed = 1000 * (call + 1) + R;
    const int set = call % MEP_NUM_BUFFER_SETS;
    const std::vector<o::RankInputs> all = o::make_all_inputs(p, seed);
    std::vector<o::HtDispatchExpected> want(R);
    Dev call_dev;
    std::vector<mep_ht_dispatch_args_t> da(R);
    for (int r = 0; r < R; ++r) {
      const o::RankInputs &in = all[r];
      want[r] = o::ht_dispatch_expected(p, all, r);
      mep_ht_dispatch_args_t &a = da[r];
      a = {};
      if (c.fp8) {
        const o::HtFp8Input q = o::ht_fp8_input(p, in);
        a.x = call_dev.upload(q.x);
        a.x_scales = packed
                         ? static_cast<const void *>(call_dev.upload(q.packed))
                         : static_cast<const void *>(call_dev.upload(q.scales));
      } else {
        a.x = call_dev.upload(in.x);
      }
      a.fp8 = c.fp8;
      a.scale_words = words;
      a.topk_idx = call_dev.upload(in.topk_idx);
      a.topk_idx_bytes = 8;
      a.num_tokens = in.num_tokens;
      a.hidden = H;
      a.top_k = K;
      a.num_experts = c.experts;
      a.buffer_set = set;
      a.topk_weights = call_dev.upload(in.topk_weights);
      a.recv_x = io[r].recv_x;
      a.recv_scales = io[r].recv_scales;
      a.recv_topk_idx = static_cast<int32_t *>(io[r].recv_idx);
      a.recv_topk_weights = static_cast<float *>(io[r].recv_w);
      a.recv_count = io[r].recv_count;
      a.recv_capacity = cap;
      a.pad = c.pad;
      a.num_recv = io[r].num_recv;
    }
    ASSERT_EQ(world->Settle(), "");
    ASSERT_EQ(world->LaunchAll([&](int r, cudaStream_t s) {
      return mep_ht_dispatch(&io[r].ctx, &da[r], s);
    }),
              "")
        << "call " << call;
    ASSERT_EQ(world->Sync(), "") << "dispatch, call " << call;
    ASSERT_EQ(world->Records(), "")
        << "dispatch, call " << call << ", seed " << seed;

    for (int r = 0; r < R; ++r) {
      const o::HtDispatchExpected &d = want[r];
      const std::string where = "rank " + std::to_string(r) + ", call " +
                                std::to_string(call) + ", seed " +
                                std::to_string(seed) + ": ";
      const int64_t n = Download<int64_t>(io[r].num_recv, 1)[0];
      ASSERT_EQ(n, d.num_recv) << where << "N_recv";
      const int64_t rows = c.pad ? cap : n;
      const auto idx = Download<int32_t>(io[r].recv_idx, rows * K);
      const auto w = Download<float>(io[r].recv_w, rows * K);
      EXPECT_EQ(o::compare_exact_i32("recv_topk_idx", idx.data(),
                                     d.recv_topk_idx.data(), n * K, K),
                "")
          << where;
      EXPECT_EQ(o::compare_exact_f32("recv_topk_weights", w.data(),
                                     d.recv_topk_weights.data(), n * K, K),
                "")
          << where;
      for (int64_t i = n * K; i < rows * K; ++i) {
        ASSERT_EQ(idx[i], -1) << where << "padded row " << i / K << " idx";
        ASSERT_EQ(w[i], 0.0f) << where << "padded row " << i / K << " weight";
      }
      const auto cnt = Download<int32_t>(io[r].recv_count, dims.local_experts);
      EXPECT_EQ(o::compare_exact_i32("recv_count", cnt.data(),
                                     d.num_recv_tokens_per_expert.data(),
                                     cnt.size(), 0),
                "")
          << where;
      if (c.fp8) {
        const auto xs = Download<uint8_t>(io[r].recv_x, n * H);
        EXPECT_EQ(o::compare_exact_u8("recv_x", xs.data(), d.recv_x_fp8.data(),
                                      n * H, H),
                  "")
            << where;
        if (packed) {
          const auto sc = Download<int32_t>(io[r].recv_scales, n * words);
          EXPECT_EQ(o::compare_exact_i32("recv_scales", sc.data(),
                                         d.recv_scales_packed.data(), n * words,
                                         words),
                    "")
              << where;
        } else {
          const auto sc = Download<float>(io[r].recv_scales, n * words);
          EXPECT_EQ(
              o::compare_exact_f32("recv_scales", sc.data(),
                                   d.recv_scales.data(), n * words, words),
              "")
              << where;
        }
      } else {
        const auto xs = Download<uint16_t>(io[r].recv_x, n * H);
        EXPECT_EQ(o::compare_exact_u16("recv_x", xs.data(), d.recv_x.data(),
                                       n * H, H),
                  "")
            << where;
      }
    }
    if (HasFailure()) return;
    if (c.transport == kEmu) {
      AddNetworkRows(c, p, all, &network_rows);
      ASSERT_EQ(CheckNetworkRows(c, grp, network_rows), "")
          << "call " << call << ", seed " << seed;
    }

    // Combine: each rank's partials of the rows it received (the rows'
    // count without padding; padded rows are never read back), of random
    // sign and wide magnitude, so that a sum in another order than the
    // documented one shows.
    std::vector<mep_ht_combine_args_t> ca(R);
    std::vector<std::vector<uint16_t>> ys(R);
    std::vector<const uint16_t *> y_by_rank(R);
    for (int r = 0; r < R; ++r) {
      ys[r] = o::ht_wide_partials(want[r].num_recv, H, seed * 31 + r);
      y_by_rank[r] = ys[r].data();
    }
    for (int r = 0; r < R; ++r) {
      std::vector<uint16_t> y = ys[r];
      if (c.pad)
        y.resize(static_cast<size_t>(cap) * H,
                 0x7fc0);  // NaN: must not be read
      mep_ht_combine_args_t &a = ca[r];
      a = {};
      a.y = call_dev.upload(y);
      a.topk_idx = da[r].topk_idx;
      a.topk_idx_bytes = 8;
      a.num_tokens = all[r].num_tokens;
      a.hidden = H;
      a.top_k = K;
      a.num_experts = c.experts;
      a.layout_set = set;
      a.channels = mep_ht_channels(&io[r].ctx);
      a.out = io[r].out;
    }
    ASSERT_EQ(world->Settle(), "");
    ASSERT_EQ(world->LaunchAll([&](int r, cudaStream_t s) {
      return mep_ht_combine(&io[r].ctx, &ca[r], s);
    }),
              "")
        << "call " << call;
    ASSERT_EQ(world->Sync(), "") << "combine, call " << call;
    ASSERT_EQ(world->Records(), "")
        << "combine, call " << call << ", seed " << seed;
    for (int r = 0; r < R; ++r) {
      const std::vector<uint16_t> expect =
          o::ht_combine_reduce(p, all, r, y_by_rank);
      if (p.node_ranks > 1 && p.node_ranks < R) {
        o::Problem flat = p;
        flat.node_ranks = 0;
        const std::vector<uint16_t> one_sum =
            o::ht_combine_reduce(flat, all, r, y_by_rank);
        for (size_t i = 0; i < expect.size(); ++i)
          order_matters += expect[i] != one_sum[i];
      }
      const auto got = Download<uint16_t>(io[r].out, expect.size());
      EXPECT_EQ(o::compare_exact_bf16("combine out", got.data(), expect.data(),
                                      expect.size(), H),
                "")
          << "rank " << r << ", call " << call << ", seed " << seed;
    }
    if (HasFailure()) return;
    if (p.node_ranks > 1 && p.node_ranks < R) {
      ASSERT_EQ(CheckRelayedCombineRows(c, grp, network_rows), "")
          << "call " << call << ", seed " << seed;
    }
  }
  // (Routing every token to one rank, or top-1, leaves one row per token:
  // no order.)
  if (p.node_ranks > 1 && p.node_ranks < R && c.gen != o::Generator::kAllToOneRank &&
      c.top_k > 1) {
    EXPECT_GT(order_matters, 0)
        << "no combined value depends on summing per node: the case cannot "
           "tell the orders apart";
  }
}

// A rank that never launches: every other rank's dispatch gives up within
// the timeout with a fatal record naming that rank (and itself), instead
// of hanging; the kernels end and the streams drain. Over NVLink, and over
// GIN-emulated as two nodes of two, where the absent rank is the relay of
// rank 0 and a direct peer of rank 3.
class HtWorldFailure : public ::testing::TestWithParam<int> {};

TEST_P(HtWorldFailure, AbsentRankIsNamedByEveryWaitingRank) {
  const int node_ranks = GetParam();
  const Case c = {"ep4_absent",
                  4,
                  node_ranks,
                  node_ranks == 0 ? kLsa : kEmu,
                  64,
                  2048,
                  8,
                  16,
                  o::Generator::kUniform,
                  false,
                  o::ScaleFormat::kF32,
                  8,
                  false};
  constexpr int kAbsent = 2;
  HtGroup grp;
  ASSERT_NO_FATAL_FAILURE(MakeGroup(c, 300, &grp));
  const o::Problem p = ProblemOf(c);
  const std::vector<o::RankInputs> all = o::make_all_inputs(p, 7);
  Dev call_dev;
  std::vector<mep_ht_dispatch_args_t> da(c.world);
  for (int r = 0; r < c.world; ++r) {
    mep_ht_dispatch_args_t &a = da[r];
    a = {};
    a.x = call_dev.upload(all[r].x);
    a.topk_idx = call_dev.upload(all[r].topk_idx);
    a.topk_idx_bytes = 8;
    a.num_tokens = all[r].num_tokens;
    a.hidden = c.hidden;
    a.top_k = c.top_k;
    a.num_experts = c.experts;
    a.topk_weights = call_dev.upload(all[r].topk_weights);
    a.recv_x = grp.io[r].recv_x;
    a.recv_topk_idx = static_cast<int32_t *>(grp.io[r].recv_idx);
    a.recv_topk_weights = static_cast<float *>(grp.io[r].recv_w);
    a.recv_count = grp.io[r].recv_count;
    a.recv_capacity = static_cast<int64_t>(c.world) * c.max_tokens;
    a.num_recv = grp.io[r].num_recv;
  }
  ASSERT_EQ(grp.world->Settle(), "");
  ASSERT_EQ(grp.world->LaunchAll(
                [&](int r, cudaStream_t s) {
                  return mep_ht_dispatch(&grp.io[r].ctx, &da[r], s);
                },
                kAbsent),
            "");
  ASSERT_EQ(grp.world->Sync(), "");
  for (int r = 0; r < c.world; ++r) {
    const mep_error_record_t &rec = grp.world->records(r)[0];
    if (r == kAbsent) {
      EXPECT_EQ(rec.flag, 0) << "rank " << r << " never ran but has a record";
      continue;
    }
    ASSERT_EQ(rec.flag, 2) << "rank " << r << " has no timeout record: "
                           << grp.world->Records();
    EXPECT_EQ(rec.rank, r) << grp.world->Records();
    EXPECT_EQ(rec.peer, kAbsent)
        << "rank " << r << ": " << grp.world->Records();
    EXPECT_EQ(rec.op, MEP_HT_OP_DISPATCH_COUNTS)
        << "rank " << r << ": " << grp.world->Records();
  }
}

INSTANTIATE_TEST_SUITE_P(LsaAndNodesOfTwo, HtWorldFailure,
                         ::testing::Values(0, 2),
                         [](const ::testing::TestParamInfo<int> &i) {
                           return i.param == 0 ? std::string("lsa")
                                               : std::string("emu_nodes2");
                         });

using G = o::Generator;
using S = o::ScaleFormat;
const Case kCases[] = {
    // name, world, node_ranks, transport, experts, hidden, top_k, tokens,
    // generator,
    // fp8, scales, num_sms, pad[, sum_nodes]
    {"ep4_lsa_bf16_t512", 4, 0, kLsa, 256, 2048, 8, 512, G::kUniform, false,
     S::kF32, 16, false},
    {"ep4_lsa_fp8_t512_skewed", 4, 0, kLsa, 256, 7168, 8, 512, G::kSkewed, true,
     S::kF32, 16, false},
    {"ep4_lsa_bf16_h2880_k32_empty", 4, 0, kLsa, 128, 2880, 32, 300,
     G::kEmptyRanks, false, S::kF32, 8, true},
    {"ep4_lsa_bf16_t1_k1", 4, 0, kLsa, 64, 2048, 1, 1, G::kUniform, false,
     S::kF32, 16, false},
    {"ep4_emu_nodes1_fp8packed_t512", 4, 1, kEmu, 256, 7168, 8, 512,
     G::kUniform, true, S::kUe8m0Packed, 16, false},
    {"ep4_emu_nodes2_bf16_t7_hot", 4, 2, kEmu, 256, 2048, 6, 7,
     G::kAllToOneRank, false, S::kF32, 16, false},
    {"ep4_emu_nodes2_bf16_t700_masked", 4, 2, kEmu, 256, 4096, 8, 700,
     G::kMasked, false, S::kF32, 12, true, true},
    {"ep8_lsa_bf16_t512", 8, 0, kLsa, 256, 2048, 8, 512, G::kUniform, false,
     S::kF32, 8, false},
    {"ep8_lsa_fp8ue8m0_t256_empty", 8, 0, kLsa, 256, 7168, 8, 256,
     G::kEmptyRanks, true, S::kUe8m0, 8, false},
    {"ep8_emu_nodes4_bf16_t300", 8, 4, kEmu, 256, 2048, 8, 300, G::kUniform,
     false, S::kF32, 8, false, true},
    {"ep8_emu_nodes2_fp8_t64_skewed", 8, 2, kEmu, 256, 7168, 8, 64, G::kSkewed,
     true, S::kF32, 8, false, true},
    {"ep8_emu_nodes1_bf16_t33_k1", 8, 1, kEmu, 64, 2048, 1, 33, G::kUniform,
     false, S::kF32, 4, false, true},
    // MEP_HT_MAX_RANKS: one warp per peer at both ends of every ring.
    {"ep16_lsa_bf16_t64", 16, 0, kLsa, 256, 2048, 8, 64, G::kUniform, false,
     S::kF32, 4, false},
    {"ep16_emu_nodes4_fp8_t40_empty", 16, 4, kEmu, 256, 2048, 8, 40,
     G::kEmptyRanks, true, S::kF32, 4, true, true},
    // Two nodes of 8: each relay fans a token out to up to 7 other ranks.
    {"ep16_emu_nodes8_bf16_t200", 16, 8, kEmu, 256, 2048, 8, 200, G::kUniform,
     false, S::kF32, 4, false, true},
    // Every token to one rank: one relay forwards everything to it.
    {"ep8_emu_nodes4_fp8_t600_hot", 8, 4, kEmu, 256, 2048, 8, 600,
     G::kAllToOneRank, true, S::kUe8m0, 8, false, true},
    {"ep3_lsa_bf16_t100", 3, 0, kLsa, 48, 2048, 8, 100, G::kUniform, false,
     S::kF32, 16, false},
    // Node counts that are not powers of two, nodes of 3, top-k 32 and
    // hidden 2880 through relays, top-1 with nodes of 2, one node holding
    // the whole group under the network transport (every route direct),
    // and nodes where some ranks send nothing.
    {"ep6_emu_nodes3_bf16_h2880_k32", 6, 3, kEmu, 96, 2880, 32, 100,
     G::kUniform, false, S::kF32, 8, false, true},
    {"ep6_emu_nodes2_fp8packed_t200_k1", 6, 2, kEmu, 96, 2048, 1, 200,
     G::kUniform, true, S::kUe8m0Packed, 8, false, true},
    {"ep12_emu_nodes4_bf16_t64_empty", 12, 4, kEmu, 192, 2048, 8, 64,
     G::kEmptyRanks, false, S::kF32, 4, true, true},
    {"ep4_emu_one_node_bf16_t128", 4, 4, kEmu, 64, 2048, 8, 128, G::kUniform,
     false, S::kF32, 16, false, true},
};

INSTANTIATE_TEST_SUITE_P(Cases, HtWorld, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case> &i) {
                           return std::string(i.param.name);
                         });

}  // namespace
