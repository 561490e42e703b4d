// ht_call.cc: an HT layer call against the oracle (see ht_call.h).
#include "tests/host/ht_call.h"

#include <algorithm>
#include <string>

namespace moe_ep_test {

using namespace moe_ep_oracle;

namespace {
bool fp8(const Problem& p) { return p.dispatch_dtype == DispatchDtype::kFp8; }
bool packed(const Problem& p) { return p.scale_format == ScaleFormat::kUe8m0Packed; }
int scale_cols(const Problem& p) { return packed(p) ? p.packed_scale_words() : p.scale_floats(); }
// The problem's fp8 rows as a per-call moe_ep_dispatch_format_t.
int32_t call_format(const Problem& p) {
  switch (p.scale_format) {
    case ScaleFormat::kUe8m0: return MOE_EP_FORMAT_FP8_UE8M0;
    case ScaleFormat::kUe8m0Packed: return MOE_EP_FORMAT_FP8_UE8M0_PACKED;
    case ScaleFormat::kPerToken: return MOE_EP_FORMAT_FP8_PER_TOKEN;
    default: return MOE_EP_FORMAT_FP8_F32;
  }
}
constexpr uint8_t kPoison = 0xA5;
}  // namespace

HtCall::HtCall(Ctx& c, const Problem& p, uint64_t seed)
    : c_(c), p_(p), seed_(seed), all_(make_all_inputs(p, seed)),
      want_(ht_dispatch_expected(p, all_, c.rank)), gpu_(c.opt.backend == "nccl") {
  if (fp8(p)) q_ = ht_fp8_input(p, all_[c.rank]);
  topk_ = all_[c.rank].topk_idx;
  out_.assign(static_cast<size_t>(all_[c.rank].num_tokens) * p.hidden, 0x7FC1);
}

HtCall::~HtCall() { c_.api->handle_free(h_); }

void* HtCall::place(std::unique_ptr<Mirror>& m, const void* host, size_t bytes) {
  m.reset(new Mirror);
  m->init(gpu_, const_cast<void*>(host), bytes);
  return m->ptr();
}

moe_ep_status_t HtCall::prepare(bool expect_ok) {
  const RankInputs& mine = all_[c_.rank];
  Tensor topk(place(m_topk_, topk_.data(), topk_.size() * 8), DT::kI64,
              {mine.num_tokens, p_.top_k}, dev(), c_.gpu);
  std::vector<int32_t> per_rank(p_.world, -1);
  Tensor t_per_rank(place(m_per_rank_, per_rank.data(), per_rank.size() * 4), DT::kI32,
                    {p_.world}, dev(), c_.gpu);
  moe_ep_prepare_params_t pp = MOE_EP_INIT(moe_ep_prepare_params_t);
  pp.topk_idx = topk.get();
  pp.num_tokens = mine.num_tokens;
  pp.top_k = p_.top_k;
  pp.num_tokens_per_rank = t_per_rank.get();
  pp.stream = stream_;
  moe_ep_status_t st = c_.api->prepare(c_.group, &pp, &h_);
  if (st != MOE_EP_OK) {
    if (expect_ok) expect_status(c_, seed_, "ht prepare", st, MOE_EP_OK);
    return st;
  }
  m_per_rank_->download();
  PrepareExpected pe = prepare_expected(p_, mine);
  expect_same(c_, seed_, "ht prepare num_tokens_per_rank",
              compare_exact_i32("num_tokens_per_rank", per_rank.data(),
                                pe.num_tokens_per_rank.data(), p_.world, p_.world));
  return st;
}

bool HtCall::route_out_of_range(int64_t value, int64_t* t, int64_t* k) {
  int64_t mine = -1;
  for (int s = 0; s < p_.world; ++s) {
    std::vector<int64_t>& ids = all_[s].topk_idx;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0) continue;
      ids[i] = -1;
      if (s == c_.rank) mine = static_cast<int64_t>(i);
      break;
    }
  }
  want_ = ht_dispatch_expected(p_, all_, c_.rank);
  topk_ = all_[c_.rank].topk_idx;
  if (mine < 0) return false;
  topk_[mine] = value;
  *t = mine / p_.top_k;
  *k = mine % p_.top_k;
  return true;
}

void HtCall::set_x_variant(int hidden) {
  p_.hidden = hidden;
  all_ = make_all_inputs(p_, seed_);  // the routing does not depend on hidden
  if (all_[c_.rank].topk_idx != topk_) {
    fail(c_, seed_, "set_x_variant", "the oracle's routing changed with hidden");
  }
  for (RankInputs& in : all_) {
    for (uint16_t& v : in.x) v = float_to_bf16(-0.5f * bf16_to_float(v) + 0.25f);
  }
  want_ = ht_dispatch_expected(p_, all_, c_.rank);
  if (fp8(p_)) q_ = ht_fp8_input(p_, all_[c_.rank]);
  out_.assign(static_cast<size_t>(all_[c_.rank].num_tokens) * hidden, 0x7FC1);
}

moe_ep_status_t HtCall::run(moe_ep_status_t st, moe_ep_hook_t* hook, uint32_t flags,
                            const char* what) {
  if (st != MOE_EP_OK && hook != nullptr) fail(c_, seed_, what, "a refused call returned a hook");
  if (st != MOE_EP_OK || !(flags & MOE_EP_FLAG_DEFER_RECV)) return st;
  st = c_.api->hook_run(hook, nullptr);
  expect_status(c_, seed_, what, st, MOE_EP_OK);
  c_.api->hook_free(hook);
  return st;
}

std::unique_ptr<HtCall::Buffers> HtCall::make_buffers(int64_t rows) {
  const RankInputs& mine = all_[c_.rank];
  const int T = mine.num_tokens, K = p_.top_k, H = p_.hidden, el = p_.local_experts();
  const bool f8 = fp8(p_);
  const int cols = scale_cols(p_);
  const size_t spare = static_cast<size_t>(rows) + 1;
  std::unique_ptr<Buffers> b(new Buffers);
  b->recv_x.assign(spare * H * (f8 ? 1 : 2), kPoison);
  b->recv_scales.assign(f8 ? spare * cols * 4 : 4, kPoison);
  b->recv_idx.assign(spare * K, -9);
  b->recv_w.assign(spare * K, -9.0f);
  b->recv_count.assign(el, -9);
  const size_t xs_bytes = f8 ? static_cast<size_t>(T) * cols * 4 : 0;
  if (f8)
    place(b->x, q_.x.data(), static_cast<size_t>(T) * H);
  else
    place(b->x, mine.x.data(), mine.x.size() * 2);
  place(b->xs, packed(p_) ? static_cast<const void*>(q_.packed.data())
                          : static_cast<const void*>(q_.scales.data()),
        xs_bytes);
  place(b->w, mine.topk_weights.data(), mine.topk_weights.size() * 4);
  place(b->rx, b->recv_x.data(), b->recv_x.size());
  place(b->rs, b->recv_scales.data(), b->recv_scales.size());
  place(b->ri, b->recv_idx.data(), b->recv_idx.size() * 4);
  place(b->rw, b->recv_w.data(), b->recv_w.size() * 4);
  place(b->rc, b->recv_count.data(), b->recv_count.size() * 4);
  return b;
}

void HtCall::stage(int64_t rows) {
  staged_ = make_buffers(rows);
  staged_rows_ = rows;
}

moe_ep_status_t HtCall::dispatch(uint32_t flags, int64_t rows, bool count_out,
                                 const std::function<void(moe_ep_dispatch_params_t&)>& tweak,
                                 moe_ep_hook_t** hook_out) {
  const RankInputs& mine = all_[c_.rank];
  const int T = mine.num_tokens, K = p_.top_k, H = p_.hidden, el = p_.local_experts();
  const bool f8 = fp8(p_);
  const int cols = scale_cols(p_);
  const int64_t n_before = n_recv_;
  n_recv_ = -1;
  std::unique_ptr<Buffers> b =
      staged_ && staged_rows_ == rows ? std::move(staged_) : make_buffers(rows);
  staged_.reset();
  const int d = dev(), g = c_.gpu;
  Tensor x(b->x->ptr(), f8 ? DT::kFp8 : DT::kBf16, {T, H}, d, g);
  Tensor xs(b->xs->ptr(), packed(p_) ? DT::kI32 : DT::kF32, {T, cols}, d, g);
  Tensor w(b->w->ptr(), DT::kF32, {T, K}, d, g);
  Tensor rx(b->rx->ptr(), f8 ? DT::kFp8 : DT::kBf16, {rows, H}, d, g);
  Tensor rs(b->rs->ptr(), packed(p_) ? DT::kI32 : DT::kF32, {rows, cols}, d, g);
  Tensor ri(b->ri->ptr(), DT::kI32, {rows, K}, d, g);
  Tensor rw(b->rw->ptr(), DT::kF32, {rows, K}, d, g);
  Tensor rc(b->rc->ptr(), DT::kI32, {el}, d, g);
  moe_ep_dispatch_params_t dp = MOE_EP_INIT(moe_ep_dispatch_params_t);
  dp.flags = flags;
  dp.stream = stream_;
  dp.hidden = H;
  dp.x = x.get();
  dp.x_scales = f8 ? xs.get() : nullptr;
  dp.format = f8 && c_.opt.per_call_format ? call_format(p_) : MOE_EP_FORMAT_GROUP;
  dp.topk_weights = w.get();
  dp.recv_x = rx.get();
  dp.recv_scales = f8 ? rs.get() : nullptr;
  dp.recv_topk_idx = ri.get();
  dp.recv_topk_weights = rw.get();
  dp.recv_count = rc.get();
  dp.num_recv_tokens = count_out ? &n_recv_ : nullptr;
  if (tweak) tweak(dp);
  moe_ep_hook_t* hook = nullptr;
  moe_ep_status_t st = c_.api->dispatch(c_.group, h_, &dp, &hook);
  if (st != MOE_EP_OK) {
    n_recv_ = n_before;
    // A refusal after the launch (a receive that timed out) leaves a kernel
    // that may still write them: kept until this call's end.
    refused_.push_back(std::move(b));
  } else {
    buf_ = std::move(b);
    flags_ = flags;
    rows_ = rows;
    count_out_ = count_out;
  }
  if (hook_out != nullptr) {
    *hook_out = hook;
    return st;
  }
  return run(st, hook, flags, "ht dispatch hook");
}

void HtCall::check_dispatch() {
  const int K = p_.top_k, H = p_.hidden, el = p_.local_experts(), cols = scale_cols(p_);
  const bool worst = (flags_ & MOE_EP_FLAG_WORST_CASE) != 0;
  const int64_t N = want_.num_recv;
  const std::string tag = std::string("ht dispatch") + (fp8(p_) ? " fp8" : "") +
                          (worst ? " worst-case" : "");
  if (!buf_) {
    fail(c_, seed_, tag, "no dispatch was accepted");
    return;
  }
  Buffers& b = *buf_;
  for (Mirror* m : {b.rx.get(), b.rs.get(), b.ri.get(), b.rw.get(), b.rc.get()}) m->download();
  // A worst-case dispatch on the GPU does not wait to learn N_recv: -1.
  const int64_t want_n = worst && gpu_ ? -1 : N;
  if (count_out_ && n_recv_ != want_n) {
    fail(c_, seed_, tag + " num_recv_tokens", "got " + std::to_string(n_recv_) + " want " +
                                                  std::to_string(want_n));
    return;
  }
  const size_t n = static_cast<size_t>(N);
  if (fp8(p_)) {
    expect_same(c_, seed_, tag + " recv_x",
                compare_exact_u8("recv_x", b.recv_x.data(), want_.recv_x_fp8.data(), n * H, H));
    const int32_t* got_s = reinterpret_cast<const int32_t*>(b.recv_scales.data());
    // Scales are compared as bits: they are carried, never computed.
    const int32_t* want_s = packed(p_) ? want_.recv_scales_packed.data()
                                       : reinterpret_cast<const int32_t*>(want_.recv_scales.data());
    expect_same(c_, seed_, tag + " recv_scales",
                compare_exact_i32("recv_scales", got_s, want_s, n * cols, cols));
  } else {
    expect_same(c_, seed_, tag + " recv_x",
                compare_exact_u16("recv_x", reinterpret_cast<const uint16_t*>(b.recv_x.data()),
                                  want_.recv_x.data(), n * H, H));
  }
  expect_same(c_, seed_, tag + " recv_topk_idx",
              compare_exact_i32("recv_topk_idx", b.recv_idx.data(), want_.recv_topk_idx.data(),
                                n * K, K));
  expect_same(c_, seed_, tag + " recv_topk_weights",
              compare_exact_f32("recv_topk_weights", b.recv_w.data(),
                                want_.recv_topk_weights.data(), n * K, K));
  expect_same(c_, seed_, tag + " recv_count",
              compare_exact_i32("recv_count", b.recv_count.data(),
                                want_.num_recv_tokens_per_expert.data(), el, el));
  // Worst case: the rows past N_recv name no expert. Every case: rows past
  // what the call may write stay untouched.
  const int64_t untouched = worst ? rows_ : N;
  for (int64_t r = N; r <= rows_; r++) {
    for (int k = 0; k < K; k++) {
      const int32_t want_i = r < untouched ? -1 : -9;
      const float want_w = r < untouched ? 0.0f : -9.0f;
      if (b.recv_idx[r * K + k] != want_i || b.recv_w[r * K + k] != want_w) {
        fail(c_, seed_, tag + " rows past N_recv",
             "row " + std::to_string(r) + " k " + std::to_string(k) + " (N_recv " +
                 std::to_string(N) + ", rows " + std::to_string(rows_) + "): got idx " +
                 std::to_string(b.recv_idx[r * K + k]) + " weight " +
                 std::to_string(b.recv_w[r * K + k]) + ", want " + std::to_string(want_i) + " / " +
                 std::to_string(want_w));
        return;
      }
    }
  }
  const size_t row_bytes = static_cast<size_t>(H) * (fp8(p_) ? 1 : 2);
  for (size_t i = static_cast<size_t>(untouched) * row_bytes; i < b.recv_x.size(); i += 61) {
    if (b.recv_x[i] != kPoison) {
      fail(c_, seed_, tag + " recv_x", "byte " + std::to_string(i) + " past row " +
                                           std::to_string(untouched) + " was written");
      return;
    }
  }
}

moe_ep_status_t HtCall::combine(uint32_t flags, int64_t rows, moe_ep_hook_t** hook_out) {
  const int T = all_[c_.rank].num_tokens, H = p_.hidden;
  // A member: a hook run later may still read it.
  y_ = ht_partials(p_, want_);
  y_.resize(static_cast<size_t>(rows) * H, 0x7FC1);  // NaN: a row read by mistake shows
  std::fill(out_.begin(), out_.end(), 0x7FC1);
  Tensor ty(place(m_y_, y_.data(), y_.size() * 2), DT::kBf16, {rows, H}, dev(), c_.gpu);
  Tensor to(place(m_out_, out_.data(), out_.size() * 2), DT::kBf16, {T, H}, dev(), c_.gpu);
  moe_ep_combine_params_t cp = MOE_EP_INIT(moe_ep_combine_params_t);
  cp.flags = flags;
  cp.stream = stream_;
  cp.hidden = H;
  cp.y = ty.get();
  cp.out = to.get();
  moe_ep_hook_t* hook = nullptr;
  moe_ep_status_t st = c_.api->combine(c_.group, h_, &cp, &hook);
  if (hook_out != nullptr) {
    *hook_out = hook;
    return st;
  }
  return run(st, hook, flags, "ht combine hook");
}

void HtCall::check_combine() {
  m_out_->download();
  std::vector<uint16_t> want = ht_combine_expected(p_, all_, c_.rank);
  // Ranks are summed in ascending order, as the oracle does: bit-exact.
  expect_same(c_, seed_, fp8(p_) ? "ht combine (fp8 dispatch)" : "ht combine",
              compare_exact_bf16("out", out_.data(), want.data(), want.size(), p_.hidden));
}

}  // namespace moe_ep_test
