// foreign_stream.h: a stream of a CUDA context of its own on a GPU (the
// driver's cuCtxCreate, reached through the runtime's entry-point query),
// not the device's primary context where a group's memory lives. Passing
// it to a group's call is bad input the nccl backend must refuse.
#ifndef MOE_EP_TESTS_HOST_FOREIGN_STREAM_H_
#define MOE_EP_TESTS_HOST_FOREIGN_STREAM_H_

#include <string>

namespace moe_ep_test {

class ForeignStream {
 public:
  // Makes the context on `gpu` and a non-blocking stream in it; the
  // calling thread's current context is put back. error() says why not.
  explicit ForeignStream(int gpu);
  ~ForeignStream();
  ForeignStream(const ForeignStream&) = delete;
  ForeignStream& operator=(const ForeignStream&) = delete;

  void* stream() const { return stream_; }  // CUstream, castable to cudaStream_t
  const std::string& error() const { return error_; }

 private:
  void* ctx_ = nullptr;
  void* stream_ = nullptr;
  std::string error_;
};

}  // namespace moe_ep_test

#endif  // MOE_EP_TESTS_HOST_FOREIGN_STREAM_H_
