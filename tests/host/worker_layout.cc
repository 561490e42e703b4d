// worker_layout.cc: handle_layout on LL handles: DeepEP's src_info and
// layout_range against the oracle's slot layout (both outputs, or either
// alone), after a direct or a deferred dispatch and after combine; refused
// before the dispatch's receive, for malformed outputs, for a handle whose
// buffer set a later dispatch reused, for a freed handle; the group stays
// usable.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tests/common/mirror.h"
#include "tests/common/plugin_api.h"
#include "tests/host/ll_call.h"
#include "tests/host/worker_common.h"

namespace moe_ep_test {

using namespace moe_ep_oracle;

namespace {

constexpr int32_t kSrcPoison = 0x5A5A5A5A;
constexpr int64_t kRangePoison = -77;

// The layout's outputs with one poisoned element past their end each, in
// device memory on the nccl backend (download() brings them back).
struct LayoutOut {
  std::vector<int32_t> src;
  std::vector<int64_t> range;
  Mirror m_src, m_range;
  Tensor t_src, t_range;
  moe_ep_handle_layout_params_t lp = moe_ep_handle_layout_params_init();
  LayoutOut(const Ctx& c, const Problem& p, bool with_src, bool with_range)
      : src(static_cast<size_t>(p.local_experts()) * p.world * p.max_tokens_per_rank + 1, kSrcPoison),
        range(static_cast<size_t>(p.local_experts()) * p.world + 1, kRangePoison) {
    const bool gpu = c.opt.backend == "nccl";
    const int dev = gpu ? MOE_EP_DEVICE_CUDA : MOE_EP_DEVICE_CPU;
    m_src.init(gpu, src.data(), src.size() * 4);
    m_range.init(gpu, range.data(), range.size() * 8);
    new (&t_src) Tensor(m_src.ptr(), DT::kI32, {p.local_experts(), p.world * p.max_tokens_per_rank},
                        dev, c.gpu);
    new (&t_range) Tensor(m_range.ptr(), DT::kI64, {p.local_experts(), p.world}, dev, c.gpu);
    lp.src_info = with_src ? t_src.get() : nullptr;
    lp.layout_range = with_range ? t_range.get() : nullptr;
  }
  void download() {
    m_src.download();
    m_range.download();
  }
};

std::string range_text(int64_t v) {
  return std::to_string(v) + " (begin " + std::to_string(v >> 32) + ", count " +
         std::to_string(v & 0xffffffff) + ")";
}

}  // namespace

void check_layout(Ctx& c, LlCall& call, const Problem& p, const std::string& what, bool with_src,
                  bool with_range, void* stream, const std::function<void()>& before_call,
                  const std::function<void()>& before_download) {
  LayoutOut o(c, p, with_src, with_range);
  o.lp.stream = stream;
  if (before_call) before_call();
  const moe_ep_status_t st = c.api->handle_layout(call.handle(), &o.lp);
  if (before_download) before_download();
  if (!expect_status(c, call.seed(), what, st, MOE_EP_OK)) return;
  o.download();
  LlHandleLayout want = ll_handle_layout(p, call.expected());
  const size_t n_src = want.src_info.size(), n_range = want.layout_range.size();
  if (with_src) {
    expect_same(c, call.seed(), what + " src_info",
                compare_exact_i32("src_info", o.src.data(), want.src_info.data(), n_src,
                                  static_cast<size_t>(p.world) * p.max_tokens_per_rank));
  }
  for (size_t i = 0; with_range && i < n_range; i++) {
    if (o.range[i] != want.layout_range[i]) {
      fail(c, call.seed(), what + " layout_range",
           "first at [expert " + std::to_string(i / p.world) + ", source " +
               std::to_string(i % p.world) + "]: got " + range_text(o.range[i]) + " want " +
               range_text(want.layout_range[i]));
      break;
    }
  }
  c.checks++;
  // A NULL output, and the element past each, stay untouched.
  bool src_ok = o.src[n_src] == kSrcPoison && (with_src || o.src[0] == kSrcPoison);
  bool range_ok = o.range[n_range] == kRangePoison && (with_range || o.range[0] == kRangePoison);
  if (!src_ok || !range_ok) {
    fail(c, call.seed(), what, std::string("wrote ") + (src_ok ? "layout_range" : "src_info") +
                                   " past its end or while it was NULL");
  }
}

namespace {

void refused(Ctx& c, uint64_t seed, const std::string& what, moe_ep_handle_t* h,
             const moe_ep_handle_layout_params_t* lp, moe_ep_status_t want, const char* must) {
  expect_status(c, seed, what, c.api->handle_layout(h, lp), want, must);
}

// One layer call: refused before its receive, then right after it (each
// output alone too) and after its combine; malformed outputs refused.
void layout_call(Ctx& c, const Problem& p, uint64_t seed) {
  LlCall call(c, p, seed);
  if (call.prepare() != MOE_EP_OK) return;
  LayoutOut o(c, p, true, true);
  refused(c, seed, "handle_layout before dispatch", call.handle(), &o.lp,
          MOE_EP_ERR_INVALID_ARGUMENT, "not been dispatched");
  moe_ep_hook_t* hook = nullptr;
  if (!expect_status(c, seed, "deferred dispatch", call.dispatch(MOE_EP_FLAG_DEFER_RECV, &hook),
                     MOE_EP_OK)) {
    return;
  }
  refused(c, seed, "handle_layout before the dispatch's hook ran", call.handle(), &o.lp,
          MOE_EP_ERR_INVALID_ARGUMENT, "a dispatch whose hook has not run yet");
  expect_status(c, seed, "dispatch hook_run", c.api->hook_run(hook, nullptr), MOE_EP_OK);
  c.api->hook_free(hook);
  call.check_dispatch();
  check_layout(c, call, p, "handle_layout", true, true);
  check_layout(c, call, p, "handle_layout (src_info only)", true, false);
  check_layout(c, call, p, "handle_layout (layout_range only)", false, true);
  LayoutOut bad(c, p, true, true);
  bad.t_src.shape[1] += 1;
  refused(c, seed, "src_info one column too many", call.handle(), &bad.lp,
          MOE_EP_ERR_INVALID_ARGUMENT, "params->src_info has shape");
  bad.t_src.shape[1] -= 1;
  bad.t_range.t.dtype = dtype_of(DT::kI32);
  refused(c, seed, "layout_range as int32", call.handle(), &bad.lp, MOE_EP_ERR_INVALID_ARGUMENT,
          "params->layout_range has dtype");
  bad.t_range.t.dtype = dtype_of(DT::kI64);
  refused(c, seed, "NULL params", call.handle(), nullptr, MOE_EP_ERR_INVALID_ARGUMENT,
          "params is NULL");
  bad.lp.struct_size = 24;  // without stream
  refused(c, seed, "params struct_size below the struct", call.handle(), &bad.lp,
          MOE_EP_ERR_INVALID_ARGUMENT, "struct_size=24");
  call.make_y();
  if (!expect_status(c, seed, "combine", call.combine(0, nullptr), MOE_EP_OK)) return;
  call.check_combine();
  check_layout(c, call, p, "handle_layout after combine", true, true);
}

// One dispatch more than there are buffer sets: the first handle's layout
// was replaced, and handle_layout says so as combine does.
void layout_after_reuse(Ctx& c, const Problem& p) {
  std::vector<std::unique_ptr<LlCall>> calls;
  for (uint64_t i = 0; i < 3; i++) {
    calls.emplace_back(new LlCall(c, p, 90 + i));
    if (calls.back()->prepare() != MOE_EP_OK) return;
  }
  for (auto& call : calls) {
    if (!expect_status(c, call->seed(), "dispatch", call->dispatch(0, nullptr), MOE_EP_OK)) return;
    call->check_dispatch();
    call->make_y();
  }
  LayoutOut o(c, p, true, true);
  refused(c, calls[0]->seed(), "handle_layout after its buffer set was reused", calls[0]->handle(),
          &o.lp, MOE_EP_ERR_INVALID_ARGUMENT, "overwritten by a later dispatch on the same set");
  refused(c, calls[0]->seed(), "handle_layout names itself", calls[0]->handle(), &o.lp,
          MOE_EP_ERR_INVALID_ARGUMENT, "handle_layout on rank");
  for (size_t i = 1; i < calls.size(); i++) {
    check_layout(c, *calls[i], p, "handle_layout of a live set", true, true);
    if (expect_status(c, calls[i]->seed(), "combine", calls[i]->combine(0, nullptr), MOE_EP_OK))
      calls[i]->check_combine();
  }
  moe_ep_handle_t* freed = calls[2]->release_handle();
  c.api->handle_free(freed);
  refused(c, 0, "handle_layout of a freed handle", freed, &o.lp, MOE_EP_ERR_INVALID_ARGUMENT,
          "not a live handle");
}

}  // namespace

void run_layout(Ctx& c) {
  const Generator gens[] = {Generator::kUniform, Generator::kSkewed, Generator::kAllToOneRank,
                            Generator::kEmptyRanks, Generator::kMasked};
  for (auto& layer : c.opt.layers) {
    for (Generator g : gens) {
      layout_call(c, problem_for(c, layer.first, layer.second, g), 5 + static_cast<uint64_t>(g));
    }
  }
  Problem p = problem_for(c, c.opt.layers[0].first, c.opt.layers[0].second, Generator::kSkewed);
  if (c.opt.double_buffer) layout_after_reuse(c, p);
  ll_roundtrip(c, p, 99, true);  // still usable
}

}  // namespace moe_ep_test
