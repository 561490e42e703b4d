// ht_call.h: one HT layer call's buffers and steps, checked against the
// oracle: bf16 or pre-quantised fp8 rows (p.dispatch_dtype), exact or
// worst-case sized receive tensors, and repeated dispatches on one handle
// (DeepEP's cached layout). Host memory on the host backend, device
// twins of the same buffers (Mirror) on the nccl backend.
#ifndef MOE_EP_TESTS_HOST_HT_CALL_H_
#define MOE_EP_TESTS_HOST_HT_CALL_H_

#include <functional>
#include <memory>
#include <vector>

#include "tests/common/mirror.h"
#include "tests/common/plugin_api.h"
#include "tests/host/worker_common.h"

namespace moe_ep_test {

class HtCall {
 public:
  HtCall(Ctx& c, const moe_ep_oracle::Problem& p, uint64_t seed);
  ~HtCall();
  HtCall(const HtCall&) = delete;
  HtCall& operator=(const HtCall&) = delete;
  // prepare, checking num_tokens_per_rank against the oracle; a failure is
  // reported unless expect_ok is false (the caller checks the status).
  moe_ep_status_t prepare(bool expect_ok = true);
  // Another x of `hidden` channels for the same routing (the next dispatch
  // on this handle, as DeepEP's cached dispatch sends a second tensor of the
  // same tokens): the seed's inputs at that hidden, each value negated,
  // halved and shifted, so no row repeats the previous dispatch's.
  void set_x_variant(int hidden);
  // Before prepare: every rank's first routed slot becomes -1 in the
  // oracle's inputs, and this rank hands the library `value` there instead
  // (out of range: the nccl kernels send it as -1 and note it). False
  // when this rank routes nothing; *t and *k: the slot.
  bool route_out_of_range(int64_t value, int64_t* t, int64_t* k);
  // Receive tensors of `rows` rows (+1 poisoned spare row the library must
  // not touch); num_recv_tokens is passed only when `count_out`. A deferred
  // dispatch runs its hook at once, unless `hook_out` takes it. `tweak` may
  // break the params first (bad input: then no hook may come back).
  moe_ep_status_t dispatch(uint32_t flags, int64_t rows, bool count_out = true,
                           const std::function<void(moe_ep_dispatch_params_t&)>& tweak = nullptr,
                           moe_ep_hook_t** hook_out = nullptr);
  // Builds (and uploads) the next dispatch's buffers of `rows` receive rows
  // now: an upload waits for the whole device, which a caller holding a
  // stream may not want inside dispatch.
  void stage(int64_t rows);
  void check_dispatch();
  // y: the oracle's partials of this rank's rows, in `rows` rows (rows past
  // N_recv are garbage the library must ignore). A deferred combine runs
  // its hook at once, unless `hook_out` takes it.
  moe_ep_status_t combine(uint32_t flags, int64_t rows, moe_ep_hook_t** hook_out = nullptr);
  void check_combine();
  int64_t num_recv() const { return want_.num_recv; }
  void set_stream(void* stream) { stream_ = stream; }
  moe_ep_handle_t* handle() { return h_; }
  uint64_t seed() const { return seed_; }

 private:
  Ctx& c_;
  moe_ep_oracle::Problem p_;
  uint64_t seed_;
  std::vector<moe_ep_oracle::RankInputs> all_;
  moe_ep_oracle::HtDispatchExpected want_;
  moe_ep_oracle::HtFp8Input q_;  // this rank's pre-quantised x (fp8)
  std::vector<int64_t> topk_;    // what prepare was given: unchanged until combine
  moe_ep_handle_t* h_ = nullptr;
  // The last dispatch's receive buffers and what it was asked for.
  uint32_t flags_ = 0;
  int64_t rows_ = 0;
  bool count_out_ = true;
  int64_t n_recv_ = -1;
  // What one dispatch reads and writes: host buffers and, on the nccl
  // backend, their device twins. Replaced only when a dispatch is accepted,
  // so a refused call cannot disturb the buffers of one still pending.
  struct Buffers {
    std::vector<uint8_t> recv_x, recv_scales;
    std::vector<int32_t> recv_idx, recv_count;
    std::vector<float> recv_w;
    std::unique_ptr<Mirror> x, xs, w, rx, rs, ri, rw, rc;
  };
  std::unique_ptr<Buffers> buf_;
  std::vector<std::unique_ptr<Buffers>> refused_;
  std::unique_ptr<Buffers> staged_;  // stage()'s, for a dispatch of staged_rows_
  int64_t staged_rows_ = -1;
  std::unique_ptr<Buffers> make_buffers(int64_t rows);
  void* stream_ = nullptr;
  std::vector<uint16_t> out_, y_;
  // Device twins (nccl backend) of what the library reads and writes; a
  // hook may still use them after dispatch returns.
  bool gpu_;
  std::unique_ptr<Mirror> m_topk_, m_per_rank_, m_y_, m_out_;
  // A fresh twin of `bytes` host bytes at `host` (uploaded); its address.
  void* place(std::unique_ptr<Mirror>& m, const void* host, size_t bytes);
  int dev() const { return gpu_ ? MOE_EP_DEVICE_CUDA : MOE_EP_DEVICE_CPU; }
  moe_ep_status_t run(moe_ep_status_t st, moe_ep_hook_t* hook, uint32_t flags, const char* what);
};

}  // namespace moe_ep_test

#endif  // MOE_EP_TESTS_HOST_HT_CALL_H_
