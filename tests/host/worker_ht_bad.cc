// worker_ht_bad.cc: bad input to HT dispatch on a live multi-rank group:
// row format against x's dtype (bf16 and pre-quantised fp8), the scales'
// shape and dtype, worst-case capacity, receive tensors too small for what
// arrives, ranks whose calls differ in hidden or in the layer call (host),
// a second dispatch while the first's hook is pending, a stream of another
// CUDA context (nccl), handle_layout on an HT handle. Each is refused with the
// right status and a sentence naming the argument, returns no hook, and the
// group still works (verified round trips follow).
#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "tests/common/mirror.h"
#include "tests/common/plugin_api.h"
#include "tests/host/foreign_stream.h"
#include "tests/host/ht_call.h"
#include "tests/host/worker_common.h"

namespace moe_ep_test {

using namespace moe_ep_oracle;

namespace {

using Tweak = std::function<void(moe_ep_dispatch_params_t&)>;

Problem problem_of(const Ctx& c, DispatchDtype dtype) {
  Problem p = problem_for(c, c.opt.layers[0].first, c.opt.layers[0].second, Generator::kUniform);
  p.dispatch_dtype = dtype;
  return p;
}

void refused(Ctx& c, HtCall& call, const char* what, uint32_t flags, int64_t rows, bool count_out,
             const Tweak& tweak, moe_ep_status_t want, const char* must) {
  expect_status(c, call.seed(), what,
                call.dispatch(flags | MOE_EP_FLAG_DEFER_RECV, rows, count_out, tweak), want, must);
}

// A verified dispatch and combine on `call`'s handle.
void roundtrip(Ctx& c, HtCall& call, const char* what) {
  if (!expect_status(c, call.seed(), what, call.dispatch(0, call.num_recv()), MOE_EP_OK)) return;
  call.check_dispatch();
  if (expect_status(c, call.seed(), what, call.combine(0, call.num_recv()), MOE_EP_OK))
    call.check_combine();
}

moe_ep_tensor_t* mutable_tensor(const moe_ep_tensor_t* t) { return const_cast<moe_ep_tensor_t*>(t); }

void bf16_x(Ctx& c) {
  Problem p = problem_of(c, DispatchDtype::kBf16);
  HtCall call(c, p, 71);
  if (call.prepare() != MOE_EP_OK) return;
  const int64_t n = call.num_recv(), worst = static_cast<int64_t>(p.world) * p.max_tokens_per_rank;
  std::vector<float> scales(static_cast<size_t>(p.max_tokens_per_rank) * p.scale_groups() + 1);
  Tensor xs(scales.data(), DT::kF32, {num_tokens_for_rank(p, c.rank, 71), p.scale_groups()});
  refused(c, call, "fp8 format with a bf16 x", 0, n, true,
          [](moe_ep_dispatch_params_t& dp) { dp.format = MOE_EP_FORMAT_FP8_F32; },
          MOE_EP_ERR_INVALID_ARGUMENT, "asks for fp8 rows but params->x is bf16");
  refused(c, call, "x_scales with a bf16 x", 0, n, true,
          [&](moe_ep_dispatch_params_t& dp) { dp.x_scales = xs.get(); },
          MOE_EP_ERR_INVALID_ARGUMENT, "bf16 rows carry no scales");
  refused(c, call, "num_recv_tokens NULL without worst-case sizing", 0, n, false, nullptr,
          MOE_EP_ERR_INVALID_ARGUMENT, "only with MOE_EP_FLAG_WORST_CASE");
  refused(c, call, "worst-case dispatch one row short", MOE_EP_FLAG_WORST_CASE, worst - 1, true,
          nullptr, MOE_EP_ERR_INVALID_ARGUMENT,
          ("has " + std::to_string(worst - 1) + " rows; with MOE_EP_FLAG_WORST_CASE the receive "
           "tensors need at least world_size * max_tokens_per_rank").c_str());
  refused(c, call, "fp8 recv_x for bf16 rows", 0, n, true,
          [](moe_ep_dispatch_params_t& dp) { mutable_tensor(dp.recv_x)->dtype = dtype_of(DT::kFp8); },
          MOE_EP_ERR_INVALID_ARGUMENT, "params->recv_x has dtype");
  roundtrip(c, call, "bf16 round trip after refusals");
}

void fp8_x(Ctx& c) {
  Problem p = problem_of(c, DispatchDtype::kFp8);
  HtCall call(c, p, 73);
  if (call.prepare() != MOE_EP_OK) return;
  const int64_t n = call.num_recv();
  const int H = p.hidden;
  refused(c, call, "fp8 x without x_scales", 0, n, true,
          [](moe_ep_dispatch_params_t& dp) { dp.x_scales = nullptr; }, MOE_EP_ERR_INVALID_ARGUMENT,
          "params->x_scales is NULL but params->x is fp8_e4m3fn");
  refused(c, call, "bf16 format with an fp8 x", 0, n, true,
          [](moe_ep_dispatch_params_t& dp) { dp.format = MOE_EP_FORMAT_BF16; },
          MOE_EP_ERR_INVALID_ARGUMENT, "(bf16) but params->x is fp8_e4m3fn");
  refused(c, call, "x_scales one column too many", 0, n, true,
          [](moe_ep_dispatch_params_t& dp) { mutable_tensor(dp.x_scales)->shape[1] += 1; },
          MOE_EP_ERR_INVALID_ARGUMENT, "params->x_scales has shape");
  refused(c, call, "int32 x_scales for f32 scales", 0, n, true,
          [](moe_ep_dispatch_params_t& dp) {
            dp.format = MOE_EP_FORMAT_FP8_F32;
            mutable_tensor(dp.x_scales)->dtype = dtype_of(DT::kI32);
          },
          MOE_EP_ERR_INVALID_ARGUMENT, "params->x_scales has dtype");
  refused(c, call, "f32 x_scales for packed scales", 0, n, true,
          [](moe_ep_dispatch_params_t& dp) {
            dp.format = MOE_EP_FORMAT_FP8_UE8M0_PACKED;
            mutable_tensor(dp.x_scales)->dtype = dtype_of(DT::kF32);
          },
          MOE_EP_ERR_INVALID_ARGUMENT, "params->x_scales has dtype");
  // Per-token scales are [T, 1]: the 128-channel scales' columns are not
  // (hidden 128 aside, where both have one), nor are per-token
  // receive scales of another width.
  if (p.scale_groups() != 1) {
    refused(c, call, "128-channel x_scales with the per-token format", 0, n, true,
            [&p](moe_ep_dispatch_params_t& dp) {
              dp.format = MOE_EP_FORMAT_FP8_PER_TOKEN;
              mutable_tensor(dp.x_scales)->dtype = dtype_of(DT::kF32);
              mutable_tensor(dp.x_scales)->shape[1] = p.scale_groups();
            },
            MOE_EP_ERR_INVALID_ARGUMENT, "params->x_scales has shape");
  }
  refused(c, call, "per-token recv_scales two columns wide", 0, n, true,
          [](moe_ep_dispatch_params_t& dp) {
            dp.format = MOE_EP_FORMAT_FP8_PER_TOKEN;
            moe_ep_tensor_t* xs = mutable_tensor(dp.x_scales);
            xs->dtype = dtype_of(DT::kF32);
            xs->shape[1] = 1;
            mutable_tensor(dp.recv_scales)->dtype = dtype_of(DT::kF32);
            mutable_tensor(dp.recv_scales)->shape[1] = 2;
          },
          MOE_EP_ERR_INVALID_ARGUMENT, "params->recv_scales has shape");
  refused(c, call, "a format past the last", 0, n, true,
          [](moe_ep_dispatch_params_t& dp) { dp.format = MOE_EP_FORMAT_FP8_PER_TOKEN + 1; },
          MOE_EP_ERR_INVALID_ARGUMENT, "is not a moe_ep_dispatch_format_t value (0..5)");
  refused(c, call, "fp8 rows without recv_scales", 0, n, true,
          [](moe_ep_dispatch_params_t& dp) { dp.recv_scales = nullptr; },
          MOE_EP_ERR_INVALID_ARGUMENT, "params->recv_scales is NULL");
  refused(c, call, "fp8 hidden not a multiple of 128", 0, n, true,
          [H](moe_ep_dispatch_params_t& dp) {
            dp.hidden = H - 8;
            mutable_tensor(dp.x)->shape[1] = H - 8;
          },
          MOE_EP_ERR_INVALID_ARGUMENT, "multiple of 128");
  // The first dispatch's hook pending: neither another dispatch nor a
  // combine on the handle; handle_layout is LL only.
  moe_ep_hook_t* hook = nullptr;
  if (!expect_status(c, call.seed(), "deferred fp8 dispatch",
                     call.dispatch(MOE_EP_FLAG_DEFER_RECV, n, true, nullptr, &hook), MOE_EP_OK)) {
    return;
  }
  expect_status(c, call.seed(), "dispatch while the handle's hook is pending", call.dispatch(0, n),
                MOE_EP_ERR_INVALID_ARGUMENT, "a dispatch whose hook has not run yet");
  expect_status(c, call.seed(), "combine while the handle's hook is pending", call.combine(0, n),
                MOE_EP_ERR_INVALID_ARGUMENT, "a dispatch whose hook has not run yet");
  expect_status(c, call.seed(), "hook_run", c.api->hook_run(hook, nullptr), MOE_EP_OK);
  c.api->hook_free(hook);
  call.check_dispatch();
  moe_ep_handle_layout_params_t lp = moe_ep_handle_layout_params_init();
  expect_status(c, call.seed(), "handle_layout on an HT handle",
                c.api->handle_layout(call.handle(), &lp), MOE_EP_ERR_UNSUPPORTED, "LL only");
  if (expect_status(c, call.seed(), "fp8 combine", call.combine(0, n), MOE_EP_OK))
    call.check_combine();
  roundtrip(c, call, "fp8 round trip on the same handle after refusals");
}

// Bad routing on one rank only (a router bug there): HT prepare exchanges
// counts, so the others' prepares must fail too, naming that rank, instead
// of waiting for it until the group times out; the group stays usable.
void one_rank_refuses_prepare(Ctx& c) {
  Problem p = problem_of(c, DispatchDtype::kBf16);
  const int bad = c.world - 1;
  RankInputs in = make_inputs(p, c.rank, 77);
  std::vector<int64_t> topk = in.topk_idx;
  if (c.rank == bad && !topk.empty()) topk[0] = p.num_experts;
  Tensor t(topk.data(), DT::kI64, {in.num_tokens, p.top_k});
  moe_ep_prepare_params_t pp = MOE_EP_INIT(moe_ep_prepare_params_t);
  pp.topk_idx = t.get();
  pp.num_tokens = in.num_tokens;
  pp.top_k = p.top_k;
  moe_ep_handle_t* h = nullptr;
  const std::string must = c.rank == bad ? "is not an expert id"
                                         : "rank " + std::to_string(bad) +
                                               " refused its own prepare of this layer call";
  expect_status(c, 77, "prepare while rank " + std::to_string(bad) + "'s routing is bad",
                c.api->prepare(c.group, &pp, &h), MOE_EP_ERR_INVALID_ARGUMENT, must.c_str());
  if (h != nullptr) c.api->handle_free(h);
}

// nccl: a dispatch without MOE_EP_FLAG_WORST_CASE learns its count on the
// host (a stream sync). Captured into a CUDA graph it is refused before
// anything is launched, naming the flag, and the group stays usable
// (before, CUDA refused the sync, invalidated the capture and the group
// failed). Its buffers are on the device before the capture begins, so
// nothing but the dispatch runs inside it.
void dispatch_in_capture(Ctx& c) {
  Problem p = problem_of(c, DispatchDtype::kBf16);
  HtCall call(c, p, 78);
  if (call.prepare() != MOE_EP_OK) return;
  const int64_t T = num_tokens_for_rank(p, c.rank, 78), H = p.hidden, K = p.top_k;
  const int64_t rows = call.num_recv() + 1, el = p.local_experts();
  const size_t sizes[] = {static_cast<size_t>(T * H * 2), static_cast<size_t>(T * K * 4),
                          static_cast<size_t>(rows * H * 2), static_cast<size_t>(rows * K * 4),
                          static_cast<size_t>(rows * K * 4), static_cast<size_t>(el * 4)};
  void* d[6] = {};
  for (int i = 0; i < 6; i++) {
    cuda_check(cudaMalloc(&d[i], sizes[i] + 16), "cudaMalloc");
    cuda_check(cudaMemset(d[i], 0, sizes[i] + 16), "cudaMemset");
  }
  const int cuda = MOE_EP_DEVICE_CUDA;
  Tensor x(d[0], DT::kBf16, {T, H}, cuda, c.gpu), w(d[1], DT::kF32, {T, K}, cuda, c.gpu),
      rx(d[2], DT::kBf16, {rows, H}, cuda, c.gpu), ri(d[3], DT::kI32, {rows, K}, cuda, c.gpu),
      rw(d[4], DT::kF32, {rows, K}, cuda, c.gpu), rc(d[5], DT::kI32, {el}, cuda, c.gpu);
  int64_t n_recv = -1;
  cudaStream_t s;
  cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  moe_ep_dispatch_params_t dp = MOE_EP_INIT(moe_ep_dispatch_params_t);
  dp.hidden = static_cast<int32_t>(H);
  dp.x = x.get();
  dp.topk_weights = w.get();
  dp.recv_x = rx.get();
  dp.recv_topk_idx = ri.get();
  dp.recv_topk_weights = rw.get();
  dp.recv_count = rc.get();
  dp.num_recv_tokens = &n_recv;
  dp.stream = s;
  moe_ep_hook_t* hook = nullptr;
  cuda_check(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), "cudaStreamBeginCapture");
  const moe_ep_status_t st = c.api->dispatch(c.group, call.handle(), &dp, &hook);
  const std::string msg = c.api->last_error();
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(s, &graph);
  expect_status(c, 78, "captured dispatch without MOE_EP_FLAG_WORST_CASE", st,
                MOE_EP_ERR_INVALID_ARGUMENT, "lacks MOE_EP_FLAG_WORST_CASE");
  c.checks++;
  if (hook != nullptr) fail(c, 78, "captured dispatch refused", "returned a hook");
  c.checks++;
  if (ended != cudaSuccess)
    fail(c, 78, "captured dispatch refused", std::string("the capture was invalidated: ") +
                                                 cudaGetErrorString(ended) + " (" + msg + ")");
  if (graph != nullptr) cudaGraphDestroy(graph);
  // A stream whose capture an earlier call invalidated (a synchronisation,
  // refused in global mode): refused as bad input naming params->stream,
  // not as the WORST_CASE rule nor as a CUDA failure of the group.
  cuda_check(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
  c.checks++;
  if (cudaStreamSynchronize(s) == cudaSuccess)
    fail(c, 78, "invalidated capture", "cudaStreamSynchronize in a capture succeeded");
  hook = nullptr;
  const moe_ep_status_t inval = c.api->dispatch(c.group, call.handle(), &dp, &hook);
  graph = nullptr;
  (void)cudaStreamEndCapture(s, &graph);
  if (graph != nullptr) cudaGraphDestroy(graph);
  (void)cudaGetLastError();
  expect_status(c, 78, "dispatch on a stream in an invalidated capture", inval,
                MOE_EP_ERR_INVALID_ARGUMENT, "capture that an earlier call invalidated");
  cudaStreamDestroy(s);
  for (void* b : d) cudaFree(b);
  expect_status(c, 78, "poll_error after the refused capture", c.api->group_poll_error(c.group),
                MOE_EP_OK);
  roundtrip(c, call, "eager round trip after the refused capture");
}

// nccl: an eager dispatch without MOE_EP_FLAG_WORST_CASE made by a thread
// that is capturing a graph on another stream: CUDA refuses that thread the
// host wait that learns N_recv, so the call is refused at once naming the
// capture (before, it spun until 4 x timeouts.kernel_ms and failed the
// group). At one rank nothing else waits for the dropped rows; with more,
// every rank's call is made beside a capture, so every rank skips the
// combine alike. The group then goes on.
void dispatch_beside_capture(Ctx& c) {
  Problem p = problem_of(c, DispatchDtype::kBf16);
  HtCall call(c, p, 86);
  if (call.prepare() != MOE_EP_OK) return;
  const int64_t rows = call.num_recv();
  call.stage(rows);  // uploads are not allowed once the capture begins
  cudaStream_t other;
  cuda_check(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), "cudaStreamCreate");
  cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  cuda_check(cudaStreamBeginCapture(other, cudaStreamCaptureModeThreadLocal),
             "cudaStreamBeginCapture");
  const moe_ep_status_t st = call.dispatch(0, rows);
  const std::string msg = c.api->last_error();
  cudaGraph_t graph = nullptr;
  (void)cudaStreamEndCapture(other, &graph);  // invalidated by CUDA's refusal
  if (graph != nullptr) cudaGraphDestroy(graph);
  (void)cudaGetLastError();
  cudaStreamDestroy(other);
  expect_status(c, 86, "eager dispatch by a thread capturing another stream", st,
                MOE_EP_ERR_INVALID_ARGUMENT, "this thread is capturing a CUDA graph");
  expect_status(c, 86, "poll_error after a dispatch beside a capture",
                c.api->group_poll_error(c.group), MOE_EP_OK);
  roundtrip(c, call, "eager round trip after a dispatch beside a capture");
}

// nccl: a prepare whose layout outputs would be written on a stream in a
// capture an earlier call invalidated is refused as bad input naming
// params->stream (its launch there would fail the group), and the group
// goes on.
void prepare_on_invalidated_capture(Ctx& c) {
  Problem p = problem_of(c, DispatchDtype::kBf16);
  const RankInputs in = make_inputs(p, c.rank, 84);
  const int64_t T = in.num_tokens;
  // Device tensors made before the capture: no allocation or copy inside it.
  void* d[2] = {};
  const size_t sizes[2] = {static_cast<size_t>(T * p.top_k * 8), static_cast<size_t>(p.world) * 4};
  for (int i = 0; i < 2; i++) cuda_check(cudaMalloc(&d[i], sizes[i] + 16), "cudaMalloc");
  if (T > 0)
    cuda_check(cudaMemcpy(d[0], in.topk_idx.data(), sizes[0], cudaMemcpyHostToDevice),
               "cudaMemcpy");
  const int cuda = MOE_EP_DEVICE_CUDA;
  Tensor topk(d[0], DT::kI64, {T, p.top_k}, cuda, c.gpu),
      per_rank(d[1], DT::kI32, {p.world}, cuda, c.gpu);
  cudaStream_t s;
  cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  moe_ep_prepare_params_t pp = MOE_EP_INIT(moe_ep_prepare_params_t);
  pp.topk_idx = topk.get();
  pp.num_tokens = static_cast<int32_t>(T);
  pp.top_k = p.top_k;
  pp.num_tokens_per_rank = per_rank.get();
  pp.stream = s;
  cuda_check(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
  c.checks++;
  if (cudaStreamSynchronize(s) == cudaSuccess)
    fail(c, 84, "invalidated capture", "cudaStreamSynchronize in a capture succeeded");
  moe_ep_handle_t* h = nullptr;
  const moe_ep_status_t st = c.api->prepare(c.group, &pp, &h);
  const std::string msg = c.api->last_error();
  cudaGraph_t graph = nullptr;
  (void)cudaStreamEndCapture(s, &graph);
  if (graph != nullptr) cudaGraphDestroy(graph);
  (void)cudaGetLastError();
  cudaStreamDestroy(s);
  if (h != nullptr) c.api->handle_free(h);
  for (void* b : d) cudaFree(b);
  expect_status(c, 84, "prepare on a stream in an invalidated capture", st,
                MOE_EP_ERR_INVALID_ARGUMENT, "capture that an earlier call invalidated");
  c.checks++;
  if (msg.find("params->stream=") == std::string::npos)
    fail(c, 84, "prepare on a stream in an invalidated capture", "does not name params->stream: " + msg);
  expect_status(c, 84, "poll_error after the refused prepare", c.api->group_poll_error(c.group),
                MOE_EP_OK);
  HtCall call(c, p, 85);
  if (call.prepare() == MOE_EP_OK) roundtrip(c, call, "round trip after the refused prepare");
}

// nccl: a stream of a context of its own on the group's GPU, where the
// group's memory is not mapped: a dispatch there, and a deferred
// dispatch's hook_run there, are refused as bad input naming the stream
// (before, the launch there failed the group), as is that hook's run on a
// capturing stream (the dispatch learns its count on the host). The
// refused hook stays pending and runs on the default stream; both halves
// are checked against the oracle.
void foreign_stream(Ctx& c) {
  Problem p = problem_of(c, DispatchDtype::kBf16);
  HtCall call(c, p, 86);
  if (call.prepare() != MOE_EP_OK) return;
  ForeignStream foreign(c.gpu);
  c.checks++;
  if (foreign.stream() == nullptr) {
    fail(c, 86, "a stream of another context", foreign.error());
    return;
  }
  void* other = foreign.stream();
  const int64_t n = call.num_recv();
  refused(c, call, "dispatch on another context's stream", 0, n, true,
          [other](moe_ep_dispatch_params_t& dp) { dp.stream = other; },
          MOE_EP_ERR_INVALID_ARGUMENT, "belongs to a CUDA context other than device");
  moe_ep_hook_t* hook = nullptr;
  if (!expect_status(c, 86, "deferred dispatch",
                     call.dispatch(MOE_EP_FLAG_DEFER_RECV, n, true, nullptr, &hook), MOE_EP_OK))
    return;
  expect_status(c, 86, "hook_run on another context's stream", c.api->hook_run(hook, other),
                MOE_EP_ERR_INVALID_ARGUMENT, "stream=");
  // A hook of a dispatch without MOE_EP_FLAG_WORST_CASE (a host sync) run
  // on a capturing stream: refused before it counts as run, too.
  cudaStream_t cap;
  cuda_check(cudaStreamCreateWithFlags(&cap, cudaStreamNonBlocking), "cudaStreamCreate");
  cuda_check(cudaStreamBeginCapture(cap, cudaStreamCaptureModeRelaxed), "cudaStreamBeginCapture");
  const moe_ep_status_t in_capture = c.api->hook_run(hook, cap);
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(cap, &graph);
  if (graph != nullptr) cudaGraphDestroy(graph);
  cudaStreamDestroy(cap);
  expect_status(c, 86, "hook_run in a capture of a dispatch without MOE_EP_FLAG_WORST_CASE",
                in_capture, MOE_EP_ERR_INVALID_ARGUMENT, "lacks MOE_EP_FLAG_WORST_CASE");
  c.checks++;
  if (ended != cudaSuccess)
    fail(c, 86, "refused hook_run in a capture",
         std::string("the capture was invalidated: ") + cudaGetErrorString(ended));
  const moe_ep_status_t ran = c.api->hook_run(hook, nullptr);
  c.api->hook_free(hook);
  if (!expect_status(c, 86, "the refused hook run on the default stream", ran, MOE_EP_OK)) return;
  call.check_dispatch();
  if (expect_status(c, 86, "combine after the refusals", call.combine(0, n), MOE_EP_OK))
    call.check_combine();
}

// nccl: set_num_sms(0) returns an HT group to the backend's default of 24
// SMs (fewer on a smaller GPU), not to every SM.
void default_sms_again(Ctx& c) {
  int sms = 0;
  cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, c.gpu),
             "cudaDeviceGetAttribute");
  const int32_t want = sms < 24 ? sms : 24;
  int32_t used = -1;
  // One channel is two blocks: one SM is refused, not reported as used.
  expect_status(c, 0, "set_num_sms(1)", c.api->set_num_sms(c.group, 1),
                MOE_EP_ERR_INVALID_ARGUMENT, "num_sms=1 is below the 2 SMs");
  expect_status(c, 0, "set_num_sms(8)", c.api->set_num_sms(c.group, 8), MOE_EP_OK);
  expect_status(c, 0, "set_num_sms(0)", c.api->set_num_sms(c.group, 0), MOE_EP_OK);
  expect_status(c, 0, "max_sms_used", c.api->max_sms_used(c.group, &used), MOE_EP_OK);
  c.checks++;
  if (used != want)
    fail(c, 0, "set_num_sms(0) on an HT group",
         "max_sms_used is " + std::to_string(used) + ", want the default " + std::to_string(want));
}

// A worst-case dispatch, then a cached dispatch on the same handle whose
// receive tensors hold exactly this rank's rows (prepare's count): accepted
// and right. On the nccl backend the worst-case dispatch's row capacity
// stood in for the count, and the second dispatch was refused ("receives
// R*M tokens").
void worst_case_then_exact(Ctx& c) {
  // Masked routing: a token with no expert, so even one rank receives fewer
  // rows than the worst case.
  Problem p = problem_for(c, c.opt.layers[0].first, c.opt.layers[0].second, Generator::kMasked);
  HtCall call(c, p, 76);
  if (call.prepare() != MOE_EP_OK) return;
  const int64_t worst = static_cast<int64_t>(p.world) * p.max_tokens_per_rank;
  if (!expect_status(c, 76, "worst-case dispatch", call.dispatch(MOE_EP_FLAG_WORST_CASE, worst),
                     MOE_EP_OK))
    return;
  call.check_dispatch();
  roundtrip(c, call, "cached dispatch of exactly the rows received, after a worst-case one");
}

// nccl: receive tensors one row short of what this rank receives (known
// only once the dispatch kernel has counted): the call reports
// INVALID_ARGUMENT with both numbers, every rank skips the combine, and a
// dispatch of the right size on the same handle then works.
void too_few_rows(Ctx& c) {
  Problem p = problem_of(c, DispatchDtype::kBf16);
  HtCall call(c, p, 78);
  if (call.prepare() != MOE_EP_OK) return;
  const int64_t n = call.num_recv();
  if (n < 1) {  // nothing to be short of: the peers' calls go on as usual
    roundtrip(c, call, "dispatch of no rows, where the peers' are one row short");
    return;
  }
  const std::string must = "received " + std::to_string(n) + " rows but params->recv_x holds " +
                           std::to_string(n - 1);
  expect_status(c, 78, "dispatch into too few rows", call.dispatch(0, n - 1),
                MOE_EP_ERR_INVALID_ARGUMENT, must.c_str());
  roundtrip(c, call, "dispatch of the rows received, after one into too few");
}

// The same with the receive deferred and the hook freed unrun: nothing
// reads that dispatch's count, and nothing of it is blamed on the next
// dispatch (once a notice its kernel left was).
void too_few_rows_abandoned(Ctx& c) {
  Problem p = problem_of(c, DispatchDtype::kBf16);
  HtCall call(c, p, 80);
  if (call.prepare() != MOE_EP_OK) return;
  const int64_t n = call.num_recv();
  moe_ep_hook_t* hook = nullptr;
  if (!expect_status(c, 80, "deferred dispatch into too few rows",
                     call.dispatch(MOE_EP_FLAG_DEFER_RECV, n > 0 ? n - 1 : 0, true, nullptr,
                                   &hook),
                     MOE_EP_OK))
    return;
  c.api->hook_free(hook);
  HtCall next(c, p, 81);
  if (next.prepare() == MOE_EP_OK)
    roundtrip(c, next, "dispatch after an abandoned one into too few rows");
}

// The last rank makes a dispatch with a smaller hidden than its peers (each
// rank's own arguments are valid): its rows would be read at the wrong
// layout, so every rank refuses the call, naming a rank that differs and
// both calls' shapes, and reads no row; the handle then has no dispatch to
// combine, and a dispatch of matching shapes on it works. Eager, then with
// the receive deferred to the hook.
void hidden_differs_on_one_rank(Ctx& c) {
  // With one buffer set the dispatch after the refused one would follow it
  // on the same set with no combine between (README, "Limits").
  if (c.world < 2 || !c.opt.double_buffer) return;
  Problem p = problem_of(c, DispatchDtype::kBf16);
  HtCall call(c, p, 82);
  if (call.prepare() != MOE_EP_OK) return;
  const int odd = c.world - 1, H = p.hidden, smaller = H - 8;
  const int64_t n = call.num_recv();
  const Tweak shrink = [&](moe_ep_dispatch_params_t& dp) {
    if (c.rank != odd) return;
    dp.hidden = smaller;
    mutable_tensor(dp.x)->shape[1] = smaller;
    mutable_tensor(dp.recv_x)->shape[1] = smaller;
  };
  const std::string must = c.rank == odd ? "rank 0 made this call with hidden=" + std::to_string(H)
                                         : "rank " + std::to_string(odd) +
                                               " made this call with hidden=" +
                                               std::to_string(smaller);
  expect_status(c, 82, "dispatch whose hidden differs on one rank", call.dispatch(0, n, true, shrink),
                MOE_EP_ERR_INVALID_ARGUMENT, must.c_str());
  expect_status(c, 82, "combine of the refused dispatch", call.combine(0, n),
                MOE_EP_ERR_INVALID_ARGUMENT, "combine needs a completed dispatch");
  roundtrip(c, call, "dispatch of matching shapes after one whose hidden differed");
  moe_ep_hook_t* hook = nullptr;
  if (!expect_status(c, 83, "deferred dispatch whose hidden differs on one rank",
                     call.dispatch(MOE_EP_FLAG_DEFER_RECV, n, true, shrink, &hook), MOE_EP_OK))
    return;
  expect_status(c, 83, "hook_run of a dispatch whose hidden differs on one rank",
                c.api->hook_run(hook, nullptr), MOE_EP_ERR_INVALID_ARGUMENT, must.c_str());
  c.api->hook_free(hook);
  roundtrip(c, call, "dispatch of matching shapes after a deferred one whose hidden differed");
}

// Host backend: two layer calls are prepared, and the last rank dispatches
// the second while the others dispatch the first. Each receiver sized
// recv_x from its own handle's count exchange, so the last rank's rows
// would be read as the other call's (an overflow of recv_x, or the wrong
// rows in silence when the counts agree): every rank refuses the call,
// naming a rank whose call differs, reads no row, and both calls then work.
// Eager, then with the receive deferred to the hook.
void layer_calls_differ(Ctx& c) {
  if (c.world < 2 || !c.opt.double_buffer) return;  // as in hidden_differs_on_one_rank
  Problem p = problem_of(c, DispatchDtype::kBf16);
  HtCall first(c, p, 84), second(c, p, 85);
  if (first.prepare() != MOE_EP_OK || second.prepare() != MOE_EP_OK) return;
  const int odd = c.world - 1;
  HtCall& mine = c.rank == odd ? second : first;
  const std::string must = "rank " + std::to_string(c.rank == odd ? 0 : odd) +
                           " dispatched the layer call of its prepare number";
  expect_status(c, mine.seed(), "dispatch of another layer call than the last rank's",
                mine.dispatch(0, mine.num_recv()), MOE_EP_ERR_INVALID_ARGUMENT, must.c_str());
  roundtrip(c, first, "the first layer call after a dispatch of two different ones");
  moe_ep_hook_t* hook = nullptr;
  if (!expect_status(c, mine.seed(), "deferred dispatch of another layer call than the last rank's",
                     mine.dispatch(MOE_EP_FLAG_DEFER_RECV, mine.num_recv(), true, nullptr, &hook),
                     MOE_EP_OK))
    return;
  expect_status(c, mine.seed(), "hook_run of a dispatch of another layer call than the last rank's",
                c.api->hook_run(hook, nullptr), MOE_EP_ERR_INVALID_ARGUMENT, must.c_str());
  c.api->hook_free(hook);
  roundtrip(c, second, "the second layer call after a deferred dispatch of two different ones");
}

}  // namespace

// nccl: a device-resident topk_idx with an out-of-range expert id. The
// dispatch cannot check it before launching (that would need a sync); the
// kernel sends the slot as -1 and notes it, and group_poll_error reports
// it once as INVALID_ARGUMENT naming the entry. The round trip matches the
// oracle with that slot -1 (every rank corrupts its own first routed slot),
// and the group stays usable.
void out_of_range_id(Ctx& c) {
  HtCall call(c, problem_of(c, DispatchDtype::kBf16), 83);
  const int64_t bad = c.opt.num_experts + 9;
  int64_t t = -1, k = -1;
  const bool routed = call.route_out_of_range(bad, &t, &k);
  if (call.prepare() != MOE_EP_OK) return;
  roundtrip(c, call, "dispatch with an out-of-range id");
  if (!routed) return;
  const std::string want = "dispatch on rank " + std::to_string(c.rank) + ": topk_idx[" +
                           std::to_string(t) + "][" + std::to_string(k) + "] = " +
                           std::to_string(bad) + " is outside -1.." +
                           std::to_string(c.opt.num_experts - 1);
  expect_status(c, call.seed(), "poll_error after the out-of-range id",
                c.api->group_poll_error(c.group), MOE_EP_ERR_INVALID_ARGUMENT, want.c_str());
  expect_status(c, call.seed(), "poll_error again (reported once)",
                c.api->group_poll_error(c.group), MOE_EP_OK);
}

void run_ht_bad_input(Ctx& c) {
  bf16_x(c);
  fp8_x(c);
  worst_case_then_exact(c);
  hidden_differs_on_one_rank(c);
  // Only the host backend's HT prepare is collective (the nccl one counts in
  // the dispatch kernel).
  if (c.opt.backend == "host") {
    one_rank_refuses_prepare(c);
    layer_calls_differ(c);
  }
  if (c.opt.backend == "nccl") {
    dispatch_in_capture(c);
    dispatch_beside_capture(c);
    prepare_on_invalidated_capture(c);
    foreign_stream(c);
    default_sms_again(c);
    too_few_rows(c);
    too_few_rows_abandoned(c);
    out_of_range_id(c);
  }
  moe_ep_group_info_t info = MOE_EP_INIT(moe_ep_group_info_t);
  expect_status(c, 0, "group_info", c.api->group_info(c.group, &info), MOE_EP_OK);
  HtCall last(c, problem_of(c, DispatchDtype::kBf16), 79);
  if (last.prepare() == MOE_EP_OK) roundtrip(c, last, "still usable");
}

}  // namespace moe_ep_test
