// foreign_stream.cc: see foreign_stream.h.
#include "tests/host/foreign_stream.h"

#include <cuda_runtime_api.h>

namespace moe_ep_test {

namespace {

// The driver's `name` in the form of CUDA `version`; nullptr when absent.
void* driver_entry(const char* name, unsigned int version) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(name, &fn, version, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess)
    return nullptr;
  return fn;
}

// CUresult signatures, with the driver's handles as void*.
using CtxGet = int (*)(void**);
using CtxSet = int (*)(void*);
using DeviceGet = int (*)(int*, int);
// CUctxCreateParams: no execution affinity, no CIG; zeroed is a plain context.
struct CtxCreateParams {
  void* exec_affinity_params;
  int num_exec_affinity_params;
  void* cig_params;
};
using CtxCreate = int (*)(void**, CtxCreateParams*, unsigned int, int);  // as of CUDA 12.5
using StreamCreate = int (*)(void**, unsigned int);
using Destroy = int (*)(void*);  // cuStreamDestroy, cuCtxDestroy

constexpr unsigned int kStreamNonBlocking = 1;  // CU_STREAM_NON_BLOCKING

}  // namespace

ForeignStream::ForeignStream(int gpu) {
  auto get = reinterpret_cast<CtxGet>(driver_entry("cuCtxGetCurrent", 12000));
  auto set = reinterpret_cast<CtxSet>(driver_entry("cuCtxSetCurrent", 12000));
  auto device = reinterpret_cast<DeviceGet>(driver_entry("cuDeviceGet", 12000));
  auto create = reinterpret_cast<CtxCreate>(driver_entry("cuCtxCreate", 12050));
  auto make_stream = reinterpret_cast<StreamCreate>(driver_entry("cuStreamCreate", 12000));
  if (!get || !set || !device || !create || !make_stream) {
    error_ = "the driver's context calls are not available";
    return;
  }
  void* saved = nullptr;
  int dev = 0, rc = 0;
  if ((rc = get(&saved)) != 0 || (rc = device(&dev, gpu)) != 0) {
    error_ = "cuCtxGetCurrent / cuDeviceGet failed: CUresult " + std::to_string(rc);
    return;
  }
  // cuCtxCreate makes the new context current; the stream is made there.
  CtxCreateParams plain = {nullptr, 0, nullptr};
  if ((rc = create(&ctx_, &plain, 0, dev)) != 0) {
    error_ = "cuCtxCreate on GPU " + std::to_string(gpu) + " failed: CUresult " + std::to_string(rc);
    ctx_ = nullptr;
  } else if ((rc = make_stream(&stream_, kStreamNonBlocking)) != 0) {
    error_ = "cuStreamCreate in the new context failed: CUresult " + std::to_string(rc);
    stream_ = nullptr;
  }
  (void)set(saved);
}

ForeignStream::~ForeignStream() {
  auto destroy_stream = reinterpret_cast<Destroy>(driver_entry("cuStreamDestroy", 12000));
  auto destroy_ctx = reinterpret_cast<Destroy>(driver_entry("cuCtxDestroy", 12000));
  if (stream_ != nullptr && destroy_stream != nullptr) (void)destroy_stream(stream_);
  if (ctx_ != nullptr && destroy_ctx != nullptr) (void)destroy_ctx(ctx_);
}

}  // namespace moe_ep_test
