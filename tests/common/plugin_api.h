// plugin_api.h: test-side helpers to load libmoe_ep.so through the public
// loader and to describe host buffers as moe_ep tensors.
#ifndef MOE_EP_TESTS_COMMON_PLUGIN_API_H_
#define MOE_EP_TESTS_COMMON_PLUGIN_API_H_

#include <cstdint>
#include <string>
#include <vector>

#include "moe_ep.h"

namespace moe_ep_test {

// The loaded table; aborts the test process with a message if loading fails
// (a test that cannot load the plugin has nothing to check).
const moe_ep_plugin_v1_t* load_plugin(const std::string& path);

// Finds libmoe_ep.so next to the test (Bazel runfiles) or from $MOE_EP_PLUGIN.
std::string plugin_path(const char* argv0);

enum class DT { kBf16, kFp8, kF32, kI32, kI64, kU8 };

// A descriptor with its own shape storage (stable address: keep it alive
// while the plugin may read it, i.e. across a deferred hook).
struct Tensor {
  moe_ep_tensor_t t{};
  int64_t shape[3] = {0, 0, 0};
  Tensor() = default;
  Tensor(const void* data, DT dt, std::vector<int64_t> dims,
         int device_type = MOE_EP_DEVICE_CPU, int device_id = 0);
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;
  moe_ep_tensor_t* get() { return &t; }
};

moe_ep_data_type_t dtype_of(DT dt);

}  // namespace moe_ep_test

#endif  // MOE_EP_TESTS_COMMON_PLUGIN_API_H_
