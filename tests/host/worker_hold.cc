// worker_hold.cc: group_create and group_destroy while the engine's GPU
// work has not ended. A host function holds the legacy default stream
// (--hold_stream=legacy) until the call has returned (or until --hold_ms
// passes): every blocking stream's later work queues behind it, and so do
// cudaMemcpy, launches on stream 0 and cudaDeviceSynchronize. With
// --hold_stream=nonblocking it holds a nonblocking stream of its own
// instead, as an engine's side stream would: only what waits for the whole
// device (cudaFree, cudaFreeHost, a module's first load) waits for that one.
// group_create's own device work (zeroing the window and the state, the
// link check's copies, reading the window's LSA addresses) runs on its
// nonblocking setup stream, and group_destroy waits only for the group's
// own kernels and frees in stream order. On a communicator the group
// adopts (--adopt_comm=1) that is all of their device work, so a call that
// returns only once the hold has expired waited for the engine's work
// somewhere: this rank's FAIL line. On a communicator of its own, NCCL's
// ncclCommInitRankConfig waits for the whole device (tools/bench/RESULTS.md),
// and its teardown may, so those calls' times are reported, not judged.
// Either way the group is used as in any conformance run in between
// (values against the oracle).
//
// Scenario "ht_count_behind" (HT): a dispatch whose kernel waits on a held
// stream must return MOE_EP_ERR_TIMEOUT naming this rank once
// bootstrap.timeout_ms has passed without its stream reaching it, before
// the hold ends, instead of waiting to learn how many rows it received;
// the group is then failed, and group_destroy (after the hold) tears it
// down.
//
// Scenario "first_launch_held" (LL, a communicator of the group's own):
// group_create loads every kernel, so no call's first launch waits for the
// device's running work. LL round trips on the calls' own stream, fused
// and through hooks, with every routing generator (so different token
// counts, which pick different kernels): every library call (prepare,
// dispatch, combine, hook_run) runs while a nonblocking stream of the
// engine's is held and must return while it still is. Values are checked
// against the oracle between the holds.
//
// Scenario "destroy_behind": the group's own dispatch waits on a held
// stream when group_destroy is called. group_destroy must return
// MOE_EP_ERR_TIMEOUT naming this rank within bootstrap.timeout_ms, before
// the hold ends, leaving what that dispatch uses allocated; once the hold
// ends the dispatch runs on that memory and its values are checked.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>

#include "tests/common/mirror.h"
#include "tests/host/ht_call.h"
#include "tests/host/ll_call.h"
#include "tests/host/worker_common.h"

namespace moe_ep_test {

struct StreamHold {
  std::atomic<int> state{0};  // kQueued, kHolding, kReleased, kExpired
  std::atomic<int> release{0};
  int ms = 0;
  cudaStream_t stream = cudaStreamLegacy;  // the held one
  std::string name;
  std::chrono::steady_clock::time_point held_at;  // when the hold began
};

namespace {

enum { kQueued, kHolding, kReleased, kExpired };

void CUDART_CB hold_stream(void* arg) {
  StreamHold* h = static_cast<StreamHold*>(arg);
  h->held_at = std::chrono::steady_clock::now();
  h->state = kHolding;  // after held_at: the reader sees it set
  const auto end = h->held_at + std::chrono::milliseconds(h->ms);
  while (!h->release && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  h->state = h->release ? kReleased : kExpired;
}

}  // namespace

StreamHold* start_hold(Ctx& c, const char* what) {
  StreamHold* h = new StreamHold;
  h->ms = c.opt.hold_ms;
  h->name = c.opt.hold_stream == "nonblocking" ? "a nonblocking stream" : "the default stream";
  if (c.opt.hold_stream == "nonblocking")
    cuda_check(cudaStreamCreateWithFlags(&h->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  cuda_check(cudaLaunchHostFunc(h->stream, hold_stream, h), "cudaLaunchHostFunc");
  // Not a race: the hold must be on before group_create starts, or the run
  // proves nothing (bounded: a host function runs as soon as its stream
  // reaches it, and nothing is queued before it).
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (h->state == kQueued && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::fprintf(stderr, "rank %s: %s %s; %s starts\n",
               std::getenv("MOE_EP_RANK") ? std::getenv("MOE_EP_RANK") : "?", h->name.c_str(),
               h->state == kQueued ? "is not held yet (the host function has not started)"
                                   : "is held",
               what);
  return h;
}

void end_hold(Ctx& c, StreamHold* h, double call_ms, const char* what) {
  const int state = h->state;
  const auto now = std::chrono::steady_clock::now();
  h->release = 1;
  if (const char* r = std::getenv("MOE_EP_RANK")) c.rank = std::atoi(r);  // before group_info
  cuda_check(cudaStreamSynchronize(h->stream), "cudaStreamSynchronize(held)");
  if (h->stream != cudaStreamLegacy) cudaStreamDestroy(h->stream);
  if (c.opt.adopt_comm || state == kQueued) c.checks++;  // what is judged
  if (state == kQueued) {
    fail(c, 0, "hold", "the host function did not start holding " + h->name + " in 10 s");
  } else if (state != kHolding) {
    const double since_hold =
        std::chrono::duration<double, std::milli>(now - h->held_at).count();
    const std::string took = "returned after " + std::to_string((int)call_ms) + " ms (" +
                             std::to_string((int)since_hold) + " ms after the hold began), once the " +
                             std::to_string(h->ms) + " ms hold on " + h->name + " had expired";
    if (c.opt.adopt_comm)
      fail(c, 0, what, took + ": it waited for the engine's work");
    else
      std::fprintf(stderr,
                   "rank %d: %s %s: its own communicator's NCCL %s may wait for the whole "
                   "device (not judged; --adopt_comm=1 is)\n",
                   c.rank, what, took.c_str(),
                   std::string(what) == "group_create" ? "initialisation" : "teardown");
  } else {
    std::fprintf(stderr, "rank %d: %s returned in %.0f ms with %s held\n", c.rank, what,
                 call_ms, h->name.c_str());
  }
  delete h;
}

namespace {

// A nonblocking stream of its own, held by a host function for opt.hold_ms
// from now (bounded wait for the hold to begin).
StreamHold* hold_own_stream(Ctx& c, StreamHold* h) {
  cuda_check(cudaLaunchHostFunc(h->stream, hold_stream, h), "cudaLaunchHostFunc");
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (h->state == kQueued && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  c.checks++;
  if (h->state == kQueued) fail(c, 0, "hold", "the host function did not start in 10 s");
  return h;
}

StreamHold* new_own_hold(Ctx& c, const char* name) {
  StreamHold* h = new StreamHold;
  h->ms = c.opt.hold_ms;
  h->name = name;
  cuda_check(cudaStreamCreateWithFlags(&h->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  return h;
}

void free_own_hold(StreamHold* h) {
  h->release = 1;
  cuda_check(cudaStreamSynchronize(h->stream), "cudaStreamSynchronize(held)");
  cudaStreamDestroy(h->stream);
  delete h;
}

// Runs `call` while `h` holds a stream its kernel waits on: it must return
// MOE_EP_ERR_TIMEOUT with a sentence naming this rank and `must`, before
// the hold ends.
template <typename Call>
void timed_out_within_hold(Ctx& c, StreamHold* h, uint64_t seed, const std::string& what,
                           const std::string& must, Call call) {
  const auto t0 = std::chrono::steady_clock::now();
  const moe_ep_status_t st = call();
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const std::string msg = c.api->last_error();
  const int state = h->state;
  const std::string me = "rank " + std::to_string(c.rank) + ":";
  c.checks += 3;
  if (st != MOE_EP_ERR_TIMEOUT)
    fail(c, seed, what, std::string("returned ") + c.api->status_string(st) +
                            ", expected MOE_EP_ERR_TIMEOUT: " + msg);
  else if (msg.find(me) == std::string::npos || msg.find(must) == std::string::npos)
    fail(c, seed, what, "the sentence does not name " + me + " and \"" + must + "\": " + msg);
  if (state != kHolding)
    fail(c, seed, what, "returned after " + std::to_string((int)ms) +
                            " ms, once the hold had ended: it waited for the kernel");
  std::fprintf(stderr, "rank %d: %s with its kernel held returned in %.0f ms: %s\n", c.rank,
               what.c_str(), ms, msg.c_str());
}

}  // namespace

void run_first_launch_held(Ctx& c) {
  if (!runs_on_nccl(c, "first_launch_held")) return;
  c.checks++;
  if (c.opt.ht || c.opt.adopt_comm) {
    fail(c, 0, "first_launch_held", "needs LL on a communicator of the group's own "
                                    "(--adopt_comm=0)");
    return;
  }
  const auto [hidden, top_k] = c.opt.layers.front();
  using moe_ep_oracle::Generator;
  const Generator generators[] = {Generator::kUniform, Generator::kSkewed,
                                  Generator::kAllToOneRank, Generator::kEmptyRanks,
                                  Generator::kMasked};
  std::vector<std::unique_ptr<LlCall>> calls;
  uint64_t seed = 1;
  for (Generator g : generators)
    for (int defer = 0; defer < 2; defer++)
      calls.push_back(std::make_unique<LlCall>(c, problem_for(c, hidden, top_k, g), seed++));
  // The library's calls run while a nonblocking stream of the engine's is
  // held; the harness's own uploads and checks (cudaDeviceSynchronize)
  // between holds. A call that returned once its hold had ended waited for
  // the held stream, which only a kernel's first load does among them.
  StreamHold* h = nullptr;
  const char* held_name = "a nonblocking stream of the engine's";
  auto hold = [&] { h = hold_own_stream(c, new_own_hold(c, held_name)); };
  auto release = [&] {
    const bool on = h->state == kHolding;
    free_own_hold(h);
    return on;
  };
  auto held = [&](uint64_t s, const char* what, moe_ep_status_t st) {
    c.checks++;
    if (h->state != kHolding)
      fail(c, s, what, "returned once the " + std::to_string(h->ms) + " ms hold on " + h->name +
                           " had ended: it waited for the device's running work (a kernel "
                           "loaded at its first launch)");
    return expect_status(c, s, what, st, MOE_EP_OK);
  };
  auto hook_ran = [&](uint64_t s, const char* what, moe_ep_hook_t* hook) {
    const moe_ep_status_t st = c.api->hook_run(hook, nullptr);
    c.api->hook_free(hook);
    return held(s, what, st);
  };
  int on_throughout = 0, holds = 0;
  for (size_t i = 0; i < calls.size() && c.failures == 0; i++) {
    LlCall& call = *calls[i];
    const uint64_t s = call.seed();
    const bool defer = i % 2 == 1;
    const uint32_t flags = defer ? MOE_EP_FLAG_DEFER_RECV : 0;
    moe_ep_hook_t* hook = nullptr;
    hold();
    bool ok = held(s, "prepare", call.prepare(false)) &&
              held(s, "dispatch", call.dispatch(flags, defer ? &hook : nullptr)) &&
              (!defer || hook_ran(s, "dispatch hook_run", hook));
    on_throughout += release();
    holds++;
    if (!ok) break;
    call.check_prepare();
    call.check_dispatch();
    call.make_y();
    hold();
    ok = held(s, "combine", call.combine(flags, defer ? &hook : nullptr)) &&
         (!defer || hook_ran(s, "combine hook_run", hook));
    on_throughout += release();
    holds++;
    if (!ok) break;
    call.check_combine();
  }
  std::fprintf(stderr, "rank %d: %zu round trips; the hold on %s lasted through the calls of "
               "%d of %d holds\n", c.rank, calls.size(), held_name, on_throughout, holds);
}

void run_ht_count_behind(Ctx& c) {
  if (!runs_on_nccl(c, "ht_count_behind")) return;
  c.checks++;
  if (!c.opt.ht || c.opt.hold_ms < 2 * c.opt.boot_ms) {
    fail(c, 0, "ht_count_behind", "needs --mode=ht and --hold_ms of at least 2 x --boot_ms");
    return;
  }
  StreamHold* h = new_own_hold(c, "the dispatch's stream");
  const auto [hidden, top_k] = c.opt.layers.front();
  const uint64_t seed = 1;
  {
    // Loads the dispatch's kernels before the hold (see destroy_behind).
    HtCall warm(c, problem_for(c, hidden, top_k, moe_ep_oracle::Generator(seed + 1)), seed + 1);
    warm.set_stream(h->stream);
    if (warm.prepare() != MOE_EP_OK ||
        !expect_status(c, seed + 1, "dispatch", warm.dispatch(0, warm.num_recv()), MOE_EP_OK)) {
      free_own_hold(h);
      return;
    }
    warm.check_dispatch();
  }
  HtCall call(c, problem_for(c, hidden, top_k, moe_ep_oracle::Generator(seed)), seed);
  call.set_stream(h->stream);
  if (call.prepare() != MOE_EP_OK) {
    free_own_hold(h);
    return;
  }
  call.stage(call.num_recv());  // its uploads wait for the device: before the hold
  hold_own_stream(c, h);
  timed_out_within_hold(c, h, seed, "ht dispatch", "within bootstrap.timeout_ms",
                        [&] { return call.dispatch(0, call.num_recv()); });
  free_own_hold(h);
  c.checks++;
  if (c.api->group_poll_error(c.group) == MOE_EP_OK)
    fail(c, seed, "group_poll_error", "the group is not failed after the dispatch timed out");
}

void run_destroy_behind(Ctx& c) {
  if (!runs_on_nccl(c, "destroy_behind")) return;
  c.checks++;
  if (c.opt.hold_ms < 2 * c.opt.boot_ms) {
    fail(c, 0, "destroy_behind", "needs --hold_ms of at least 2 x --boot_ms");
    return;
  }
  StreamHold* h = new_own_hold(c, "the dispatch's stream");
  const auto [hidden, top_k] = c.opt.layers.front();
  const uint64_t seed = 1;
  {
    // The same dispatch once before the hold: a kernel's first launch
    // loads its module, which waits for the whole device (the hold too).
    LlCall warm(c, problem_for(c, hidden, top_k, moe_ep_oracle::Generator(seed + 1)), seed + 1);
    warm.set_stream(h->stream);
    if (!expect_status(c, seed + 1, "prepare", warm.prepare(), MOE_EP_OK) ||
        !expect_status(c, seed + 1, "dispatch", warm.dispatch(0, nullptr), MOE_EP_OK)) {
      free_own_hold(h);
      return;
    }
    warm.check_dispatch();
  }
  LlCall call(c, problem_for(c, hidden, top_k, moe_ep_oracle::Generator(seed)), seed);
  call.set_stream(h->stream);
  // prepare's layout kernel has to run before the hold (its check waits).
  if (!expect_status(c, seed, "prepare", call.prepare(), MOE_EP_OK)) {
    free_own_hold(h);
    return;
  }
  hold_own_stream(c, h);
  // Queued behind the hold: it cannot have run when group_destroy starts.
  expect_status(c, seed, "dispatch", call.dispatch(0, nullptr), MOE_EP_OK);
  timed_out_within_hold(c, h, seed, "group_destroy", "left allocated",
                        [&] { return c.api->group_destroy(c.group); });
  c.group = nullptr;
  free_own_hold(h);
  // The dispatch ran on the memory the group left: its values still hold.
  call.check_dispatch();
}

}  // namespace moe_ep_test
