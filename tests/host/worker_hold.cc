// worker_hold.cc: group_create while the engine's GPU work has not ended.
// A host function holds the legacy default stream (--hold_stream=legacy)
// until group_create has returned (or until --hold_ms passes): every
// blocking stream's later work queues behind it, and so do cudaMemcpy,
// launches on stream 0 and cudaDeviceSynchronize. With
// --hold_stream=nonblocking it holds a nonblocking stream of its own
// instead, as an engine's side stream would: only what waits for the whole
// device (cudaFree, cudaFreeHost, a module's first load) waits for that one.
// group_create's own device work (zeroing the window and the state, the
// link check's copies, reading the window's LSA addresses) runs on its
// nonblocking setup stream. On a communicator it adopts (--adopt_comm=1)
// that is all of its device work, so a create that returns only once the
// hold has expired waited for the engine's work somewhere: this rank's
// FAIL line. On a communicator of its own, NCCL's ncclCommInitRankConfig
// waits for the whole device (tools/bench/RESULTS.md), so that create's
// time is reported, not judged. Either way the group is then used as in
// any conformance run (values against the oracle).
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include <cuda_runtime_api.h>

#include "tests/common/mirror.h"
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

StreamHold* start_hold(Ctx& c) {
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
  std::fprintf(stderr, "rank %s: %s %s; group_create starts\n",
               std::getenv("MOE_EP_RANK") ? std::getenv("MOE_EP_RANK") : "?", h->name.c_str(),
               h->state == kQueued ? "is not held yet (the host function has not started)"
                                   : "is held");
  return h;
}

void end_hold(Ctx& c, StreamHold* h, double create_ms) {
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
    const std::string took = "returned after " + std::to_string((int)create_ms) + " ms (" +
                             std::to_string((int)since_hold) + " ms after the hold began), once the " +
                             std::to_string(h->ms) + " ms hold on " + h->name + " had expired";
    if (c.opt.adopt_comm)
      fail(c, 0, "group_create", took + ": it waited for the engine's work");
    else
      std::fprintf(stderr,
                   "rank %d: group_create %s: its own communicator's NCCL initialisation waits "
                   "for the whole device (not judged; --adopt_comm=1 is)\n",
                   c.rank, took.c_str());
  } else {
    std::fprintf(stderr, "rank %d: group_create returned in %.0f ms with %s held\n", c.rank,
                 create_ms, h->name.c_str());
  }
  delete h;
}

}  // namespace moe_ep_test
