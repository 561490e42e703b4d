// ll_call.cc: an LL layer call against the oracle (see ll_call.h).
#include "tests/host/ll_call.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <cmath>
#include <new>
#include <string>

namespace moe_ep_test {

using namespace moe_ep_oracle;

namespace {
// MOE_EP_TEST_TRACE=1 prints each step, so a hang shows where it is.
void trace(const Ctx& c, const char* step, uint64_t seed) {
  static const bool on = std::getenv("MOE_EP_TEST_TRACE") != nullptr;
  if (on) std::fprintf(stderr, "trace rank=%d seed=%llu %s\n", c.rank,
                       static_cast<unsigned long long>(seed), step);
}
bool fp8(const Problem& p) { return p.dispatch_dtype == DispatchDtype::kFp8; }
bool packed(const Problem& p) { return p.scale_format == ScaleFormat::kUe8m0Packed; }
// The problem's row format as a per-call moe_ep_dispatch_format_t.
int32_t call_format(const Problem& p) {
  if (!fp8(p)) return MOE_EP_FORMAT_BF16;
  switch (p.scale_format) {
    case ScaleFormat::kUe8m0: return MOE_EP_FORMAT_FP8_UE8M0;
    case ScaleFormat::kUe8m0Packed: return MOE_EP_FORMAT_FP8_UE8M0_PACKED;
    default: return MOE_EP_FORMAT_FP8_F32;
  }
}
int dev(const Ctx& c) { return c.opt.backend == "nccl" ? MOE_EP_DEVICE_CUDA : MOE_EP_DEVICE_CPU; }

// `full` as an engine built against an older header passes it: its first
// `size` bytes, then garbage the library must not read (0 = all of it).
template <typename P>
P truncated(const P& full, size_t size) {
  if (size == 0) return full;
  P t;
  std::memset(static_cast<void*>(&t), 0xA5, sizeof t);
  std::memcpy(static_cast<void*>(&t), &full, size);
  t.struct_size = size;
  return t;
}

// bf16 +inf, -inf, NaN and -NaN (payload 1).
const uint16_t kNonFinite[] = {0x7F80, 0xFF80, 0x7FC0, 0xFFC1};

// The non-finite scenario's inputs, reproducible on every rank: in every
// third token of each rank, four channels of one group become +inf, -inf,
// NaN, -NaN; in every seventh, a whole group holds nothing finite.
void add_non_finite(const Problem& p, uint64_t seed, std::vector<RankInputs>* all) {
  const int H = p.hidden, groups = H / 128;
  for (int r = 0; r < p.world; r++) {
    RankInputs& in = (*all)[r];
    for (int t = 0; t < in.num_tokens; t++) {
      uint16_t* row = in.x.data() + static_cast<size_t>(t) * H;
      const uint64_t h = seed * 31 + static_cast<uint64_t>(r) * 1009 + static_cast<uint64_t>(t);
      if ((t + r) % 3 == 0) {
        const int g = static_cast<int>(h % groups);
        for (int j = 0; j < 4; j++) row[g * 128 + (h / 7 + 37 * j) % 128] = kNonFinite[j];
      }
      if ((t + r) % 7 == 1) {
        const int g = static_cast<int>((h / 3) % groups);
        for (int i = 0; i < 128; i++) row[g * 128 + i] = kNonFinite[(h + i) % 4];
      }
    }
  }
}

bool bf16_is_nan(uint16_t v) { return (v & 0x7F80) == 0x7F80 && (v & 0x7F) != 0; }
}  // namespace

LlCall::LlCall(Ctx& c, const Problem& p, uint64_t seed)
    : c_(c), p_(p), seed_(seed), el_(p.local_experts()),
      slots_(p.world * p.max_tokens_per_rank), all_(make_all_inputs(p, seed)),
      want_(ll_dispatch_expected(p, all_, c.rank)), idx32_(seed % 2 == 1),
      gpu_(c.opt.backend == "nccl"),
      weights_at_dispatch_(c.opt.dispatch_weights == "1" ||
                           (c.opt.dispatch_weights == "mixed" && c.rank % 2 == 0)) {
  if (c.opt.non_finite) {
    add_non_finite(p, seed, &all_);
    want_ = ll_dispatch_expected(p, all_, c.rank);
  }
  const RankInputs& mine = all_[c.rank];
  int T = mine.num_tokens, K = p.top_k, H = p.hidden;
  size_t rows = static_cast<size_t>(el_) * slots_;
  size_t srow = packed(p) ? p.packed_scale_words() : p.scale_groups();
  recv_x_.resize(rows * H * (fp8(p) ? 1 : 2));
  recv_scales_.resize(fp8(p) ? rows * srow * 4 : 4);
  recv_count_.resize(el_);
  out_.resize(static_cast<size_t>(T) * H);
  per_rank_.resize(p.world);
  per_expert_.resize(p.num_experts);
  in_rank_.resize(static_cast<size_t>(T) * p.world + 1);
  poison_outputs();
  y_.assign(rows * H, 0);
  topk32_.assign(mine.topk_idx.begin(), mine.topk_idx.end());
  RankInputs& m = all_[c.rank];
  if (idx32_) {
    m_topk_.init(gpu_, topk32_.data(), topk32_.size() * 4);
  } else {
    m_topk_.init(gpu_, m.topk_idx.data(), m.topk_idx.size() * 8);
  }
  m_x_.init(gpu_, m.x.data(), m.x.size() * 2);
  m_rx_.init(gpu_, recv_x_.data(), recv_x_.size());
  m_sc_.init(gpu_, recv_scales_.data(), recv_scales_.size());
  m_cnt_.init(gpu_, recv_count_.data(), recv_count_.size() * 4);
  m_y_.init(gpu_, y_.data(), y_.size() * 2);
  m_w_.init(gpu_, m.topk_weights.data(), m.topk_weights.size() * 4);
  m_out_.init(gpu_, out_.data(), out_.size() * 2);
  m_per_rank_.init(gpu_, per_rank_.data(), per_rank_.size() * 4);
  m_per_expert_.init(gpu_, per_expert_.data(), per_expert_.size() * 4);
  m_in_rank_.init(gpu_, in_rank_.data(), in_rank_.size());
  new (&t_topk_) Tensor(m_topk_.ptr(), idx32_ ? DT::kI32 : DT::kI64, {T, K}, dev(c), c.gpu);
  new (&t_x_) Tensor(m_x_.ptr(), DT::kBf16, {T, H}, dev(c), c.gpu);
  new (&t_recv_x_) Tensor(m_rx_.ptr(), fp8(p) ? DT::kFp8 : DT::kBf16, {el_, slots_, H}, dev(c), c.gpu);
  new (&t_scales_) Tensor(m_sc_.ptr(), packed(p) ? DT::kI32 : DT::kF32,
                          {el_, slots_, static_cast<int64_t>(srow)}, dev(c), c.gpu);
  new (&t_count_) Tensor(m_cnt_.ptr(), DT::kI32, {el_}, dev(c), c.gpu);
  new (&t_y_) Tensor(m_y_.ptr(), DT::kBf16, {el_, slots_, H}, dev(c), c.gpu);
  new (&t_w_) Tensor(m_w_.ptr(), DT::kF32, {T, K}, dev(c), c.gpu);
  new (&t_out_) Tensor(m_out_.ptr(), DT::kBf16, {T, H}, dev(c), c.gpu);
  new (&t_per_rank_) Tensor(m_per_rank_.ptr(), DT::kI32, {p.world}, dev(c), c.gpu);
  new (&t_per_expert_) Tensor(m_per_expert_.ptr(), DT::kI32, {p.num_experts}, dev(c), c.gpu);
  new (&t_in_rank_) Tensor(m_in_rank_.ptr(), DT::kU8, {T, p.world}, dev(c), c.gpu);
}

LlCall::~LlCall() { c_.api->handle_free(h_); }

// Poisoned outputs: a row the plugin forgot to write cannot match.
void LlCall::poison_outputs() {
  std::fill(recv_x_.begin(), recv_x_.end(), 0xA5);
  std::fill(recv_scales_.begin(), recv_scales_.end(), 0xA5);
  std::fill(recv_count_.begin(), recv_count_.end(), -7);
  std::fill(out_.begin(), out_.end(), 0x7FC1);
  std::fill(per_rank_.begin(), per_rank_.end(), -1);
  std::fill(per_expert_.begin(), per_expert_.end(), -1);
  std::fill(in_rank_.begin(), in_rank_.end(), 0xEE);
}

void LlCall::reseed(uint64_t seed) {
  trace(c_, "reseed", seed);
  std::vector<RankInputs> fresh = make_all_inputs(p_, seed);
  if (c_.opt.non_finite) add_non_finite(p_, seed, &fresh);
  RankInputs& m = all_[c_.rank];
  const RankInputs& f = fresh[c_.rank];
  if (f.num_tokens != m.num_tokens) {
    fail(c_, seed, "reseed", "token count changed; graphs need fixed shapes");
    return;
  }
  std::copy(f.x.begin(), f.x.end(), m.x.begin());
  std::copy(f.topk_idx.begin(), f.topk_idx.end(), m.topk_idx.begin());
  std::copy(f.topk_weights.begin(), f.topk_weights.end(), m.topk_weights.begin());
  std::copy(f.topk_idx.begin(), f.topk_idx.end(), topk32_.begin());
  for (int r = 0; r < p_.world; r++) {
    if (r != c_.rank) all_[r] = fresh[r];
  }
  seed_ = seed;
  want_ = ll_dispatch_expected(p_, all_, c_.rank);
  poison_outputs();
  for (Mirror* mm : {&m_topk_, &m_x_, &m_w_, &m_rx_, &m_sc_, &m_cnt_, &m_out_, &m_per_rank_,
                     &m_per_expert_, &m_in_rank_}) {
    mm->upload();
  }
}

bool LlCall::corrupt_first_slot(int64_t value) {
  RankInputs& m = all_[c_.rank];
  if (m.num_tokens == 0) return false;
  m.topk_idx[0] = value;
  topk32_[0] = static_cast<int32_t>(value);
  m_topk_.upload();
  return true;
}

bool LlCall::repeat_expert_everywhere(int source, int64_t expert) {
  RankInputs& m = all_[source];
  std::fill(m.topk_idx.begin(), m.topk_idx.end(), expert);
  if (source == c_.rank) {
    std::fill(topk32_.begin(), topk32_.end(), static_cast<int32_t>(expert));
    m_topk_.upload();
  }
  return static_cast<int64_t>(m.num_tokens) * p_.top_k > p_.max_tokens_per_rank;
}

bool LlCall::dispatch_abandoned(const char* what) {
  moe_ep_hook_t* hook = nullptr;
  if (!expect_status(c_, seed_, what, dispatch(MOE_EP_FLAG_DEFER_RECV, &hook), MOE_EP_OK)) {
    return false;
  }
  c_.api->hook_free(hook);
  return true;
}

moe_ep_status_t LlCall::prepare(bool check) {
  moe_ep_status_t st = prepare_status();
  if (!expect_status(c_, seed_, "prepare", st, MOE_EP_OK)) return st;
  if (check) check_prepare();
  return st;
}

moe_ep_status_t LlCall::prepare_status() {
  trace(c_, "prepare", seed_);
  c_.api->handle_free(h_);
  h_ = nullptr;
  moe_ep_prepare_params_t pp = MOE_EP_INIT(moe_ep_prepare_params_t);
  pp.topk_idx = t_topk_.get();
  pp.num_tokens = all_[c_.rank].num_tokens;
  pp.top_k = p_.top_k;
  pp.stream = stream_;
  pp.num_tokens_per_rank = t_per_rank_.get();
  pp.num_tokens_per_expert = t_per_expert_.get();
  pp.is_token_in_rank = t_in_rank_.get();
  moe_ep_prepare_params_t sent = truncated(pp, prepare_size_);
  return c_.api->prepare(c_.group, &sent, &h_);
}

// The HT layout outputs lie past a v1-minimum prepare's struct_size: absent
// means NULL, so they keep their poison.
void LlCall::check_prepare_outputs_unwritten() {
  m_per_rank_.download();
  m_per_expert_.download();
  m_in_rank_.download();
  const std::string tag = "prepare(struct_size " + std::to_string(prepare_size_) + ") ";
  c_.checks++;
  if (std::any_of(per_rank_.begin(), per_rank_.end(), [](int32_t v) { return v != -1; }) ||
      std::any_of(per_expert_.begin(), per_expert_.end(), [](int32_t v) { return v != -1; }) ||
      std::any_of(in_rank_.begin(), in_rank_.end(), [](uint8_t v) { return v != 0xEE; })) {
    fail(c_, seed_, tag + "layout outputs",
         "written although they lie past struct_size (absent fields must default to NULL)");
  }
}

void LlCall::check_prepare() {
  trace(c_, "check_prepare", seed_);
  if (prepare_size_ != 0 && prepare_size_ < sizeof(moe_ep_prepare_params_t)) {
    check_prepare_outputs_unwritten();
    return;
  }
  m_per_rank_.download();
  m_per_expert_.download();
  m_in_rank_.download();
  // The oracle on this rank's routing, where an id outside -1..E-1 (the
  // routing scenario's corrupted slot) counts as -1: dispatch drops it, and
  // the nccl backend's layout describes what dispatch sends.
  RankInputs mine;
  mine.num_tokens = all_[c_.rank].num_tokens;
  mine.topk_idx = all_[c_.rank].topk_idx;
  for (int64_t& e : mine.topk_idx) {
    if (e < -1 || e >= p_.num_experts) e = -1;
  }
  PrepareExpected pe = prepare_expected(p_, mine);
  const std::string tag = idx32_ ? "prepare(int32 topk) " : "prepare(int64 topk) ";
  expect_same(c_, seed_, tag + "num_tokens_per_rank",
              compare_exact_i32("num_tokens_per_rank", per_rank_.data(),
                                pe.num_tokens_per_rank.data(), p_.world, p_.world));
  expect_same(c_, seed_, tag + "num_tokens_per_expert",
              compare_exact_i32("num_tokens_per_expert", per_expert_.data(),
                                pe.num_tokens_per_expert.data(), p_.num_experts,
                                p_.num_experts));
  expect_same(c_, seed_, tag + "is_token_in_rank",
              compare_exact_u8("is_token_in_rank", in_rank_.data(), pe.is_token_in_rank.data(),
                               pe.is_token_in_rank.size(), p_.world));
  if (in_rank_.back() != 0xEE) {  // the byte past [T, R]
    fail(c_, seed_, tag + "is_token_in_rank",
         "the byte past [T, R] was written (got " + std::to_string(in_rank_.back()) + ")");
  }
}

moe_ep_status_t LlCall::dispatch(uint32_t flags, moe_ep_hook_t** hook) {
  trace(c_, "dispatch", seed_);
  moe_ep_dispatch_params_t dp = MOE_EP_INIT(moe_ep_dispatch_params_t);
  dp.flags = flags | (c_.opt.round_scale ? MOE_EP_FLAG_ROUND_SCALE : 0u);
  dp.hidden = p_.hidden;
  dp.x = t_x_.get();
  dp.recv_x = t_recv_x_.get();
  dp.recv_scales = fp8(p_) ? t_scales_.get() : nullptr;
  dp.recv_count = t_count_.get();
  dp.stream = stream_;
  if (weights_at_dispatch_) dp.topk_weights = t_w_.get();
  if (c_.opt.per_call_format) dp.format = call_format(p_);
  moe_ep_dispatch_params_t sent = truncated(dp, dispatch_size_);
  return c_.api->dispatch(c_.group, h_, &sent, hook);
}

void LlCall::check_dispatch() {
  trace(c_, "check_dispatch", seed_);
  const char* tag = idx32_ ? "dispatch(int32 topk)" : "dispatch(int64 topk)";
  m_rx_.download();
  m_sc_.download();
  m_cnt_.download();
  expect_same(c_, seed_, tag,
              compare_exact_i32("recv_count", recv_count_.data(), want_.recv_count.data(), el_, el_));
  if (recv_count_ != want_.recv_count) return;
  int H = p_.hidden;
  size_t srow = packed(p_) ? p_.packed_scale_words() : p_.scale_groups();
  for (int e = 0; e < el_; e++) {
    for (int i = 0; i < want_.recv_count[e]; i++) {
      int64_t full = want_.full_row(e, i), row = want_.row(e, i);
      std::string where = std::string(tag) + " expert " + std::to_string(e) + " slot " +
                          std::to_string(i) + " (from rank " +
                          std::to_string(want_.slots[row].src_rank) + " token " +
                          std::to_string(want_.slots[row].src_token) + ")";
      std::string d;
      if (!fp8(p_)) {
        d = compare_exact_u16("recv_x", reinterpret_cast<uint16_t*>(recv_x_.data()) + full * H,
                              want_.x_bf16.data() + row * H, H, H);
      } else {
        d = compare_exact_u8("recv_x", recv_x_.data() + full * H, want_.x_fp8.data() + row * H, H, H);
        if (d.empty() && packed(p_)) {
          d = compare_exact_i32("recv_scales",
                                reinterpret_cast<int32_t*>(recv_scales_.data()) + full * srow,
                                want_.scales_packed.data() + row * srow, srow, srow);
        } else if (d.empty()) {
          const float* got = reinterpret_cast<float*>(recv_scales_.data()) + full * srow;
          d = compare_exact_f32("recv_scales", got, want_.scales.data() + row * srow, srow, srow);
          for (size_t g = 0; d.empty() && c_.opt.round_scale && g < srow; g++) {
            int e;
            if (std::frexp(got[g], &e) != 0.5f)
              d = "recv_scales[" + std::to_string(g) + "] = " + std::to_string(got[g]) +
                  " is not a power of two under MOE_EP_FLAG_ROUND_SCALE";
          }
        }
      }
      expect_same(c_, seed_, where, d);
      if (!d.empty()) return;  // one detailed failure per call is enough
    }
    // Slots past recv_count stay untouched (an overrun would land there).
    size_t row_bytes = static_cast<size_t>(H) * (fp8(p_) ? 1 : 2);
    for (int i = want_.recv_count[e]; i < slots_; i++) {
      const uint8_t* row = recv_x_.data() + want_.full_row(e, i) * row_bytes;
      for (size_t b = 0; b < row_bytes; b += 97) {
        if (row[b] != 0xA5) {
          fail(c_, seed_, tag,
               "expert " + std::to_string(e) + " slot " + std::to_string(i) +
                   " past recv_count " + std::to_string(want_.recv_count[e]) +
                   " was written (byte " + std::to_string(b) + ")");
          return;
        }
      }
    }
  }
}

void LlCall::make_y() {
  trace(c_, "make_y", seed_);
  std::vector<float> row(p_.hidden);
  for (int e = 0; e < el_; e++) {
    for (int i = 0; i < recv_count_[e] && i < want_.recv_count[e]; i++) {
      ll_received_row(p_, want_, want_.row(e, i), row.data());
      expert_fn_row(c_.rank * el_ + e, row.data(), p_.hidden,
                    y_.data() + want_.full_row(e, i) * p_.hidden);
    }
  }
  m_y_.upload();
}

moe_ep_status_t LlCall::combine(uint32_t flags, moe_ep_hook_t** hook) {
  trace(c_, "combine", seed_);
  // Weights that travelled with the dispatch: combine may pass the same
  // tensor or NULL; odd seeds take NULL.
  return combine_with(weights_at_dispatch_ && seed_ % 2 == 1 ? nullptr : t_w_.get(), flags, hook);
}

moe_ep_status_t LlCall::combine_with_other_weights(uint32_t flags, moe_ep_hook_t** hook) {
  // Same shape, dtype and device as the weights, other data (y's rows are
  // at least as large; the call must be refused before reading them).
  Tensor other(t_y_.t.data, DT::kF32, {t_w_.shape[0], t_w_.shape[1]},
               t_w_.t.device.device_type, t_w_.t.device.device_id);
  return combine_with(other.get(), flags, hook);
}

moe_ep_status_t LlCall::combine_with(moe_ep_tensor_t* weights, uint32_t flags,
                                     moe_ep_hook_t** hook) {
  moe_ep_combine_params_t cp = MOE_EP_INIT(moe_ep_combine_params_t);
  cp.flags = flags;
  cp.hidden = p_.hidden;
  cp.y = t_y_.get();
  cp.topk_weights = weights;
  cp.out = t_out_.get();
  cp.stream = stream_;
  moe_ep_combine_params_t sent = truncated(cp, combine_size_);
  return c_.api->combine(c_.group, h_, &sent, hook);
}

void LlCall::check_combine() {
  trace(c_, "check_combine", seed_);
  m_out_.download();
  std::vector<uint16_t> want = ll_combine_expected(p_, all_[c_.rank]);
  if (c_.opt.non_finite) {
    // Which NaN a float sum keeps depends on operand order: where the
    // oracle has a NaN, any NaN matches; both are then left out.
    for (size_t i = 0; i < want.size(); i++) {
      if (!bf16_is_nan(want[i])) continue;
      c_.checks++;
      if (!bf16_is_nan(out_[i])) {
        fail(c_, seed_, "combine", "out flat index " + std::to_string(i) + ": got bf16 bits " +
                                       std::to_string(out_[i]) + ", expected a NaN");
        return;
      }
      want[i] = out_[i] = 0;
    }
  }
  // The summation order is documented for both places the weights can be
  // applied, and every backend follows it: bit for bit, host and GPU.
  expect_same(c_, seed_,
              weights_at_dispatch_ ? "combine (weights at dispatch)" : "combine (weights at combine)",
              compare_exact_bf16("out", out_.data(), want.data(), want.size(), p_.hidden));
}

}  // namespace moe_ep_test
