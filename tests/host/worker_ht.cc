// worker_ht.cc: HT conformance: prepare announces the receive count, then
// dispatch (packed rows, local ids, weights, per-expert counts) and combine
// (partials summed back over ranks), all against the oracle.
#include <vector>

#include "tests/common/plugin_api.h"
#include "tests/host/worker_common.h"

namespace moe_ep_test {

using namespace moe_ep_oracle;

static void ht_roundtrip(Ctx& c, const Problem& p, uint64_t seed, bool defer) {
  std::vector<RankInputs> all = make_all_inputs(p, seed);
  const RankInputs& mine = all[c.rank];
  int T = mine.num_tokens, K = p.top_k, H = p.hidden, el = p.local_experts();
  HtDispatchExpected want = ht_dispatch_expected(p, all, c.rank);
  Tensor topk(mine.topk_idx.data(), DT::kI64, {T, K});
  std::vector<int32_t> per_rank(p.world, -1);
  Tensor t_per_rank(per_rank.data(), DT::kI32, {p.world});
  moe_ep_prepare_params_t pp = MOE_EP_INIT(moe_ep_prepare_params_t);
  pp.topk_idx = topk.get();
  pp.num_tokens = T;
  pp.top_k = K;
  pp.num_tokens_per_rank = t_per_rank.get();
  moe_ep_handle_t* h = nullptr;
  if (!expect_status(c, seed, "ht prepare", c.api->prepare(c.group, &pp, &h), MOE_EP_OK)) return;
  PrepareExpected pe = prepare_expected(p, mine);
  expect_same(c, seed, "ht prepare num_tokens_per_rank",
              compare_exact_i32("num_tokens_per_rank", per_rank.data(),
                                pe.num_tokens_per_rank.data(), p.world, p.world));
  // Capacity exactly N_recv (+1 poisoned spare row that must stay untouched).
  int64_t cap = want.num_recv + 1;
  std::vector<uint16_t> recv_x(cap * H, 0x7FC1);
  std::vector<int32_t> recv_idx(cap * K, -9), recv_count(el, -9);
  std::vector<float> recv_w(cap * K, -9.0f);
  int64_t n_recv = -1;
  Tensor x(mine.x.data(), DT::kBf16, {T, H}), w(mine.topk_weights.data(), DT::kF32, {T, K});
  Tensor rx(recv_x.data(), DT::kBf16, {cap, H}), ri(recv_idx.data(), DT::kI32, {cap, K});
  Tensor rw(recv_w.data(), DT::kF32, {cap, K}), rc(recv_count.data(), DT::kI32, {el});
  moe_ep_dispatch_params_t dp = MOE_EP_INIT(moe_ep_dispatch_params_t);
  dp.flags = defer ? MOE_EP_FLAG_DEFER_RECV : 0;
  dp.hidden = H;
  dp.x = x.get();
  dp.topk_weights = w.get();
  dp.recv_x = rx.get();
  dp.recv_topk_idx = ri.get();
  dp.recv_topk_weights = rw.get();
  dp.recv_count = rc.get();
  dp.num_recv_tokens = &n_recv;
  moe_ep_hook_t* hook = nullptr;
  bool ok = expect_status(c, seed, "ht dispatch", c.api->dispatch(c.group, h, &dp, &hook),
                          MOE_EP_OK);
  if (ok && defer) {
    ok = expect_status(c, seed, "ht dispatch hook", c.api->hook_run(hook, nullptr), MOE_EP_OK);
    c.api->hook_free(hook);
  }
  if (ok) {
    if (n_recv != want.num_recv) {
      fail(c, seed, "ht num_recv_tokens",
           "got " + std::to_string(n_recv) + " want " + std::to_string(want.num_recv));
    }
    size_t n = static_cast<size_t>(want.num_recv);
    expect_same(c, seed, "ht recv_x", compare_exact_u16("recv_x", recv_x.data(), want.recv_x.data(), n * H, H));
    expect_same(c, seed, "ht recv_topk_idx",
                compare_exact_i32("recv_topk_idx", recv_idx.data(), want.recv_topk_idx.data(), n * K, K));
    expect_same(c, seed, "ht recv_topk_weights",
                compare_exact_f32("recv_topk_weights", recv_w.data(), want.recv_topk_weights.data(), n * K, K));
    expect_same(c, seed, "ht recv_count",
                compare_exact_i32("recv_count", recv_count.data(),
                                  want.num_recv_tokens_per_expert.data(), el, el));
    if (recv_x[n * H] != 0x7FC1) fail(c, seed, "ht recv_x", "wrote past N_recv rows");
    std::vector<uint16_t> y = ht_partials(p, want);
    std::vector<uint16_t> out(static_cast<size_t>(T) * H, 0x7FC1);
    Tensor ty(y.data(), DT::kBf16, {want.num_recv, H}), to(out.data(), DT::kBf16, {T, H});
    moe_ep_combine_params_t cp = MOE_EP_INIT(moe_ep_combine_params_t);
    cp.flags = dp.flags;
    cp.hidden = H;
    cp.y = ty.get();
    cp.out = to.get();
    ok = expect_status(c, seed, "ht combine", c.api->combine(c.group, h, &cp, &hook), MOE_EP_OK);
    if (ok && defer) {
      ok = expect_status(c, seed, "ht combine hook", c.api->hook_run(hook, nullptr), MOE_EP_OK);
      c.api->hook_free(hook);
    }
    if (ok) {
      std::vector<uint16_t> want_out = ht_combine_expected(p, all, c.rank);
      // Ranks are summed in ascending order, as the oracle does: bit-exact.
      expect_same(c, seed, "ht combine",
                  compare_exact_bf16("out", out.data(), want_out.data(), want_out.size(), H));
    }
  }
  c.api->handle_free(h);
}

void run_ht_conformance(Ctx& c) {
  const Generator gens[] = {Generator::kUniform, Generator::kSkewed, Generator::kAllToOneRank,
                            Generator::kEmptyRanks, Generator::kMasked};
  for (auto& layer : c.opt.layers) {
    for (Generator g : gens) {
      for (int s = 0; s < c.opt.seeds; s++) {
        uint64_t seed = 3 + static_cast<uint64_t>(s) * 7717 + static_cast<uint64_t>(g) * 31;
        ht_roundtrip(c, problem_for(c, layer.first, layer.second, g), seed, s % 2 == 1);
      }
    }
  }
}

}  // namespace moe_ep_test
