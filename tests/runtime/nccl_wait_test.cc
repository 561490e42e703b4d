// nccl_wait_test.cc: the bounded waits of the NCCL setup steps
// (runtime/nccl/nccl_wait.h), against stand-ins for the few NCCL and CUDA
// calls they make: a communicator whose state stays ncclInProgress for a
// number of polls (or for ever), and a stream that drains after a number
// of queries (or never). Every wait must end, with the step named.
#include "runtime/nccl/nccl_wait.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "runtime/error.h"

namespace {

// The stand-in communicator: ncclCommGetAsyncError reports in_progress for
// `polls_left` polls (for ever when negative), then `settled`.
struct FakeComm {
  int polls_left = 0;
  ncclResult_t settled = ncclSuccess;
  int polls = 0;
};
FakeComm g_comm;
// The stand-in stream: cudaStreamQuery says not ready `queries_left` times
// (for ever when negative), then `drained`.
int g_queries_left = 0;
cudaError_t g_drained = cudaSuccess;
// Another thread capturing a graph in global mode: a query made in global
// mode is refused (and would invalidate that capture);
// g_refused_queries counts those.
bool g_foreign_capture = false;
int g_refused_queries = 0;
cudaStreamCaptureMode g_mode = cudaStreamCaptureModeGlobal;  // this thread's

// The stand-in streams cudaStreamCreateWithFlags makes (refused while
// g_refuse_streams), and what they saw.
bool g_refuse_streams = false;
int g_streams_made = 0, g_streams_destroyed = 0;
unsigned g_stream_flags = 0;
char g_side_stream;

ncclComm_t fake_comm() { return reinterpret_cast<ncclComm_t>(&g_comm); }
cudaStream_t fake_stream() { return reinterpret_cast<cudaStream_t>(&g_queries_left); }

std::string last() { return mep_last_error(); }

void reset(int polls_left, ncclResult_t settled, int queries_left = 0,
           cudaError_t drained = cudaSuccess) {
  g_comm = FakeComm{polls_left, settled, 0};
  g_queries_left = queries_left;
  g_drained = drained;
  g_foreign_capture = false;
  g_refused_queries = 0;
  g_mode = cudaStreamCaptureModeGlobal;
  mep_error_clear();
}

// Teardown's quiet wait: drained or not, within the bound, and no sentence.
TEST(NcclWait, StreamDrainedIsQuietAndBounded) {
  reset(0, ncclSuccess, 4);
  EXPECT_EQ(mep_nccl_stream_drained(fake_stream(), 10000), 1);
  EXPECT_EQ(g_queries_left, 0);
  reset(0, ncclSuccess, -1);
  EXPECT_EQ(mep_nccl_stream_drained(fake_stream(), 50), 0);
  EXPECT_EQ(last(), "");
  reset(0, ncclSuccess, 2, cudaErrorLaunchFailure);  // a failed stream runs nothing more
  EXPECT_EQ(mep_nccl_stream_drained(fake_stream(), 10000), 1);
}

// A teardown's side work runs on a non-blocking stream of its own, in
// thread-local capture mode (another thread's global-mode capture must not
// be broken by the stream's creation or the copy), is waited for (bounded:
// what it writes may be freed next), and the stream is destroyed after
// it; the thread's mode is put back. A stream CUDA refuses means no work,
// quietly; work that does not drain within the bound says so.
TEST(NcclWait, SideWorkRunsOnAStreamOfItsOwnInThreadLocalMode) {
  reset(0, ncclSuccess);
  g_refuse_streams = false;
  g_streams_made = g_streams_destroyed = 0;
  struct Seen {
    cudaStream_t stream = nullptr;
    cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
    int calls = 0;
  } seen;
  auto work = [](void *arg, cudaStream_t s) {
    Seen *w = static_cast<Seen *>(arg);
    w->stream = s;
    w->mode = g_mode;
    w->calls++;
  };
  EXPECT_EQ(mep_nccl_on_side_stream(work, &seen, 1000), 1);
  EXPECT_EQ(seen.calls, 1);
  EXPECT_EQ(seen.stream, reinterpret_cast<cudaStream_t>(&g_side_stream));
  EXPECT_EQ(g_stream_flags, static_cast<unsigned>(cudaStreamNonBlocking));
  EXPECT_EQ(seen.mode, cudaStreamCaptureModeThreadLocal);
  EXPECT_EQ(g_streams_made, 1);
  EXPECT_EQ(g_streams_destroyed, 1);
  EXPECT_EQ(g_mode, cudaStreamCaptureModeGlobal);
  g_mode = cudaStreamCaptureModeRelaxed;  // left as it is
  g_queries_left = 3;                      // drains after a few polls
  EXPECT_EQ(mep_nccl_on_side_stream(work, &seen, 10000), 1);
  EXPECT_EQ(g_queries_left, 0);
  EXPECT_EQ(seen.mode, cudaStreamCaptureModeRelaxed);
  EXPECT_EQ(g_mode, cudaStreamCaptureModeRelaxed);
  g_mode = cudaStreamCaptureModeGlobal;
  g_queries_left = -1;  // never drains
  EXPECT_EQ(mep_nccl_on_side_stream(work, &seen, 50), 0);
  EXPECT_EQ(seen.calls, 3);
  EXPECT_EQ(g_streams_destroyed, 3);
  g_queries_left = 0;
  g_refuse_streams = true;
  EXPECT_EQ(mep_nccl_on_side_stream(work, &seen, 1000), 1);
  EXPECT_EQ(seen.calls, 3);
  EXPECT_EQ(g_streams_made, 3);
  EXPECT_EQ(g_streams_destroyed, 3);
  EXPECT_EQ(g_mode, cudaStreamCaptureModeGlobal);
  EXPECT_EQ(last(), "");
  g_refuse_streams = false;
}

// While another thread captures in global mode, the queries are made in
// thread-local mode (refused otherwise, breaking that capture), the
// thread's mode is put back, and a refusal tied to capture is not taken
// for the end of the work.
TEST(NcclWait, QueriesLeaveAnotherThreadsCaptureAlone) {
  reset(0, ncclSuccess, 3);
  g_foreign_capture = true;
  EXPECT_EQ(mep_nccl_stream_drained(fake_stream(), 10000), 1);
  EXPECT_EQ(g_queries_left, 0);
  EXPECT_EQ(g_refused_queries, 0);
  EXPECT_EQ(g_mode, cudaStreamCaptureModeGlobal);
  EXPECT_EQ(mep_nccl_stream_wait(nullptr, fake_stream(), "step", 1000), MOE_EP_OK);
  // A thread in relaxed mode (more permissive) is left in it.
  reset(0, ncclSuccess, 2);
  g_foreign_capture = true;
  g_mode = cudaStreamCaptureModeRelaxed;
  EXPECT_EQ(mep_nccl_stream_drained(fake_stream(), 10000), 1);
  EXPECT_EQ(g_refused_queries, 0);
  EXPECT_EQ(g_mode, cudaStreamCaptureModeRelaxed);
  reset(0, ncclSuccess, 0, cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(mep_nccl_stream_drained(fake_stream(), 50), 0);
  EXPECT_EQ(mep_nccl_query_ended(cudaErrorStreamCaptureInvalidated), 0);
  EXPECT_EQ(mep_nccl_query_ended(cudaErrorIllegalAddress), 1);
}

TEST(NcclWait, SuccessWithASettledCommunicatorReturnsAtOnce) {
  reset(0, ncclSuccess);
  EXPECT_EQ(mep_nccl_settle(fake_comm(), ncclSuccess, "step", 1000), MOE_EP_OK);
  EXPECT_EQ(g_comm.polls, 1);  // the state is read once even after ncclSuccess
}

// A call that returned ncclSuccess while the communicator is still in
// progress (seen with NCCL 2.28.9) is waited for too.
TEST(NcclWait, SuccessWhileStillInProgressIsPolledUntilSettled) {
  reset(5, ncclSuccess);
  EXPECT_EQ(mep_nccl_settle(fake_comm(), ncclSuccess, "ncclCommWindowRegister", 10000), MOE_EP_OK);
  EXPECT_EQ(g_comm.polls, 6);
}

TEST(NcclWait, InProgressThatFailsReportsNcclsReasonAndTheStep) {
  reset(3, ncclRemoteError);
  EXPECT_EQ(mep_nccl_settle(fake_comm(), ncclInProgress, "ncclDevCommCreate", 10000),
            MOE_EP_ERR_NCCL);
  EXPECT_NE(last().find("ncclDevCommCreate failed: remote error"), std::string::npos) << last();
  EXPECT_NE(last().find("the peer went away"), std::string::npos) << last();
}

TEST(NcclWait, ACallThatFailedOutrightIsNotPolled) {
  reset(-1, ncclSuccess);
  EXPECT_EQ(mep_nccl_settle(fake_comm(), ncclInvalidArgument, "ncclAllReduce", 10000),
            MOE_EP_ERR_NCCL);
  EXPECT_EQ(g_comm.polls, 0);
  EXPECT_NE(last().find("ncclAllReduce failed: invalid argument"), std::string::npos) << last();
}

TEST(NcclWait, NeverSettlingEndsInTimeoutAfterTheBound) {
  reset(-1, ncclSuccess);
  const int64_t t0 = mep_nccl_now_ms();
  EXPECT_EQ(mep_nccl_settle(fake_comm(), ncclInProgress, "ncclCommInitRankConfig", 50),
            MOE_EP_ERR_TIMEOUT);
  EXPECT_GE(mep_nccl_now_ms() - t0, 50);
  EXPECT_NE(last().find("ncclCommInitRankConfig did not complete within "
                        "bootstrap.timeout_ms=50"),
            std::string::npos)
      << last();
}

TEST(NcclWait, TheQuietFormSaysOnlyWhetherItSucceededAndKeepsTheLastError) {
  const std::string kept = "the error being reported";
  reset(-1, ncclSuccess);
  mep_error(MOE_EP_ERR_TIMEOUT, "%s", kept.c_str());
  EXPECT_EQ(mep_nccl_settled(fake_comm(), ncclInProgress, 20), 0);  // timed out
  EXPECT_EQ(last(), kept);
  reset(2, ncclSuccess);
  mep_error(MOE_EP_ERR_TIMEOUT, "%s", kept.c_str());
  EXPECT_EQ(mep_nccl_settled(fake_comm(), ncclInProgress, 10000), 1);
  EXPECT_EQ(last(), kept);
  reset(2, ncclSystemError);
  mep_error(MOE_EP_ERR_TIMEOUT, "%s", kept.c_str());
  EXPECT_EQ(mep_nccl_settled(fake_comm(), ncclInProgress, 10000), 0);  // failed
  EXPECT_EQ(last(), kept);
  reset(0, ncclSuccess);
  mep_error(MOE_EP_ERR_TIMEOUT, "%s", kept.c_str());
  EXPECT_EQ(mep_nccl_settled(fake_comm(), ncclInvalidUsage, 10000), 0);  // failed outright
  EXPECT_EQ(last(), kept);
}

TEST(NcclWait, AStreamThatDrainsEndsTheWait) {
  reset(0, ncclSuccess, 4);
  EXPECT_EQ(mep_nccl_stream_wait(fake_comm(), fake_stream(), "ncclAllReduce (barrier)", 10000),
            MOE_EP_OK);
}

TEST(NcclWait, AStreamThatNeverDrainsEndsInTimeout) {
  reset(0, ncclSuccess, -1);
  const int64_t t0 = mep_nccl_now_ms();
  EXPECT_EQ(mep_nccl_stream_wait(fake_comm(), fake_stream(), "ncclAllReduce (barrier)", 50),
            MOE_EP_ERR_TIMEOUT);
  EXPECT_GE(mep_nccl_now_ms() - t0, 50);
  EXPECT_NE(last().find("ncclAllReduce (barrier) did not complete within"), std::string::npos)
      << last();
}

// NCCL's asynchronous error (a peer's socket closed) ends a stream wait
// before the bound.
TEST(NcclWait, AnAsynchronousNcclErrorEndsAStreamWait) {
  reset(2, ncclSystemError, -1);
  EXPECT_EQ(mep_nccl_stream_wait(fake_comm(), fake_stream(), "ncclAllGather (LSA link check)",
                                 3600000),
            MOE_EP_ERR_NCCL);
  EXPECT_NE(last().find("ncclAllGather (LSA link check) failed: unhandled system error"),
            std::string::npos)
      << last();
}

TEST(NcclWait, AStreamErrorIsACudaError) {
  reset(0, ncclSuccess, 1, cudaErrorIllegalAddress);
  EXPECT_EQ(mep_nccl_stream_wait(fake_comm(), fake_stream(), "ncclAllReduce (barrier)", 10000),
            MOE_EP_ERR_CUDA);
  EXPECT_NE(last().find("ncclAllReduce (barrier) failed on the GPU: illegal address"),
            std::string::npos)
      << last();
}

}  // namespace

// The stand-ins nccl_wait.c links against here.
extern "C" {
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *state) {
  FakeComm *c = reinterpret_cast<FakeComm *>(comm);
  c->polls++;
  if (c->polls_left != 0) {
    if (c->polls_left > 0) c->polls_left--;
    *state = ncclInProgress;
  } else {
    *state = c->settled;
  }
  return ncclSuccess;
}
const char *ncclGetLastError(ncclComm_t) { return "the peer went away"; }
const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSystemError: return "unhandled system error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclRemoteError: return "remote error";
    default: return "other";
  }
}
cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode *mode) {
  std::swap(*mode, g_mode);
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
  if (g_refuse_streams) return cudaErrorMemoryAllocation;
  g_stream_flags = flags;
  g_streams_made++;
  *s = reinterpret_cast<cudaStream_t>(&g_side_stream);
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (s == reinterpret_cast<cudaStream_t>(&g_side_stream)) g_streams_destroyed++;
  return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t) {
  if (g_foreign_capture && g_mode == cudaStreamCaptureModeGlobal) {
    g_refused_queries++;
    return cudaErrorStreamCaptureUnsupported;
  }
  if (g_queries_left != 0) {
    if (g_queries_left > 0) g_queries_left--;
    return cudaErrorNotReady;
  }
  return g_drained;
}
const char *cudaGetErrorString(cudaError_t e) {
  return e == cudaErrorIllegalAddress ? "illegal address" : "other";
}
}

// The setup's own work (zeroing, copies) involves no peer: its expiry
// names this rank's GPU, and no communicator is polled.
TEST(NcclWait, LocalWorkThatNeverDrainsBlamesThisGpuNotAPeer) {
  reset(-1, ncclSuccess, -1);
  EXPECT_EQ(mep_nccl_local_wait(fake_stream(), "cudaMemsetAsync (window)", 50),
            MOE_EP_ERR_TIMEOUT);
  EXPECT_NE(last().find("cudaMemsetAsync (window) did not complete within "
                        "bootstrap.timeout_ms=50: this rank's GPU did not run it"),
            std::string::npos)
      << last();
  EXPECT_EQ(last().find("another rank"), std::string::npos) << last();
  EXPECT_EQ(g_comm.polls, 0);
}

TEST(NcclWait, LocalWorkThatDrainsEndsTheWait) {
  reset(0, ncclSuccess, 3);
  EXPECT_EQ(mep_nccl_local_wait(fake_stream(), "cudaMemcpyAsync (LSA link check)", 10000),
            MOE_EP_OK);
}
