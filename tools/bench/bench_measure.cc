// bench_measure.cc: see bench_measure.h.
#include "tools/bench/bench_measure.h"

#include <functional>

#include "absl/flags/flag.h"
#include "tools/bench/bench_flags.h"
#include "tools/bench/bench_references.h"
#include "tools/bench/bench_util.h"

namespace mep_bench {

void UploadInputs(const Setup& s, const Buffers& b, const Traffic& tr, int T, int H) {
  const int top_k = s.top_k;
  Rng r(Mix(s.seed, 2000003ull + s.rank, static_cast<uint64_t>(T) << 20 | H));
  std::vector<uint16_t> x(static_cast<size_t>(T) * H);
  for (uint16_t& v : x) v = ToBf16(static_cast<float>(r.Uniform() * 4.0 - 2.0));
  std::vector<float> w(static_cast<size_t>(T) * top_k);
  for (int t = 0; t < T; t++) {
    double sum = 0;
    for (int k = 0; k < top_k; k++) sum += (w[t * top_k + k] = static_cast<float>(0.05 + r.Uniform()));
    for (int k = 0; k < top_k; k++) w[t * top_k + k] = static_cast<float>(w[t * top_k + k] / sum);
  }
  const std::vector<int64_t>& topk = tr.routes[s.rank];
  CUDA_CHECK(cudaMemcpy(b.x, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(b.w, w.data(), w.size() * 4, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(b.topk, topk.data(), topk.size() * 8, cudaMemcpyHostToDevice));
  // Pageable copies may still be in flight; the bench stream does not wait for them.
  CUDA_CHECK(cudaDeviceSynchronize());
}

void CheckRecvCount(const Setup& s, const Buffers& b, moe_ep_group_t* group, const Traffic& tr,
                    const char* dtype, int H, int T) {
  std::vector<int32_t> got(s.el);
  CUDA_CHECK(cudaMemcpy(got.data(), b.recv_count, s.el * 4, cudaMemcpyDeviceToHost));
  for (int e = 0; e < s.el; e++) {
    if (got[e] != tr.want_count[e]) {
      Die("%s H=%d T=%d: recv_count[%d]=%d after dispatch, the routing sends %d rows: the "
          "benchmark would time a wrong result",
          dtype, H, T, e, got[e], tr.want_count[e]);
    }
  }
  EP_CHECK(g_ep->group_poll_error(group));
}

void MeasureMoeEp(const Setup& s, const Buffers& b, moe_ep_group_t* group, const Traffic& tr,
                  int fp8, int H, int T, std::vector<double>* stats) {
  std::vector<double>& st = *stats;
  const int dev = s.dev, el = s.el, top_k = s.top_k, iters = s.iters;
  const int64_t slots = s.slots;
  cudaStream_t stream = s.stream;
  Timer& timer = *s.timer;
  Desc t_topk, t_x, t_w, t_out, t_rx, t_rs, t_rc, t_y;
  t_topk.Set(b.topk, MOE_EP_DTYPE_INT, 64, dev, {T, top_k});
  t_x.Set(b.x, MOE_EP_DTYPE_BFLOAT, 16, dev, {T, H});
  t_w.Set(b.w, MOE_EP_DTYPE_FLOAT, 32, dev, {T, top_k});
  t_out.Set(b.out, MOE_EP_DTYPE_BFLOAT, 16, dev, {T, H});
  t_rx.Set(b.recv_x, fp8 ? MOE_EP_DTYPE_FLOAT8_E4M3FN : MOE_EP_DTYPE_BFLOAT, fp8 ? 8 : 16, dev,
           {el, slots, H});
  t_rs.Set(b.recv_scales, MOE_EP_DTYPE_FLOAT, 32, dev, {el, slots, H / 128});
  t_rc.Set(b.recv_count, MOE_EP_DTYPE_INT, 32, dev, {el});
  t_y.Set(b.y, MOE_EP_DTYPE_BFLOAT, 16, dev, {el, slots, H});

  moe_ep_prepare_params_t pp = MOE_EP_INIT(moe_ep_prepare_params_t);
  pp.topk_idx = &t_topk.t;
  pp.num_tokens = T;
  pp.top_k = top_k;
  pp.stream = stream;
  moe_ep_dispatch_params_t dp = MOE_EP_INIT(moe_ep_dispatch_params_t);
  dp.hidden = H;
  dp.x = &t_x.t;
  dp.stream = stream;
  dp.recv_x = &t_rx.t;
  dp.recv_scales = fp8 ? &t_rs.t : nullptr;
  dp.recv_count = &t_rc.t;
  if (absl::GetFlag(FLAGS_dispatch_weights)) dp.topk_weights = &t_w.t;
  moe_ep_combine_params_t cp = MOE_EP_INIT(moe_ep_combine_params_t);
  cp.hidden = H;
  cp.y = &t_y.t;
  cp.topk_weights = &t_w.t;
  cp.out = &t_out.t;
  cp.stream = stream;

  // (a, b) whole dispatch (prepare + dispatch) and whole combine.
  auto full = [&](int, const std::function<void(int)>& rec) {
    moe_ep_handle_t* h = nullptr;
    moe_ep_hook_t* hook = nullptr;
    rec(0);
    EP_CHECK(g_ep->prepare(group, &pp, &h));
    dp.flags = 0;
    EP_CHECK(g_ep->dispatch(group, h, &dp, &hook));
    rec(1);
    cp.flags = 0;
    EP_CHECK(g_ep->combine(group, h, &cp, &hook));
    rec(2);
    g_ep->handle_free(h);
  };
  auto check_counts = [&] { CheckRecvCount(s, b, group, tr, fp8 ? "fp8" : "bf16", H, T); };
  double host_s = 0;
  auto seg = timer.Run(3, full, check_counts, &host_s);
  st[kHostUsFull] = host_s / iters * 1e6;
  SetTime(stats, kDisp, Percentiles(seg[0]));
  SetTime(stats, kComb, Percentiles(seg[1]));

  // (c) send and receive halves through hooks.
  auto halves = [&](int, const std::function<void(int)>& rec) {
    moe_ep_handle_t* h = nullptr;
    moe_ep_hook_t* hook = nullptr;
    rec(0);
    EP_CHECK(g_ep->prepare(group, &pp, &h));
    dp.flags = MOE_EP_FLAG_DEFER_RECV;
    EP_CHECK(g_ep->dispatch(group, h, &dp, &hook));
    if (hook == nullptr) Die("dispatch with MOE_EP_FLAG_DEFER_RECV returned no hook");
    rec(1);
    EP_CHECK(g_ep->hook_run(hook, stream));
    g_ep->hook_free(hook);
    rec(2);
    hook = nullptr;
    cp.flags = MOE_EP_FLAG_DEFER_RECV;
    EP_CHECK(g_ep->combine(group, h, &cp, &hook));
    if (hook == nullptr) Die("combine with MOE_EP_FLAG_DEFER_RECV returned no hook");
    rec(3);
    EP_CHECK(g_ep->hook_run(hook, stream));
    g_ep->hook_free(hook);
    rec(4);
    g_ep->handle_free(h);
  };
  seg = timer.Run(5, halves, check_counts, &host_s);
  st[kHostUsHalves] = host_s / iters * 1e6;
  for (int j = 0; j < 4; j++) SetTime(stats, kDSend + j, Percentiles(seg[j]));
  EP_CHECK(g_ep->group_poll_error(group));
}

void MeasureLlCase(const Setup& s, const Buffers& b, moe_ep_group_t* group, const Traffic& tr,
                   int fp8, int H, int T, std::vector<double>* st) {
  AddByteStats(tr, s.rank, st);
  UploadInputs(s, b, tr, T, H);
  MeasureMoeEp(s, b, group, tr, fp8, H, T, st);
  MeasureNcclAllToAll(s, b, tr, st);
  MeasurePeerCopy(s, b, st);
}

}  // namespace mep_bench
