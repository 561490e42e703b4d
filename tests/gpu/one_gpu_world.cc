// one_gpu_world.cc: see one_gpu_world.h.
#include "tests/gpu/one_gpu_world.h"

#include <cstring>

namespace mep_world {
namespace {

// Windows start on 2 MiB boundaries, as NCCL's registered windows do, so
// the kernels' vector accesses meet the same alignment.
constexpr uint64_t kWindowAlign = 2ull << 20;

std::string CudaSentence(const char *what, cudaError_t e) {
  return std::string(what) + ": " + cudaGetErrorString(e);
}

}  // namespace

std::unique_ptr<World> World::Create(int world, uint64_t window_bytes,
                                     std::string *err) {
  std::unique_ptr<World> w(new World());
  w->world_ = world;
  w->stride_ = (window_bytes + kWindowAlign - 1) / kWindowAlign * kWindowAlign;
  cudaError_t e = cudaMalloc(&w->base_, w->stride_ * world);
  if (e != cudaSuccess) {
    w->base_ = nullptr;
    *err = CudaSentence("cudaMalloc(windows)", e);
    return nullptr;
  }
  if ((e = cudaMemset(w->base_, 0, w->stride_ * world)) != cudaSuccess ||
      (e = cudaStreamSynchronize(cudaStreamLegacy)) != cudaSuccess) {
    *err = CudaSentence("cudaMemset(windows)", e);
    return nullptr;
  }
  if ((e = cudaHostAlloc(reinterpret_cast<void **>(&w->records_),
                         2 * world * sizeof(mep_error_record_t),
                         cudaHostAllocMapped)) != cudaSuccess) {
    w->records_ = nullptr;
    *err = CudaSentence("cudaHostAlloc(records)", e);
    return nullptr;
  }
  memset(w->records_, 0, 2 * world * sizeof(mep_error_record_t));
  if ((e = cudaHostGetDevicePointer(reinterpret_cast<void **>(&w->records_dev_),
                                    w->records_, 0)) != cudaSuccess) {
    *err = CudaSentence("cudaHostGetDevicePointer(records)", e);
    return nullptr;
  }
  w->comms_.resize(world);
  w->streams_.assign(world, nullptr);
  for (int r = 0; r < world; ++r) {
    ncclDevComm &c = w->comms_[r];
    memset(&c, 0, sizeof c);
    c.rank = r;
    c.nRanks = world;
    c.lsaRank = r;
    c.lsaSize = world;
    if ((e = cudaStreamCreateWithFlags(&w->streams_[r],
                                       cudaStreamNonBlocking)) != cudaSuccess) {
      *err = CudaSentence("cudaStreamCreate", e);
      return nullptr;
    }
  }
  return w;
}

World::~World() {
  cudaDeviceSynchronize();
  for (cudaStream_t s : streams_)
    if (s != nullptr) cudaStreamDestroy(s);
  if (records_ != nullptr) cudaFreeHost(records_);
  cudaFree(base_);
}

std::string World::Settle() const {
  const cudaError_t e = cudaDeviceSynchronize();
  return e == cudaSuccess ? "" : CudaSentence("cudaDeviceSynchronize", e);
}

std::string World::Sync() const {
  for (int r = 0; r < world_; ++r) {
    cudaError_t e = cudaStreamSynchronize(streams_[r]);
    if (e != cudaSuccess)
      return "rank " + std::to_string(r) + ": " +
             CudaSentence("cudaStreamSynchronize", e);
  }
  return "";
}

std::string World::Records() const {
  std::string out;
  for (int i = 0; i < 2 * world_; ++i) {
    const mep_error_record_t &r = records_[i];
    if (r.flag == 0) continue;
    out += "rank " + std::to_string(i / 2) + (i % 2 ? " notice" : " fatal") +
           ": op " + std::to_string(r.op) + ", waited for rank " +
           std::to_string(r.peer) + ", expected " + std::to_string(r.expected) +
           ", seen " + std::to_string(r.seen) + ", buffer set " +
           std::to_string(r.buffer_set) + "; ";
  }
  return out;
}

std::string World::ZeroWindows() const {
  // cudaMemset runs on the legacy stream, which the ranks' non-blocking
  // streams do not wait for: waited for here, before any launch.
  cudaError_t e = cudaMemset(base_, 0, stride_ * world_);
  if (e == cudaSuccess) e = cudaStreamSynchronize(cudaStreamLegacy);
  return e == cudaSuccess ? "" : CudaSentence("cudaMemset(windows)", e);
}

}  // namespace mep_world
