// bench_ht.cc: see bench_ht.h.
#include "tools/bench/bench_ht.h"

#include <cstring>
#include <functional>

#include "absl/flags/flag.h"
#include "tools/bench/bench_measure.h"
#include "tools/bench/bench_references.h"
#include "tools/bench/bench_timer.h"
#include "tools/bench/bench_util.h"

// moe_ep.h 0.3 adds pre-quantised fp8 HT input (dispatch params x_scales)
// and MOE_EP_FLAG_WORST_CASE; the bench builds against 0.2 and 0.3 alike.
#if MOE_EP_VERSION_MAJOR > 0 || MOE_EP_VERSION_MINOR >= 3
#define MEP_BENCH_HT_FP8 1
#else
#define MEP_BENCH_HT_FP8 0
#endif
// 0.5 adds fp8 HT rows with one scale per token (MOE_EP_FORMAT_FP8_PER_TOKEN).
#if MOE_EP_VERSION_MAJOR > 0 || MOE_EP_VERSION_MINOR >= 5
#define MEP_BENCH_HT_PER_TOKEN 1
#else
#define MEP_BENCH_HT_PER_TOKEN 0
#endif
#ifdef MOE_EP_FLAG_WORST_CASE
#define MEP_BENCH_WORST_CASE MOE_EP_FLAG_WORST_CASE
#else
#define MEP_BENCH_WORST_CASE 0u
#endif

namespace mep_bench {

void CheckHtFlags(const Plan& p, const std::string& dtype) {
  if (!absl::GetFlag(FLAGS_dispatch_weights)) {
    Die("--dispatch_weights=false is ll mode only: an HT dispatch always takes topk_weights");
  }
  if (!MEP_BENCH_HT_PER_TOKEN && p.dtypes[0] == kRowsFp8PerToken) {
    Die("--mode=ht --dtype=fp8_per_token needs moe_ep.h 0.5; this bench was built against %d.%d",
        MOE_EP_VERSION_MAJOR, MOE_EP_VERSION_MINOR);
  }
  if (!MEP_BENCH_HT_FP8 && p.dtypes[0] != kRowsBf16) {
    Die("--mode=ht --dtype=%s: fp8 HT input (x pre-quantised, with x_scales) needs moe_ep.h 0.3; "
        "this bench was built against %d.%d: use --dtype=bf16",
        dtype.c_str(), MOE_EP_VERSION_MAJOR, MOE_EP_VERSION_MINOR);
  }
  if (MEP_BENCH_WORST_CASE == 0 && absl::GetFlag(FLAGS_graph)) {
    Die("--mode=ht --graph needs MOE_EP_FLAG_WORST_CASE (moe_ep.h 0.3), which this bench was "
        "built without: a plain HT dispatch synchronises its stream to learn N_recv, which a "
        "CUDA graph capture cannot hold");
  }
}

bool HtWorstCase(const Plan& p, int vmaj, int vmin, std::string* line) {
  // A 0.2 library would ignore the appended x_scales and not know the flag.
  const bool v03 = vmaj > 0 || vmin >= 3;
  if (!v03 && p.dtypes[0] != kRowsBf16) {
    Die("the plugin is moe_ep %d.%d: fp8 HT input (x pre-quantised, with x_scales) needs 0.3; "
        "use --dtype=bf16", vmaj, vmin);
  }
  if (vmaj == 0 && vmin < 5 && p.dtypes[0] == kRowsFp8PerToken) {
    Die("the plugin is moe_ep %d.%d: fp8 HT rows with one scale per token need 0.5; use "
        "--dtype=fp8", vmaj, vmin);
  }
  const bool worst = MEP_BENCH_WORST_CASE != 0 && v03;
  if (!worst && absl::GetFlag(FLAGS_graph)) {
    Die("--mode=ht --graph needs MOE_EP_FLAG_WORST_CASE, which the plugin (moe_ep %d.%d) lacks",
        vmaj, vmin);
  }
  *line = worst ? "HT dispatch with MOE_EP_FLAG_WORST_CASE: fixed-size outputs, no host sync "
                  "in the timed loop"
                : Fmt("HT dispatch without MOE_EP_FLAG_WORST_CASE (%s): each dispatch "
                      "synchronises its stream once to learn N_recv, and its time includes that",
                      MEP_BENCH_WORST_CASE != 0 ? "the plugin is older than 0.3"
                                                : "this build's moe_ep.h predates it");
  return worst;
}

namespace {

// fp8 x and its scales over the bf16 x UploadInputs wrote. moe-ep moves
// fp8 rows and scales verbatim (never interprets them), so any finite codes
// time as an engine's quantised activations would.
void UploadFp8(const Setup& s, const Buffers& b, int T, int H) {
  Rng r(Mix(s.seed, 3000017ull + s.rank, static_cast<uint64_t>(T) << 20 | H));
  std::vector<uint8_t> q(static_cast<size_t>(T) * H);
  for (size_t i = 0; i < q.size(); i += 8) {
    uint64_t v = r.Next();
    for (size_t j = 0; j < 8 && i + j < q.size(); j++, v >>= 8) {
      const uint8_t c = static_cast<uint8_t>(v);
      q[i + j] = (c & 0x7F) == 0x7F ? c ^ 1 : c;  // 0x7F / 0xFF are NaN in e4m3
    }
  }
  std::vector<float> sc(static_cast<size_t>(T) * (H / 128));
  for (float& v : sc) v = static_cast<float>((0.5 + r.Uniform()) / 448.0);
  CUDA_CHECK(cudaMemcpy(b.x, q.data(), q.size(), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(b.x_scales, sc.data(), sc.size() * 4, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaDeviceSynchronize());
}

// What the dispatch must deliver to this rank: per received row, packed by
// source rank then token, its K slots as local expert ids (-1 elsewhere);
// and per own token the ranks it reaches (its combine sums that many rows).
struct HtWant {
  std::vector<int32_t> idx;  // [rows, K]
  std::vector<int> src, tok; // [rows]
  std::vector<int> ranks;    // [T]
};

HtWant MakeWant(const Setup& s, const Traffic& tr, int T) {
  const int K = s.top_k, el = s.el;
  HtWant w;
  for (int q = 0; q < s.world; q++) {
    for (int t = 0; t < T; t++) {
      const int64_t* e = &tr.routes[q][static_cast<size_t>(t) * K];
      bool here = false;
      for (int k = 0; k < K; k++) here |= e[k] / el == s.rank;
      if (!here) continue;
      for (int k = 0; k < K; k++) {
        w.idx.push_back(e[k] / el == s.rank ? static_cast<int32_t>(e[k] % el) : -1);
      }
      w.src.push_back(q);
      w.tok.push_back(t);
    }
  }
  w.ranks.assign(T, 0);
  std::vector<int> last(s.world, -1);  // the last token that reached each rank
  for (int t = 0; t < T; t++) {
    const int64_t* e = &tr.routes[s.rank][static_cast<size_t>(t) * K];
    for (int k = 0; k < K; k++) {
      const int r = static_cast<int>(e[k] / el);
      if (last[r] != t) w.ranks[t]++;
      last[r] = t;
    }
  }
  return w;
}

// After the warm-up: the last dispatch's counts and rows, and the last
// combine's output (y is 0.74609375 everywhere, so token t's output is that
// summed over its ranks in f32, rounded to bf16 once).
void CheckHt(const Setup& s, const Buffers& b, moe_ep_group_t* group, const Traffic& tr,
             const HtWant& want, const char* dtype, int H, int T, int64_t n_recv) {
  CheckRecvCount(s, b, group, tr, dtype, H, T);
  const int K = s.top_k;
  const int64_t rows = static_cast<int64_t>(want.src.size());
  if (!s.worst_case && n_recv != rows) {
    Die("ht %s H=%d T=%d: dispatch reported num_recv_tokens %lld, the routing sends this rank "
        "%lld rows: the benchmark would time a wrong result",
        dtype, H, T, static_cast<long long>(n_recv), static_cast<long long>(rows));
  }
  // With the worst-case flag every row past N_recv must read -1: that
  // checks N_recv, which the host is not told.
  const int64_t check_rows = s.worst_case ? s.slots : rows;
  std::vector<int32_t> idx(static_cast<size_t>(check_rows) * K);
  CUDA_CHECK(cudaMemcpy(idx.data(), b.recv_topk_idx, idx.size() * 4, cudaMemcpyDeviceToHost));
  for (int64_t i = 0; i < check_rows; i++) {
    for (int k = 0; k < K; k++) {
      const int32_t got = idx[i * K + k];
      const int32_t exp = i < rows ? want.idx[i * K + k] : -1;
      if (got == exp) continue;
      const std::string from = i < rows ? Fmt("from rank %d, token %d", want.src[i], want.tok[i])
                                        : Fmt("past the %lld rows the routing sends",
                                              static_cast<long long>(rows));
      Die("ht %s H=%d T=%d: recv_topk_idx[%lld][%d] = %d (row %s), the routing gives %d: the "
          "benchmark would time a wrong result",
          dtype, H, T, static_cast<long long>(i), k, got, from.c_str(), exp);
    }
  }
  std::vector<uint16_t> out(static_cast<size_t>(T) * H);
  CUDA_CHECK(cudaMemcpy(out.data(), b.out, out.size() * 2, cudaMemcpyDeviceToHost));
  const uint32_t y_bits = 0x3F3Fu << 16;
  float y0;
  memcpy(&y0, &y_bits, 4);
  for (int t = 0; t < T; t++) {
    float acc = 0.0f;
    for (int r = 0; r < want.ranks[t]; r++) acc += y0;
    const uint16_t exp = ToBf16(acc);
    for (int h = 0; h < H; h++) {
      const uint16_t got = out[static_cast<size_t>(t) * H + h];
      if (got != exp) {
        Die("ht %s H=%d T=%d: combine out[%d][%d] = bf16 0x%04x, expected 0x%04x (the sum of %d "
            "rows of 0x3F3F): the benchmark would time a wrong result",
            dtype, H, T, t, h, got, exp, want.ranks[t]);
      }
    }
  }
  EP_CHECK(g_ep->group_poll_error(group));
}

// Fills st's kPrep, kDisp (prepare + dispatch), kComb and kHostUsFull.
void MeasureHt(const Setup& s, const Buffers& b, moe_ep_group_t* group, const Traffic& tr,
               int fp8, int H, int T, std::vector<double>* st) {
  const int dev = s.dev, K = s.top_k;
  const int64_t cap = s.slots;
  const char* dtype = RowsName(fp8);
  // Scale columns of an fp8 row: one per 128 channels, or one per token.
  const int64_t cols = fp8 == kRowsFp8PerToken ? 1 : H / 128;
  const HtWant want = MakeWant(s, tr, T);
  Desc t_topk, t_x, t_xs, t_w, t_out, t_rx, t_rs, t_rc, t_ri, t_rw, t_y;
  t_topk.Set(b.topk, MOE_EP_DTYPE_INT, 64, dev, {T, K});
  t_x.Set(b.x, fp8 ? MOE_EP_DTYPE_FLOAT8_E4M3FN : MOE_EP_DTYPE_BFLOAT, fp8 ? 8 : 16, dev, {T, H});
  t_xs.Set(b.x_scales, MOE_EP_DTYPE_FLOAT, 32, dev, {T, cols});
  t_w.Set(b.w, MOE_EP_DTYPE_FLOAT, 32, dev, {T, K});
  t_out.Set(b.out, MOE_EP_DTYPE_BFLOAT, 16, dev, {T, H});
  t_rx.Set(b.recv_x, fp8 ? MOE_EP_DTYPE_FLOAT8_E4M3FN : MOE_EP_DTYPE_BFLOAT, fp8 ? 8 : 16, dev,
           {cap, H});
  t_rs.Set(b.recv_scales, MOE_EP_DTYPE_FLOAT, 32, dev, {cap, cols});
  t_rc.Set(b.recv_count, MOE_EP_DTYPE_INT, 32, dev, {s.el});
  t_ri.Set(b.recv_topk_idx, MOE_EP_DTYPE_INT, 32, dev, {cap, K});
  t_rw.Set(b.recv_topk_w, MOE_EP_DTYPE_FLOAT, 32, dev, {cap, K});
  t_y.Set(b.y, MOE_EP_DTYPE_BFLOAT, 16, dev, {cap, H});

  moe_ep_prepare_params_t pp = MOE_EP_INIT(moe_ep_prepare_params_t);
  pp.topk_idx = &t_topk.t;
  pp.num_tokens = T;
  pp.top_k = K;
  pp.stream = s.stream;
  int64_t n_recv = -1;
  moe_ep_dispatch_params_t dp = MOE_EP_INIT(moe_ep_dispatch_params_t);
  dp.flags = s.worst_case ? MEP_BENCH_WORST_CASE : 0u;
  dp.hidden = H;
  dp.x = &t_x.t;
  dp.stream = s.stream;
  dp.recv_x = &t_rx.t;
  dp.recv_scales = fp8 ? &t_rs.t : nullptr;
  dp.recv_count = &t_rc.t;
  dp.topk_weights = &t_w.t;
  dp.recv_topk_idx = &t_ri.t;
  dp.recv_topk_weights = &t_rw.t;
  // With the worst-case flag the host is not told N_recv (no sync to learn it).
  dp.num_recv_tokens = s.worst_case ? nullptr : &n_recv;
#if MEP_BENCH_HT_PER_TOKEN
  dp.format = fp8 == kRowsFp8PerToken ? MOE_EP_FORMAT_FP8_PER_TOKEN
              : fp8                   ? MOE_EP_FORMAT_FP8_F32
                                      : MOE_EP_FORMAT_BF16;
#else
  dp.format = fp8 ? MOE_EP_FORMAT_FP8_F32 : MOE_EP_FORMAT_BF16;
#endif
#if MEP_BENCH_HT_FP8
  dp.x_scales = fp8 ? &t_xs.t : nullptr;
#endif
  moe_ep_combine_params_t cp = MOE_EP_INIT(moe_ep_combine_params_t);
  cp.hidden = H;
  cp.y = &t_y.t;
  cp.out = &t_out.t;  // no weights: HT dispatch took them
  cp.stream = s.stream;

  auto body = [&](int, const std::function<void(int)>& rec) {
    moe_ep_handle_t* h = nullptr;
    rec(0);
    EP_CHECK(g_ep->prepare(group, &pp, &h));
    rec(1);
    EP_CHECK(g_ep->dispatch(group, h, &dp, nullptr));
    // y has recv_x's rows with the worst-case flag, else exactly N_recv.
    if (!s.worst_case) t_y.shape[0] = n_recv;
    rec(2);
    EP_CHECK(g_ep->combine(group, h, &cp, nullptr));
    rec(3);
    g_ep->handle_free(h);
  };
  // NaN in out until a combine writes it: the check cannot pass on stale sums.
  CUDA_CHECK(cudaMemsetAsync(b.out, 0xFF, static_cast<size_t>(T) * H * 2, s.stream));
  double host_s = 0;
  auto seg = s.timer->Run(
      4, body, [&] { CheckHt(s, b, group, tr, want, dtype, H, T, n_recv); }, &host_s);
  (*st)[kHostUsFull] = host_s / s.iters * 1e6;
  std::vector<float> whole(seg[0].size());
  for (size_t i = 0; i < whole.size(); i++) whole[i] = seg[0][i] + seg[1][i];
  SetTime(st, kPrep, Percentiles(seg[0]));
  SetTime(st, kDisp, Percentiles(whole));
  SetTime(st, kComb, Percentiles(seg[2]));
  EP_CHECK(g_ep->group_poll_error(group));
}

}  // namespace

void MeasureHtCase(const Setup& s, const Buffers& b, moe_ep_group_t* group, const Traffic& tr,
                   int fp8, int H, int T, std::vector<double>* st) {
  AddHtByteStats(tr, s.rank, s.top_k, st);
  UploadInputs(s, b, tr, T, H);
  if (fp8) UploadFp8(s, b, T, H);
  MeasureHt(s, b, group, tr, fp8, H, T, st);
  // The same rows per peer as moe-ep: each token once per rank it reaches.
  SetTime(st, kA2aD, TimeAllToAll(s, b, tr.toks, tr.row_disp, false));
  SetTime(st, kA2aC, TimeAllToAll(s, b, tr.toks, tr.row_comb, true));
  MeasurePeerCopy(s, b, st);
}

}  // namespace mep_bench
