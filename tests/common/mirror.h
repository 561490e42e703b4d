// mirror.h: a host buffer's twin in CUDA device memory, for running the
// same conformance checks on the nccl backend (device tensors) as on the
// host backend (where the "twin" is the host buffer itself).
#ifndef MOE_EP_TESTS_COMMON_MIRROR_H_
#define MOE_EP_TESTS_COMMON_MIRROR_H_

#include <cstddef>

namespace moe_ep_test {

class Mirror {
 public:
  Mirror() = default;
  // gpu: allocate `bytes` on the current device and upload the host data.
  void init(bool gpu, void* host, size_t bytes);
  ~Mirror();
  Mirror(const Mirror&) = delete;
  Mirror& operator=(const Mirror&) = delete;
  void* ptr() const { return gpu_ ? dev_ : host_; }
  void upload();    // host -> device (waits for the device first)
  void download();  // device -> host (waits for the device first)

 private:
  bool gpu_ = false;
  void* host_ = nullptr;
  void* dev_ = nullptr;
  size_t bytes_ = 0;
};

// Aborts the process with a message if the last CUDA call failed: a test
// whose device memory is broken has nothing left to check.
void cuda_check(int err, const char* what);

}  // namespace moe_ep_test

#endif  // MOE_EP_TESTS_COMMON_MIRROR_H_
