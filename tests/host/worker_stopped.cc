// worker_stopped.cc: a combine that fails while its sends are still in
// flight must not leave UCX reading the caller's y, which the engine frees
// once the call has returned an error. Two ranks, host backend: every token
// of rank 1 goes to rank 0's experts, so rank 0's combine sends rank 1 all
// the rows; rank 1 stops itself (SIGSTOP) after the dispatch, rank 0's
// combine times out, rank 0 unmaps y and resumes rank 1, and then keeps
// running for a while. Before the combine quiesced its sends, rank 0's
// progress thread went on sending from the unmapped y once rank 1 woke (a
// UCX assertion or a crash).
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tests/common/plugin_api.h"
#include "tests/host/worker_common.h"

namespace moe_ep_test {

namespace {

// 'T' once the process is stopped (the third field of /proc/PID/stat).
bool stopped(int pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(f, line);
  size_t close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'T';
}

int read_pid(const std::string& path) {
  int pid = 0;
  std::ifstream(path) >> pid;
  return pid;
}

}  // namespace

void run_stopped_peer(Ctx& c) {
  const int H = c.opt.layers[0].first, K = c.opt.layers[0].second;
  const int E = c.opt.num_experts, EL = E / c.world, M = c.opt.max_tokens;
  if (c.world != 2 || K > EL || c.opt.barrier_dir.empty()) {
    fail(c, 0, "stoppedpeer", "needs 2 ranks, top_k <= local experts and --barrier_dir");
    return;
  }
  std::ofstream(c.opt.barrier_dir + "/pid." + std::to_string(c.rank)) << getpid() << "\n";
  if (!outside_barrier(c, "pids")) return;
  // Rank 1's M tokens each go to rank 0's first K experts; rank 0 sends none.
  const int T = c.rank == 1 ? M : 0;
  std::vector<int64_t> topk(static_cast<size_t>(M) * K);
  for (int t = 0; t < T; t++)
    for (int k = 0; k < K; k++) topk[static_cast<size_t>(t) * K + k] = k;
  std::vector<uint16_t> x(static_cast<size_t>(M) * H, 0x3f80);
  const size_t rows = static_cast<size_t>(EL) * c.world * M;
  std::vector<uint16_t> recv_x(rows * H);
  std::vector<int32_t> count(EL);
  Tensor t_topk(topk.data(), DT::kI64, {T, K}), t_x(x.data(), DT::kBf16, {T, H}),
      t_rx(recv_x.data(), DT::kBf16, {EL, c.world * M, H}), t_cnt(count.data(), DT::kI32, {EL});
  moe_ep_prepare_params_t pp = MOE_EP_INIT(moe_ep_prepare_params_t);
  pp.topk_idx = t_topk.get();
  pp.num_tokens = T;
  pp.top_k = K;
  moe_ep_handle_t* h = nullptr;
  if (!expect_status(c, 0, "prepare", c.api->prepare(c.group, &pp, &h), MOE_EP_OK)) return;
  moe_ep_dispatch_params_t dp = MOE_EP_INIT(moe_ep_dispatch_params_t);
  dp.hidden = H;
  dp.x = t_x.get();
  dp.recv_x = t_rx.get();
  dp.recv_count = t_cnt.get();
  const bool dispatched =
      expect_status(c, 0, "dispatch", c.api->dispatch(c.group, h, &dp, nullptr), MOE_EP_OK);
  if (!outside_barrier(c, "dispatched") || !dispatched) return;
  if (c.rank == 1) {
    raise(SIGSTOP);
    outside_barrier(c, "resumed");  // rank 0 has run on after unmapping y
    c.api->handle_free(h);
    return;
  }
  const int peer = read_pid(c.opt.barrier_dir + "/pid.1");
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!stopped(peer) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  c.checks++;
  if (!stopped(peer)) {
    fail(c, 0, "stoppedpeer", "rank 1 (pid " + std::to_string(peer) + ") did not stop");
    kill(peer, SIGCONT);
    return;
  }
  const size_t y_bytes = rows * H * 2;
  void* y = mmap(nullptr, y_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (y == MAP_FAILED) {
    fail(c, 0, "stoppedpeer", "mmap of y failed");
    kill(peer, SIGCONT);
    return;
  }
  std::memset(y, 0x3f, y_bytes);
  float w[1] = {0.f};
  uint16_t out[8] = {0};
  Tensor t_y(y, DT::kBf16, {EL, c.world * M, H}), t_w(w, DT::kF32, {0, K}),
      t_out(out, DT::kBf16, {0, H});
  moe_ep_combine_params_t cp = MOE_EP_INIT(moe_ep_combine_params_t);
  cp.hidden = H;
  cp.y = t_y.get();
  cp.topk_weights = t_w.get();
  cp.out = t_out.get();
  expect_status(c, 0, "combine to a stopped rank", c.api->combine(c.group, h, &cp, nullptr),
                MOE_EP_ERR_TIMEOUT, "rank 1");
  munmap(y, y_bytes);  // the call failed: the engine releases y
  kill(peer, SIGCONT);
  // Time for rank 1 to take data again and for any send still reading y to
  // run: none may, since y is unmapped and the process would die here.
  std::this_thread::sleep_for(std::chrono::seconds(2));
  outside_barrier(c, "resumed");
  c.api->handle_free(h);
}

}  // namespace moe_ep_test
