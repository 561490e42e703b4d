// worker_abi.cc: params structs from an older engine. An engine built
// against the v1 minimum (fields after it absent, the bytes there garbage)
// gets defaults for the absent fields and the same results, checked against
// the oracle; a struct_size below the minimum is INVALID_ARGUMENT naming
// struct_size, and the group stays usable (the refused call is then made
// again in full on the same handle and checked).
#include <cstddef>
#include <string>

#include "tests/host/ll_call.h"
#include "tests/host/worker_common.h"

namespace moe_ep_test {
namespace {

// The v1 minimum of each params struct in low-latency mode: up to the last
// field the first v1 header had that LL needs (prepare: stream; dispatch:
// recv_count; combine: stream, its last field).
constexpr size_t kPrepareMin =
    offsetof(moe_ep_prepare_params_t, stream) + sizeof(void*);
constexpr size_t kDispatchMin =
    offsetof(moe_ep_dispatch_params_t, recv_count) + sizeof(moe_ep_tensor_t*);
constexpr size_t kCombineMin =
    offsetof(moe_ep_combine_params_t, stream) + sizeof(void*);

// One round trip with every params struct at its v1 minimum.
void minimum_sizes_match_oracle(Ctx& c, const moe_ep_oracle::Problem& p, uint64_t seed) {
  LlCall call(c, p, seed);
  call.set_struct_sizes(kPrepareMin, kDispatchMin, kCombineMin);
  if (call.prepare() != MOE_EP_OK) return;
  if (!expect_status(c, seed, "dispatch at the v1 minimum struct_size", call.dispatch(0, nullptr),
                     MOE_EP_OK)) {
    return;
  }
  call.check_dispatch();
  call.make_y();
  if (!expect_status(c, seed, "combine at the v1 minimum struct_size", call.combine(0, nullptr),
                     MOE_EP_OK)) {
    return;
  }
  call.check_combine();
}

// Each entry refused one byte short of its minimum; the call is then made
// in full and the round trip checked, on the same group and handle.
void below_minimum_refused(Ctx& c, const moe_ep_oracle::Problem& p, uint64_t seed) {
  LlCall call(c, p, seed);
  moe_ep_handle_t* none = nullptr;
  {
    moe_ep_prepare_params_t pp = MOE_EP_INIT(moe_ep_prepare_params_t);
    pp.struct_size = kPrepareMin - 1;
    expect_status(c, seed, "prepare one byte below the v1 minimum",
                  c.api->prepare(c.group, &pp, &none), MOE_EP_ERR_INVALID_ARGUMENT,
                  "struct_size");
    if (none != nullptr) fail(c, seed, "refused prepare", "returned a handle");
  }
  call.set_struct_sizes(0, kDispatchMin - 1, kCombineMin - 1);
  if (call.prepare() != MOE_EP_OK) return;
  moe_ep_hook_t* hook = nullptr;
  expect_status(c, seed, "dispatch one byte below the v1 minimum",
                call.dispatch(MOE_EP_FLAG_DEFER_RECV, &hook), MOE_EP_ERR_INVALID_ARGUMENT,
                "struct_size");
  if (hook != nullptr) fail(c, seed, "refused dispatch", "returned a hook");
  call.set_struct_sizes(0, 0, kCombineMin - 1);
  if (!expect_status(c, seed, "dispatch in full after the refusal", call.dispatch(0, nullptr),
                     MOE_EP_OK)) {
    return;
  }
  call.check_dispatch();
  call.make_y();
  expect_status(c, seed, "combine one byte below the v1 minimum", call.combine(0, nullptr),
                MOE_EP_ERR_INVALID_ARGUMENT, "struct_size");
  call.set_struct_sizes(0, 0, 0);
  if (!expect_status(c, seed, "combine in full after the refusal", call.combine(0, nullptr),
                     MOE_EP_OK)) {
    return;
  }
  call.check_combine();
}

}  // namespace

void run_abi_sizes(Ctx& c) {
  using moe_ep_oracle::Generator;
  if (c.opt.ht) {
    // HT dispatch needs num_recv_tokens, its last field: its minimum is
    // the full struct, so there is nothing older to pass.
    fail(c, 0, "abi scenario", "runs in low-latency mode only");
    return;
  }
  for (auto& layer : c.opt.layers) {
    auto p = problem_for(c, layer.first, layer.second, Generator::kUniform);
    minimum_sizes_match_oracle(c, p, 61);
    below_minimum_refused(c, p, 62);
    ll_roundtrip(c, problem_for(c, layer.first, layer.second, Generator::kMasked), 63, true);
  }
}

}  // namespace moe_ep_test
