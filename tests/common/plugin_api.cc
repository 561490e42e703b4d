// plugin_api.cc: plugin loading and tensor descriptors for tests.
#include "tests/common/plugin_api.h"

#include <cstdio>
#include <cstdlib>
#include <unistd.h>

#include "moe_ep_loader.h"

namespace moe_ep_test {

const moe_ep_plugin_v1_t* load_plugin(const std::string& path) {
  const moe_ep_plugin_v1_t* table = nullptr;
  char err[512];
  if (moe_ep_load(path.c_str(), &table, err, sizeof err) == nullptr) {
    std::fprintf(stderr, "cannot load plugin: %s\n", err);
    std::exit(3);
  }
  return table;
}

std::string plugin_path(const char* argv0) {
  if (const char* env = std::getenv("MOE_EP_PLUGIN")) return env;
  const char* dirs[] = {"plugin/libmoe_ep.so", "../plugin/libmoe_ep.so"};
  if (const char* src = std::getenv("TEST_SRCDIR")) {
    std::string p = std::string(src) + "/moe_ep/plugin/libmoe_ep.so";
    if (access(p.c_str(), R_OK) == 0) return p;
  }
  for (const char* d : dirs) {
    if (access(d, R_OK) == 0) return d;
  }
  std::string self(argv0 ? argv0 : "");
  std::string dir = self.substr(0, self.find_last_of('/') + 1);
  return dir + "libmoe_ep.so";
}

moe_ep_data_type_t dtype_of(DT dt) {
  switch (dt) {
    case DT::kBf16: return {MOE_EP_DTYPE_BFLOAT, 16, 1};
    case DT::kFp8: return {MOE_EP_DTYPE_FLOAT8_E4M3FN, 8, 1};
    case DT::kF32: return {MOE_EP_DTYPE_FLOAT, 32, 1};
    case DT::kI32: return {MOE_EP_DTYPE_INT, 32, 1};
    case DT::kI64: return {MOE_EP_DTYPE_INT, 64, 1};
    case DT::kU8: return {MOE_EP_DTYPE_UINT, 8, 1};
  }
  return {0, 0, 0};
}

Tensor::Tensor(const void* data, DT dt, std::vector<int64_t> dims, int device_type,
               int device_id) {
  for (size_t i = 0; i < dims.size() && i < 3; i++) shape[i] = dims[i];
  t.data = const_cast<void*>(data);
  t.device = {device_type, device_id};
  t.ndim = static_cast<int32_t>(dims.size());
  t.dtype = dtype_of(dt);
  t.shape = shape;
  t.strides = nullptr;
  t.byte_offset = 0;
}

}  // namespace moe_ep_test
