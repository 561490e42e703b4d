// worker_streams.cc: hooks on a second stream (nccl backend), in two-batch
// overlap's order: combine A's send deferred, dispatch B, then A's receive
// hook on another stream held back by a host function, then combine B on
// the same buffer set as A, issued while the hold lasts. Combine B's send
// must wait for A's receive (the runtime's order of a send after its
// set's last receive, which the
// two halves of the combine regions rest on: kernels/ll/PROTOCOL.md,
// section 6); otherwise B's send moves the set's combine epoch before A's
// receive reads it. Both combines are checked against the oracle. Then
// handle_layout on another stream than a held dispatch receive, and each
// half's hook on another host thread's per-thread default stream, with an
// error of the engine's own left pending on the calling thread. At one
// rank, a stream in an invalidated capture is refused as bad input; at
// any, a stream of another CUDA context on the group's GPU (prepare,
// dispatch, hook_run; the refused hook then runs).
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <string>
#include <thread>

#include "tests/common/mirror.h"
#include "tests/host/foreign_stream.h"
#include "tests/host/ll_call.h"
#include "tests/host/worker_common.h"

namespace moe_ep_test {

namespace {

// Holds the hook stream until released (at most 60 s, then `expired`):
// A's receive stays queued behind it until combine B has been issued,
// however slowly this thread gets there.
struct Hold {
  std::atomic<int> release{0};
  std::atomic<int> expired{0};
};

void CUDART_CB hold_back(void* p) {
  Hold* h = static_cast<Hold*>(p);
  for (int ms = 0; ms < 60000 && h->release.load() == 0; ms++) usleep(1000);
  if (h->release.load() == 0) h->expired = 1;
}

// One round: combine A deferred, dispatch B, A's receive on the hook
// stream, combine B on the op stream. held: the hook stream is held until
// combine B has been issued. False when a step failed (its FAIL line
// printed).
bool streams_round(Ctx& c, const moe_ep_oracle::Problem& p, cudaStream_t ops,
                   cudaStream_t hooks, uint64_t seed, bool held) {
  LlCall a(c, p, seed), b(c, p, seed + 1);
  a.set_stream(ops);
  b.set_stream(ops);
  if (a.prepare() != MOE_EP_OK || b.prepare() != MOE_EP_OK) return false;
  if (!expect_status(c, seed, "dispatch A", a.dispatch(0, nullptr), MOE_EP_OK)) return false;
  a.check_dispatch();
  a.make_y();
  moe_ep_hook_t* ha = nullptr;
  if (!expect_status(c, seed, "combine A, receive deferred",
                     a.combine(MOE_EP_FLAG_DEFER_RECV, &ha), MOE_EP_OK))
    return false;
  if (!expect_status(c, seed, "dispatch B, A's receive pending", b.dispatch(0, nullptr),
                     MOE_EP_OK)) {
    c.api->hook_free(ha);
    return false;
  }
  // (these wait for the whole device: before A's receive is issued)
  b.check_dispatch();
  b.make_y();
  // A's receive on the hook stream, behind a host function that holds
  // that stream until combine B, on the op stream, has been issued:
  // without the runtime's order B would run first.
  Hold hold;
  if (!held) hold.release = 1;
  cuda_check(cudaLaunchHostFunc(hooks, hold_back, &hold), "cudaLaunchHostFunc");
  const moe_ep_status_t sa = c.api->hook_run(ha, hooks);
  c.api->hook_free(ha);
  const moe_ep_status_t sb = sa == MOE_EP_OK ? b.combine(0, nullptr) : MOE_EP_ERR_INTERNAL;
  hold.release = 1;
  cuda_check(cudaStreamSynchronize(hooks), "cudaStreamSynchronize(hooks)");
  if (!expect_status(c, seed, "combine A's hook on another stream", sa, MOE_EP_OK)) return false;
  if (!expect_status(c, seed, "combine B on A's buffer set", sb, MOE_EP_OK)) return false;
  c.checks++;
  if (hold.expired.load()) {
    fail(c, seed, "hook stream hold", "combine B was not issued within 60 s of the hold");
    return false;
  }
  a.check_combine();
  b.check_combine();
  return true;
}

// Runs `hook` on a second host thread, on that thread's per-thread default
// stream, while this thread's per-thread stream, where the hook's send half
// was queued, is held: cudaStreamPerThread is one handle value naming
// another stream on every thread, so the receive must wait for the send by
// an event, not by stream order. Released once the hook has been issued.
moe_ep_status_t run_on_other_thread_held(Ctx& c, moe_ep_hook_t* hook, Hold* hold) {
  moe_ep_status_t st = MOE_EP_ERR_INTERNAL;
  std::atomic<int> issued{0};
  // The thread outlives its receive: it waits for its own stream.
  std::thread t([&] {
    st = c.api->hook_run(hook, cudaStreamPerThread);
    issued = 1;
    cuda_check(cudaStreamSynchronize(cudaStreamPerThread), "cudaStreamSynchronize(per-thread)");
  });
  for (int ms = 0; ms < 60000 && issued.load() == 0; ms++) usleep(1000);
  hold->release = 1;
  t.join();
  cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  c.api->hook_free(hook);
  return st;
}

// handle_layout on the op stream while the deferred dispatch's receive
// waits on the hook stream behind a hold: the layout is read only after
// that receive wrote it, whatever stream each ran on.
bool layout_round(Ctx& c, const moe_ep_oracle::Problem& p, cudaStream_t ops, cudaStream_t hooks,
                  uint64_t seed) {
  LlCall a(c, p, seed);
  a.set_stream(ops);
  if (a.prepare() != MOE_EP_OK) return false;
  moe_ep_hook_t* hd = nullptr;
  if (!expect_status(c, seed, "dispatch, receive deferred", a.dispatch(MOE_EP_FLAG_DEFER_RECV, &hd),
                     MOE_EP_OK))
    return false;
  Hold hold;
  moe_ep_status_t sd = MOE_EP_ERR_INTERNAL;
  const int before = c.failures;
  check_layout(
      c, a, p, "handle_layout on another stream than the held receive", true, true, ops,
      [&] {
        cuda_check(cudaLaunchHostFunc(hooks, hold_back, &hold), "cudaLaunchHostFunc");
        sd = c.api->hook_run(hd, hooks);
      },
      [&] {
        hold.release = 1;
        cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
      });
  c.api->hook_free(hd);
  if (!expect_status(c, seed, "dispatch hook on the held stream", sd, MOE_EP_OK)) return false;
  if (hold.expired.load()) {
    fail(c, seed, "hook stream hold", "handle_layout was not issued within 60 s of the hold");
    return false;
  }
  a.check_dispatch();
  a.make_y();
  if (!expect_status(c, seed, "combine after handle_layout", a.combine(0, nullptr), MOE_EP_OK))
    return false;
  a.check_combine();
  return c.failures == before;
}

// One deferred half sent on this thread's per-thread stream behind `hold`,
// its hook run on another thread's (run_on_other_thread_held).
bool held_half(Ctx& c, uint64_t seed, const std::string& what,
               const std::function<moe_ep_status_t(moe_ep_hook_t**)>& send, Hold* hold) {
  cuda_check(cudaLaunchHostFunc(cudaStreamPerThread, hold_back, hold), "cudaLaunchHostFunc");
  moe_ep_hook_t* hook = nullptr;
  if (!expect_status(c, seed, what + ", receive deferred, per-thread stream held", send(&hook),
                     MOE_EP_OK)) {
    hold->release = 1;
    return false;
  }
  return expect_status(c, seed, what + " hook on another thread's per-thread stream",
                       run_on_other_thread_held(c, hook, hold), MOE_EP_OK);
}

// Per-thread default streams: dispatch and combine deferred on this
// thread's cudaStreamPerThread behind a hold, each receive hook run on
// another thread's. Without the event order the combine's receive starts
// before its send stored the combine's epoch.
bool perthread_round(Ctx& c, const moe_ep_oracle::Problem& p, uint64_t seed) {
  LlCall a(c, p, seed);
  a.set_stream(cudaStreamPerThread);
  // An error the engine's own code left pending on this thread must not
  // fail the library's launches: their status is the launch's own.
  if (cudaSetDevice(1 << 20) == cudaSuccess) fail(c, seed, "stale error", "device 2^20 exists");
  if (a.prepare() != MOE_EP_OK) return false;
  Hold hold_d, hold_c;
  if (!held_half(
          c, seed, "dispatch",
          [&](moe_ep_hook_t** h) { return a.dispatch(MOE_EP_FLAG_DEFER_RECV, h); }, &hold_d))
    return false;
  a.check_dispatch();
  a.make_y();
  if (!held_half(
          c, seed, "combine",
          [&](moe_ep_hook_t** h) { return a.combine(MOE_EP_FLAG_DEFER_RECV, h); }, &hold_c))
    return false;
  c.checks++;
  if (hold_d.expired.load() || hold_c.expired.load()) {
    fail(c, seed, "per-thread stream hold", "a hook was not issued within 60 s of its hold");
    return false;
  }
  a.check_combine();
  return true;
}

// A dispatch on a stream whose graph capture an earlier call invalidated:
// refused as bad input naming params->stream before anything is queued
// (not a CUDA failure of the group). At one rank no peer waits for the
// refused call, so the group goes on: the same call on a live stream.
bool invalidated_capture_round(Ctx& c, const moe_ep_oracle::Problem& p, cudaStream_t ops,
                               uint64_t seed) {
  LlCall call(c, p, seed);
  if (call.prepare() != MOE_EP_OK) return false;
  cuda_check(cudaStreamBeginCapture(ops, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
  // Synchronising a capturing stream is refused and invalidates the capture.
  c.checks++;
  if (cudaStreamSynchronize(ops) == cudaSuccess)
    fail(c, seed, "invalidated capture", "cudaStreamSynchronize in a capture succeeded");
  call.set_stream(ops);
  expect_status(c, seed, "dispatch on a stream in an invalidated capture", call.dispatch(0, nullptr),
                MOE_EP_ERR_INVALID_ARGUMENT, "params->stream");
  cudaGraph_t graph = nullptr;
  (void)cudaStreamEndCapture(ops, &graph);
  if (graph != nullptr) cudaGraphDestroy(graph);
  (void)cudaGetLastError();
  if (!expect_status(c, seed, "dispatch on the same stream after the capture ended",
                     call.dispatch(0, nullptr), MOE_EP_OK))
    return false;
  call.check_dispatch();
  call.make_y();
  if (!expect_status(c, seed, "combine", call.combine(0, nullptr), MOE_EP_OK)) return false;
  call.check_combine();
  return c.failures == 0;
}

// A stream of a context of its own on the group's GPU, where the group's
// memory is not mapped: prepare (its layout kernel), dispatch and a hook's
// receive on it are refused as bad input naming the stream, before
// anything is queued, on every rank alike. The refused hook stays pending
// and runs on the right stream; every result is checked against the
// oracle and the group goes on.
bool foreign_stream_round(Ctx& c, const moe_ep_oracle::Problem& p, cudaStream_t ops,
                          uint64_t seed) {
  ForeignStream foreign(c.gpu);
  c.checks++;
  if (foreign.stream() == nullptr) {
    fail(c, seed, "a stream of another context", foreign.error());
    return false;
  }
  const char* other_ctx = "belongs to a CUDA context other than device";
  LlCall call(c, p, seed);
  call.set_stream(foreign.stream());
  expect_status(c, seed, "prepare on another context's stream", call.prepare_status(),
                MOE_EP_ERR_INVALID_ARGUMENT, other_ctx);
  call.set_stream(ops);
  if (call.prepare() != MOE_EP_OK) return false;
  call.set_stream(foreign.stream());
  expect_status(c, seed, "dispatch on another context's stream", call.dispatch(0, nullptr),
                MOE_EP_ERR_INVALID_ARGUMENT, other_ctx);
  call.set_stream(ops);
  if (!expect_status(c, seed, "dispatch after the refusals", call.dispatch(0, nullptr), MOE_EP_OK))
    return false;
  call.check_dispatch();
  call.make_y();
  moe_ep_hook_t* hook = nullptr;
  if (!expect_status(c, seed, "combine, receive deferred", call.combine(MOE_EP_FLAG_DEFER_RECV, &hook),
                     MOE_EP_OK))
    return false;
  expect_status(c, seed, "hook_run on another context's stream",
                c.api->hook_run(hook, foreign.stream()), MOE_EP_ERR_INVALID_ARGUMENT,
                "stream=");
  expect_status(c, seed, "poll_error after the refused hook_run", c.api->group_poll_error(c.group),
                MOE_EP_OK);
  const moe_ep_status_t ran = c.api->hook_run(hook, ops);
  c.api->hook_free(hook);
  if (!expect_status(c, seed, "the refused hook run on the right stream", ran, MOE_EP_OK))
    return false;
  call.check_combine();
  return c.failures == 0;
}

}  // namespace

void run_streams(Ctx& c) {
  if (!runs_on_nccl(c, "streams")) return;
  using moe_ep_oracle::Generator;
  auto p = problem_for(c, c.opt.layers[0].first, c.opt.layers[0].second, Generator::kUniform);
  cudaStream_t ops, hooks;
  cuda_check(cudaStreamCreateWithFlags(&ops, cudaStreamNonBlocking), "cudaStreamCreate");
  cuda_check(cudaStreamCreateWithFlags(&hooks, cudaStreamNonBlocking), "cudaStreamCreate");
  // First every round unheld: CUDA loads a kernel at its first launch, and
  // that load waits for the whole device, so a first launch behind the
  // hold would wait for the hold's release, which comes after it. The
  // same seeds then pick the same, loaded kernels when held.
  for (bool held : {false, true}) {
    for (int s = 0; s < c.opt.seeds && c.failures == 0; s++) {
      if (!streams_round(c, p, ops, hooks, 700 + 2 * (uint64_t)s, held)) break;
    }
  }
  for (int s = 0; s < c.opt.seeds && c.failures == 0; s++) {
    if (!layout_round(c, p, ops, hooks, 900 + (uint64_t)s)) break;
  }
  for (int s = 0; s < c.opt.seeds && c.failures == 0; s++) {
    if (!perthread_round(c, p, 800 + (uint64_t)s)) break;
  }
  if (c.world == 1 && c.failures == 0) invalidated_capture_round(c, p, ops, 990);
  if (c.failures == 0) foreign_stream_round(c, p, ops, 995);
  expect_status(c, 0, "poll_error after the rounds", c.api->group_poll_error(c.group), MOE_EP_OK);
  cudaStreamDestroy(ops);
  cudaStreamDestroy(hooks);
}

}  // namespace moe_ep_test
