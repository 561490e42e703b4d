// worker_bad.cc: bad input on a live multi-rank group: each mistake returns
// the right status with a sentence naming the problem, returns no hook, and
// the group still works (a verified round trip follows each case).
#include <cstring>
#include <string>
#include <vector>

#include "tests/common/plugin_api.h"
#include "tests/host/ll_call.h"
#include "tests/host/worker_common.h"

namespace moe_ep_test {

using namespace moe_ep_oracle;

namespace {

Problem good_problem(const Ctx& c) {
  return problem_for(c, c.opt.layers[0].first, c.opt.layers[0].second, Generator::kUniform);
}

void still_usable(Ctx& c, uint64_t seed) { ll_roundtrip(c, good_problem(c), seed, false); }

void bad_prepare(Ctx& c, const char* what, std::vector<int64_t> topk, int tokens, int top_k,
                 const char* must) {
  Tensor t(topk.data(), DT::kI64, {tokens, top_k});
  moe_ep_prepare_params_t pp = MOE_EP_INIT(moe_ep_prepare_params_t);
  pp.topk_idx = t.get();
  pp.num_tokens = tokens;
  pp.top_k = top_k;
  moe_ep_handle_t* h = reinterpret_cast<moe_ep_handle_t*>(0x1);
  expect_status(c, 0, what, c.api->prepare(c.group, &pp, &h), MOE_EP_ERR_INVALID_ARGUMENT, must);
  if (h != reinterpret_cast<moe_ep_handle_t*>(0x1)) fail(c, 0, what, "wrote the handle on failure");
}

// A prepared handle plus well-formed dispatch buffers to break one at a time.
struct Dispatch {
  Ctx& c;
  Problem p;
  RankInputs in;
  std::vector<int64_t> topk;
  std::vector<uint8_t> recv_x, scales;
  std::vector<int32_t> count;
  std::vector<uint16_t> x;
  Tensor t_topk, t_x, t_rx, t_sc, t_cnt;
  moe_ep_handle_t* h = nullptr;
  moe_ep_dispatch_params_t dp = MOE_EP_INIT(moe_ep_dispatch_params_t);
  explicit Dispatch(Ctx& ctx)
      : c(ctx), p(good_problem(ctx)), in(make_inputs(p, ctx.rank, 5)), topk(in.topk_idx),
        recv_x(static_cast<size_t>(p.local_experts()) * p.world * p.max_tokens_per_rank * p.hidden * 2 + 64),
        scales(static_cast<size_t>(p.local_experts()) * p.world * p.max_tokens_per_rank * p.scale_groups() * 4 + 64),
        count(p.local_experts()), x(in.x),
        t_topk(topk.data(), DT::kI64, {in.num_tokens, p.top_k}),
        t_x(x.data(), DT::kBf16, {in.num_tokens, p.hidden}),
        t_rx(recv_x.data(), c.opt.dtype == "fp8" ? DT::kFp8 : DT::kBf16,
             {p.local_experts(), p.world * p.max_tokens_per_rank, p.hidden}),
        t_sc(scales.data(), DT::kF32, {p.local_experts(), p.world * p.max_tokens_per_rank, p.scale_groups()}),
        t_cnt(count.data(), DT::kI32, {p.local_experts()}) {
    moe_ep_prepare_params_t pp = MOE_EP_INIT(moe_ep_prepare_params_t);
    pp.topk_idx = t_topk.get();
    pp.num_tokens = in.num_tokens;
    pp.top_k = p.top_k;
    expect_status(c, 0, "bad-input prepare", c.api->prepare(c.group, &pp, &h), MOE_EP_OK);
    dp.hidden = p.hidden;
    dp.x = t_x.get();
    dp.recv_x = t_rx.get();
    dp.recv_scales = c.opt.dtype == "fp8" ? t_sc.get() : nullptr;
    dp.recv_count = t_cnt.get();
  }
  ~Dispatch() { c.api->handle_free(h); }
  void expect_refused(const char* what, moe_ep_status_t want, const char* must) {
    moe_ep_hook_t* hook = reinterpret_cast<moe_ep_hook_t*>(0x1);
    dp.flags |= MOE_EP_FLAG_DEFER_RECV;
    expect_status(c, 0, what, c.api->dispatch(c.group, h, &dp, &hook), want, must);
    if (hook != nullptr) fail(c, 0, what, "left a hook behind on failure");
  }
};

// A handle freed while its combine's hook is pending, then handles prepared
// until one gets the freed address (glibc hands the block back at once;
// ASan's quarantine never does): the hook reports its own handle freed
// instead of running on the new one, whose token count its `out` was not
// checked for. The abandoned receive leaves a host group usable.
void hook_after_handle_address_reused(Ctx& c, const Problem& p, uint64_t seed) {
  LlCall a(c, p, seed);
  if (a.prepare() != MOE_EP_OK ||
      !expect_status(c, seed, "dispatch (its handle to be freed)", a.dispatch(0, nullptr),
                     MOE_EP_OK)) {
    return;
  }
  a.check_dispatch();
  a.make_y();
  moe_ep_hook_t* hook = nullptr;
  if (!expect_status(c, seed, "deferred combine (its handle to be freed)",
                     a.combine(MOE_EP_FLAG_DEFER_RECV, &hook), MOE_EP_OK)) {
    return;
  }
  moe_ep_handle_t* old = a.release_handle();
  c.api->handle_free(old);
  RankInputs in = make_inputs(p, c.rank, seed + 1);
  Tensor t(in.topk_idx.data(), DT::kI64, {in.num_tokens, p.top_k});
  moe_ep_prepare_params_t pp = MOE_EP_INIT(moe_ep_prepare_params_t);
  pp.topk_idx = t.get();
  pp.num_tokens = in.num_tokens;
  pp.top_k = p.top_k;
  std::vector<moe_ep_handle_t*> fresh;
  for (int i = 0; i < 64; i++) {
    moe_ep_handle_t* h = nullptr;
    if (!expect_status(c, seed, "prepare (reusing a freed handle's address)",
                       c.api->prepare(c.group, &pp, &h), MOE_EP_OK)) {
      break;
    }
    fresh.push_back(h);
    if (h == old) break;
  }
  expect_status(c, seed, "hook_run after its handle was freed and its address reused",
                c.api->hook_run(hook, nullptr), MOE_EP_ERR_INVALID_ARGUMENT,
                "was freed before the hook ran");
  // That hook_run abandoned the receive: with the hook not yet freed, the
  // operations of two round trips (both buffer sets) go through.
  still_usable(c, seed + 40);
  still_usable(c, seed + 41);
  c.api->hook_free(hook);
  for (moe_ep_handle_t* h : fresh) c.api->handle_free(h);
}

// A dispatch whose hook was freed before it ran: the handle's refusals say
// its receive was abandoned, not that a hook that no longer exists has yet
// to run.
void dispatch_hook_freed(Ctx& c, const Problem& p, uint64_t seed) {
  LlCall a(c, p, seed);
  if (a.prepare() != MOE_EP_OK || !a.dispatch_abandoned("deferred dispatch (its hook to be freed)")) {
    return;
  }
  expect_status(c, seed, "combine after its dispatch's hook was freed", a.combine(0, nullptr),
                MOE_EP_ERR_INVALID_ARGUMENT, "a dispatch whose receive was abandoned");
}

// One buffer set: the last rank (B) refuses a dispatch, makes the next one
// deferred and frees its hook unrun (so it never receives on the set after
// its refusal), then refuses the one after. Rank 0 (A) refuses those last
// two, late: only once B has abandoned its receive (a barrier outside
// moe-ep orders that). Neither rank may wait for the other's signal of
// the last operation, which each sends only after its own wait: B waits
// for A's signal of the operation after its earlier refusal, A for B's.
void refusal_after_abandoned_receive(Ctx& c, const Problem& p, uint64_t seed) {
  const int b = c.world - 1;
  if (c.world < 2 || c.opt.double_buffer) return;
  const uint32_t unknown_flag = 0x80;
  auto told = [&](uint64_t s, const char* what, moe_ep_status_t st) {
    expect_status(c, s, what, st, MOE_EP_ERR_INVALID_ARGUMENT, "its peers were told");
  };
  auto named = [&](uint64_t s, const char* what, moe_ep_status_t st, const std::string& who) {
    expect_status(c, s, what, st, MOE_EP_ERR_INVALID_ARGUMENT, who.c_str());
  };
  const std::string by_b = "rank " + std::to_string(b) + " refused its own call";
  {
    LlCall a(c, p, seed);
    if (a.prepare() != MOE_EP_OK) return;
    moe_ep_status_t st = a.dispatch(c.rank == b ? unknown_flag : 0, nullptr);
    if (c.rank == b) {
      told(seed, "B's first refusal", st);
    } else {
      named(seed, "dispatch B refused", st, by_b);
    }
  }
  {
    LlCall a(c, p, seed + 1);
    if (a.prepare() != MOE_EP_OK) return;
    if (c.rank == b) {
      if (!a.dispatch_abandoned("B's deferred dispatch (its hook freed unrun)")) return;
      outside_wait_for(c, "b_abandoned", b);  // marks B's arrival; waits for no one
    } else if (c.rank == 0) {
      if (!outside_wait_for(c, "b_abandoned", b)) return;
      told(seed + 1, "A's late refusal", a.dispatch(unknown_flag, nullptr));
    } else {
      named(seed + 1, "dispatch A refused", a.dispatch(0, nullptr), "rank 0 refused its own call");
    }
  }
  {
    LlCall a(c, p, seed + 2);
    if (a.prepare() != MOE_EP_OK) return;
    const bool refuses = c.rank == 0 || c.rank == b;
    moe_ep_status_t st = a.dispatch(refuses ? unknown_flag : 0, nullptr);
    if (refuses) {
      told(seed + 2, "A's and B's refusal after their earlier ones", st);
    } else {
      named(seed + 2, "dispatch A and B refused", st, "rank 0 (and 1 more ranks) refused");
    }
  }
  still_usable(c, seed + 3);
}

// The last rank makes a dispatch with a smaller hidden than its peers
// (each rank's own arguments are valid): a peer would parse its rows at
// the wrong stride, so every rank's receive refuses the call, naming the
// rank that differs and both calls' shapes, reads no row, and the group
// goes on in step.
void hidden_differs_on_one_rank(Ctx& c, const Problem& p, uint64_t seed) {
  const int odd = c.world - 1;
  const int step = c.opt.dtype == "fp8" ? 128 : 8;
  // With one buffer set the dispatch after this failed one would follow
  // it on the same set with no combine between (README, "Limits").
  if (c.world < 2 || p.hidden <= step || !c.opt.double_buffer) return;
  {
    Dispatch d(c);
    if (c.rank == odd) {
      d.dp.hidden = p.hidden - step;
      d.t_x.shape[1] = d.dp.hidden;
      d.t_rx.shape[2] = d.dp.hidden;
      d.t_sc.shape[2] = d.dp.hidden / 128;
    }
    const std::string theirs = c.rank == odd ? "hidden=" + std::to_string(p.hidden)
                                             : "rank " + std::to_string(odd) +
                                                   " made this call with hidden=" +
                                                   std::to_string(p.hidden - step);
    expect_status(c, seed, "dispatch whose hidden differs on one rank",
                  c.api->dispatch(c.group, d.h, &d.dp, nullptr), MOE_EP_ERR_INVALID_ARGUMENT,
                  theirs.c_str());
  }
  still_usable(c, seed + 1);
}

// The last rank alone refuses a dispatch, then a combine, that its peers
// make (an unknown flag on that rank only): the peers' call fails at once
// naming it (INVALID_ARGUMENT, where waiting for it would end in TIMEOUT
// and a failed group), and every rank goes on in step.
void refused_on_one_rank(Ctx& c, const Problem& p, uint64_t seed) {
  const int odd = c.world - 1;
  const std::string named = "rank " + std::to_string(odd) + " refused its own call of this ";
  const uint32_t unknown_flag = 0x80;
  auto expect_refusal = [&](uint64_t s, const char* op, moe_ep_status_t st) {
    if (c.rank == odd) {
      expect_status(c, s, std::string(op) + " refused on this rank alone", st,
                    MOE_EP_ERR_INVALID_ARGUMENT, "its peers were told");
    } else {
      expect_status(c, s, std::string(op) + " whose peer refused its call", st,
                    MOE_EP_ERR_INVALID_ARGUMENT, (named + op).c_str());
    }
  };
  {
    LlCall a(c, p, seed);
    if (a.prepare() != MOE_EP_OK) return;
    expect_refusal(seed, "dispatch", a.dispatch(c.rank == odd ? unknown_flag : 0, nullptr));
  }
  still_usable(c, seed + 1);
  {
    LlCall a(c, p, seed + 2);
    if (a.prepare() != MOE_EP_OK ||
        !expect_status(c, seed + 2, "dispatch before a refused combine", a.dispatch(0, nullptr),
                       MOE_EP_OK)) {
      return;
    }
    a.check_dispatch();
    a.make_y();
    expect_refusal(seed + 2, "combine", a.combine(c.rank == odd ? unknown_flag : 0, nullptr));
  }
  still_usable(c, seed + 3);
  // Twice in a row, in pairs: each refusal is its own operation. With one
  // buffer set both refusals of a pair use one word, so the second waits
  // until every peer has made its operation, which comes after that peer's
  // receive of the first; without that wait a peer still reading the first
  // would meet the second and fail with MISMATCH (seen here before the
  // wait: a race, so the pairs repeat).
  for (int pair = 0; pair < 4; pair++) {
    for (uint64_t s : {seed + 4, seed + 5}) {
      LlCall a(c, p, s);
      if (a.prepare() != MOE_EP_OK) return;
      expect_refusal(s, "dispatch", a.dispatch(c.rank == odd ? unknown_flag : 0, nullptr));
    }
  }
  still_usable(c, seed + 6);
  if (c.world < 3) return;
  // Two ranks refuse; the others' call names the first and counts the
  // other.
  {
    LlCall a(c, p, seed + 7);
    if (a.prepare() != MOE_EP_OK) return;
    const bool refuses = c.rank >= c.world - 2;
    moe_ep_status_t st = a.dispatch(refuses ? unknown_flag : 0, nullptr);
    const std::string first = "rank " + std::to_string(c.world - 2) +
                              " (and 1 more ranks) refused its own call of this dispatch";
    expect_status(c, seed + 7, refuses ? "dispatch refused on two ranks" : "dispatch two peers refused",
                  st, MOE_EP_ERR_INVALID_ARGUMENT,
                  refuses ? "its peers were told" : first.c_str());
  }
  still_usable(c, seed + 8);
}

}  // namespace

void run_bad_input(Ctx& c) {
  Problem p = good_problem(c);
  int K = p.top_k;
  std::vector<int64_t> topk(static_cast<size_t>(K) * 2, 0);
  for (int k = 0; k < K; k++) topk[k] = k, topk[K + k] = k;
  topk[K + K - 1] = p.num_experts;  // one id past the end
  bad_prepare(c, "expert id >= num_experts", topk, 2, K, "num_experts");
  still_usable(c, 11);
  if (K >= 2) {
    std::vector<int64_t> twice(static_cast<size_t>(K), -1);
    twice[0] = 1;
    twice[K - 1] = 1;
    bad_prepare(c, "one expert twice in a token", twice, 1, K, "twice");
    still_usable(c, 17);
  }
  std::vector<int64_t> many(static_cast<size_t>(p.max_tokens_per_rank + 1) * K, -1);
  bad_prepare(c, "num_tokens > max_tokens_per_rank", many, p.max_tokens_per_rank + 1, K,
              "max_tokens_per_rank");
  still_usable(c, 12);
  {
    Dispatch d(c);
    if (c.opt.dtype == "fp8") {
      d.dp.hidden = p.hidden - 64;  // a multiple of 8 but not of 128
      d.t_x.shape[1] = d.dp.hidden;
      d.expect_refused("hidden not a multiple of 128 with fp8", MOE_EP_ERR_INVALID_ARGUMENT,
                       "multiple of 128");
      d.dp.hidden = p.hidden;
      d.t_x.shape[1] = p.hidden;
    }
    void* saved = d.t_rx.t.data;
    d.t_rx.t.data = nullptr;
    d.expect_refused("NULL recv_x", MOE_EP_ERR_INVALID_ARGUMENT, "recv_x->data is NULL");
    d.t_rx.t.data = saved;
    d.t_x.t.byte_offset = 2;
    d.expect_refused("misaligned x", MOE_EP_ERR_INVALID_ARGUMENT, "aligned");
    d.t_x.t.byte_offset = 0;
    d.t_x.t.dtype = dtype_of(DT::kF32);
    d.expect_refused("x as float32", MOE_EP_ERR_INVALID_ARGUMENT, "dtype");
    d.t_x.t.dtype = dtype_of(DT::kBf16);
    d.t_cnt.shape[0] = p.local_experts() + 1;
    d.expect_refused("recv_count of the wrong length", MOE_EP_ERR_INVALID_ARGUMENT, "shape");
    d.t_cnt.shape[0] = p.local_experts();
    d.dp.flags = 0x80;
    d.expect_refused("unknown flag", MOE_EP_ERR_INVALID_ARGUMENT, "unknown bits");
    d.dp.flags = 0;
    d.dp.format = 9;
    d.expect_refused("format out of range", MOE_EP_ERR_INVALID_ARGUMENT,
                     "moe_ep_dispatch_format_t");
    if (c.opt.dtype == "fp8") {  // bf16 rows do not fit an fp8 group's buffers
      d.dp.format = MOE_EP_FORMAT_BF16;
      d.expect_refused("bf16 call on an fp8 group", MOE_EP_ERR_UNSUPPORTED, "dispatch_dtype: bf16");
    }
    // What only high-throughput dispatch takes: per-token scales (0.5),
    // worst-case sizing and x_scales (0.3).
    d.dp.format = MOE_EP_FORMAT_FP8_PER_TOKEN;
    d.expect_refused("per-token format in LL", MOE_EP_ERR_INVALID_ARGUMENT,
                     "format of pre-quantised high-throughput rows");
    d.dp.format = MOE_EP_FORMAT_GROUP;
    d.dp.flags = MOE_EP_FLAG_WORST_CASE;
    d.expect_refused("worst-case flag in LL", MOE_EP_ERR_INVALID_ARGUMENT,
                     "MOE_EP_FLAG_WORST_CASE, which is for high_throughput dispatch");
    d.dp.flags = 0;
    d.dp.x_scales = d.t_sc.get();
    d.expect_refused("x_scales in LL", MOE_EP_ERR_INVALID_ARGUMENT,
                     "x_scales is for high_throughput dispatch; low-latency dispatch quantises "
                     "bf16 x itself");
    d.dp.x_scales = nullptr;
    d.dp.flags = 0;
  }
  still_usable(c, 13);
  {
    Dispatch d(c);
    moe_ep_handle_t* freed = d.h;
    c.api->handle_free(freed);
    d.h = nullptr;
    moe_ep_hook_t* hook = nullptr;
    expect_status(c, 0, "dispatch on a freed handle",
                  c.api->dispatch(c.group, freed, &d.dp, &hook), MOE_EP_ERR_INVALID_ARGUMENT,
                  "not a live handle");
    expect_status(c, 0, "hook_run of a bogus hook",
                  c.api->hook_run(reinterpret_cast<moe_ep_hook_t*>(&d), nullptr),
                  MOE_EP_ERR_INVALID_ARGUMENT, "not a live hook");
  }
  still_usable(c, 14);
  {
    // A low-latency handle takes one dispatch; the refused second one
    // leaves the first's receive and layout for the combine.
    LlCall a(c, p, 30);
    if (a.prepare() == MOE_EP_OK &&
        expect_status(c, 30, "dispatch", a.dispatch(0, nullptr), MOE_EP_OK)) {
      a.check_dispatch();
      expect_status(c, 30, "a second dispatch on a low-latency handle", a.dispatch(0, nullptr),
                    MOE_EP_ERR_INVALID_ARGUMENT, "a low-latency handle takes one dispatch");
      a.make_y();
      if (expect_status(c, 30, "combine after the refused second dispatch",
                        a.combine(0, nullptr), MOE_EP_OK)) {
        a.check_combine();
      }
    }
  }
  // Abandoning a receive breaks an nccl group by design: host backend only.
  if (c.opt.backend == "host") {
    hook_after_handle_address_reused(c, p, 23);
    still_usable(c, 25);
    dispatch_hook_freed(c, p, 26);
    still_usable(c, 27);
    refused_on_one_rank(c, p, 40);
    hidden_differs_on_one_rank(c, p, 50);
    refusal_after_abandoned_receive(c, p, 60);
  }
  // A double-buffered round with a refused third operation, hook run twice.
  ll_roundtrip(c, p, 15, true);
  {
    // Weights given to dispatch travel with the tokens: a combine naming
    // another weights tensor is refused (it would be silently ignored), and
    // the same handle then combines with NULL weights.
    LlCall call(c, p, 19);
    call.set_weights_at_dispatch(true);
    if (expect_status(c, 19, "weighted prepare", call.prepare(), MOE_EP_OK) &&
        expect_status(c, 19, "weighted dispatch", call.dispatch(0, nullptr), MOE_EP_OK)) {
      call.check_dispatch();
      call.make_y();
      moe_ep_hook_t* hook = reinterpret_cast<moe_ep_hook_t*>(0x1);
      expect_status(c, 19, "combine with weights other than dispatch's",
                    call.combine_with_other_weights(MOE_EP_FLAG_DEFER_RECV, &hook),
                    MOE_EP_ERR_INVALID_ARGUMENT, "not the tensor given to this handle's dispatch");
      if (hook != nullptr) fail(c, 19, "combine with other weights", "left a hook behind");
      if (expect_status(c, 19, "weighted combine (NULL weights)", call.combine(0, nullptr),
                        MOE_EP_OK))
        call.check_combine();
    }
  }
  moe_ep_group_info_t info = MOE_EP_INIT(moe_ep_group_info_t);
  expect_status(c, 0, "group_info", c.api->group_info(c.group, &info), MOE_EP_OK);
  expect_status(c, 0, "poll_error", c.api->group_poll_error(c.group), MOE_EP_OK);
  // The rule named as it applies: >= 0 where the backend uses no SMs.
  expect_status(c, 0, "set_num_sms(-1)", c.api->set_num_sms(c.group, -1),
                MOE_EP_ERR_INVALID_ARGUMENT,
                c.opt.backend == "host" ? "num_sms=-1 must be >= 0" : "num_sms=-1 must be in [0,");
  still_usable(c, 16);
}

}  // namespace moe_ep_test
