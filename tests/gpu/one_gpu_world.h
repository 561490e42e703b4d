// one_gpu_world.h: one GPU standing in for a group of W ranks, so the
// kernels' multi-rank logic (ring and signal protocols, node splits, every
// rank count up to the kernels' limits) runs on a 1-GPU machine.
//
// The W windows are slices of one device allocation, rank r's at
// base + r * stride: exactly the LSA addressing the kernels use for NVLink
// peers (transport.cuh, mep_lsa_ptr), so LSA and GIN-emulated kernels run
// unchanged; each rank gets a device communicator whose only meaningful
// fields are its rank and the LSA team (the whole world). Real GIN needs
// NCCL and is not served. Each rank's kernels go on a stream of its own,
// so the W launches of one operation run side by side; a grid that cannot
// become resident next to the others shows up as the kernels' bounded wait
// expiring (an error record), never a hang.
#ifndef MEP_TESTS_GPU_ONE_GPU_WORLD_H_
#define MEP_TESTS_GPU_ONE_GPU_WORLD_H_

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <nccl_device.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/common/error_record.h"
#include "kernels/common/kernels_error.h"

namespace mep_world {

class World {
 public:
  // Null on failure, with CUDA's sentence in *err.
  static std::unique_ptr<World> Create(int world, uint64_t window_bytes,
                                       std::string *err);
  ~World();
  World(const World &) = delete;
  World &operator=(const World &) = delete;

  int size() const { return world_; }
  uint64_t stride() const { return stride_; }
  char *base() const { return base_; }
  char *window(int r) const {
    return base_ + static_cast<uint64_t>(r) * stride_;
  }
  const ncclDevComm *dev_comm(int r) const { return &comms_[r]; }
  cudaStream_t stream(int r) const { return streams_[r]; }
  // Two host-mapped records per rank: [0] fatal, [1] notice.
  mep_error_record_t *records(int r) const { return records_ + 2 * r; }
  mep_error_record_t *records_dev(int r) const { return records_dev_ + 2 * r; }
  // Waits until the device is idle, before the ranks' launches: uploads
  // from pageable memory may still be in flight when cudaMemcpy returns,
  // and the ranks' non-blocking streams do not wait for them. "" or CUDA's
  // sentence.
  std::string Settle() const;
  // launch(r, stream(r)) -> mep_kstatus_t for every rank but `skip`, in rank
  // order; "" or "rank r: <the launcher's sentence>" for the first refusal.
  template <typename Launch>
  std::string LaunchAll(Launch launch, int skip = -1) const {
    for (int r = 0; r < world_; ++r) {
      if (r == skip) continue;
      if (launch(r, streams_[r]) != MEP_KSTATUS_OK)
        return "rank " + std::to_string(r) + ": " + mep_kernels_last_error();
    }
    return "";
  }
  // Waits for every rank's stream; "" or CUDA's sentence.
  std::string Sync() const;
  // "" when no rank left a record, else each record as a sentence.
  std::string Records() const;
  // Zeroes every window (between cases that reuse a world's memory).
  std::string ZeroWindows() const;

 private:
  World() = default;
  int world_ = 0;
  uint64_t stride_ = 0;
  char *base_ = nullptr;
  std::vector<ncclDevComm> comms_;
  std::vector<cudaStream_t> streams_;
  mep_error_record_t *records_ = nullptr;
  mep_error_record_t *records_dev_ = nullptr;
};

// Device memory of one test scope, freed at its end.
struct Dev {
  std::vector<void *> ptrs;
  ~Dev() {
    for (void *p : ptrs) cudaFree(p);
  }
  template <typename T>
  T *alloc(size_t n) {
    void *p = nullptr;
    if (cudaMalloc(&p, n == 0 ? 1 : n * sizeof(T)) != cudaSuccess)
      return nullptr;
    ptrs.push_back(p);
    return static_cast<T *>(p);
  }
  template <typename T>
  T *upload(const std::vector<T> &v) {
    T *p = alloc<T>(v.size());
    // A copy from pageable memory may return before its DMA lands, and
    // the ranks' streams are non-blocking: the legacy stream, which holds
    // the copy, is waited for before any launch (not the device: a rank's
    // kernel may be waiting for the very rank being set up).
    if (p != nullptr && !v.empty() &&
        (cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice) !=
             cudaSuccess ||
         cudaStreamSynchronize(cudaStreamLegacy) != cudaSuccess))
      return nullptr;
    return p;
  }
};

template <typename T>
std::vector<T> Download(const void *p, size_t n) {
  std::vector<T> v(n);
  if (n > 0) cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
  return v;
}

// Points a kernel context (mep_ll_ctx_t or mep_ht_ctx_t: the same field
// names) at rank r of `w`: its communicator, window and LSA addressing,
// records ([0] fatal, [1] notice) and a zeroed device state of
// state_bytes from `dev`. "" or CUDA's sentence.
template <typename Ctx>
std::string PointAtRank(const World &w, int r, uint64_t state_bytes, Dev *dev,
                        Ctx *x) {
  x->dev_comm = w.dev_comm(r);
  x->window = w.window(r);
  x->window_local = w.window(r);
  x->window_bytes = w.stride();
  x->rank = r;
  x->error_dev = w.records_dev(r);
  x->notice_dev = w.records_dev(r) + 1;
  x->lsa_base = reinterpret_cast<uint64_t>(w.base());
  x->lsa_stride = w.stride();
  x->lsa_local = reinterpret_cast<uint64_t>(w.window(r));
  x->state = dev->alloc<char>(state_bytes);
  if (x->state == nullptr)
    return "rank " + std::to_string(r) + ": cudaMalloc(state) failed";
  cudaError_t e = cudaMemset(x->state, 0, state_bytes);
  if (e == cudaSuccess) e = cudaStreamSynchronize(cudaStreamLegacy);  // as Dev::upload
  return e == cudaSuccess
             ? ""
             : std::string("cudaMemset(state): ") + cudaGetErrorString(e);
}

}  // namespace mep_world

#endif  // MEP_TESTS_GPU_ONE_GPU_WORLD_H_
