// bench_util.h: what every part of moe_ep_bench uses: fatal errors (the
// bench stops at the first failed call), flag and environment parsing,
// text formatting, device allocation and tensor descriptors.
#ifndef MOE_EP_TOOLS_BENCH_BENCH_UTIL_H_
#define MOE_EP_TOOLS_BENCH_BENCH_UTIL_H_

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "moe_ep.h"

namespace mep_bench {

extern int g_rank;                       // for Die's messages
extern const moe_ep_plugin_v1_t* g_ep;   // the loaded plugin table

[[noreturn]] void Die(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

#define CUDA_CHECK(call)                                                                   \
  do {                                                                                     \
    cudaError_t e_ = (call);                                                               \
    if (e_ != cudaSuccess) ::mep_bench::Die("%s failed: %s (%s:%d)", #call,                \
                                            cudaGetErrorString(e_), __FILE__, __LINE__);   \
  } while (0)

#define NCCL_CHECK(call)                                                                   \
  do {                                                                                     \
    ncclResult_t r_ = (call);                                                              \
    if (r_ != ncclSuccess) ::mep_bench::Die("%s failed: %s (%s:%d)", #call,                \
                                            ncclGetErrorString(r_), __FILE__, __LINE__);   \
  } while (0)

#define EP_CHECK(call)                                                                     \
  do {                                                                                     \
    moe_ep_status_t s_ = (call);                                                           \
    if (s_ != MOE_EP_OK) ::mep_bench::Die("%s failed: %s: %s", #call,                      \
                                          ::mep_bench::g_ep->status_string(s_),            \
                                          ::mep_bench::g_ep->last_error());                \
  } while (0)

int EnvInt(const char* name, int def);
std::vector<int> IntList(const std::vector<std::string>& in, const char* flag, int lo, int hi);
double NowS();  // monotonic seconds
std::string Fmt(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string JsonEscape(const std::string& s);
const char* TransportName(int t);

// A moe_ep tensor descriptor with its own shape storage.
struct Desc {
  int64_t shape[3];
  moe_ep_tensor_t t;
  void Set(void* data, int code, int bits, int dev, std::vector<int64_t> dims);
};

// Zeroed device memory for `count` elements (at least one).
template <typename T>
T* DevAlloc(size_t count) {
  T* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T)));
  CUDA_CHECK(cudaMemset(p, 0, std::max<size_t>(count, 1) * sizeof(T)));
  return p;
}

}  // namespace mep_bench

#endif  // MOE_EP_TOOLS_BENCH_BENCH_UTIL_H_
