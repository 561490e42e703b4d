// ll_call.h: one LL layer call's buffers and steps, checked against the
// oracle. Steps are separate so the hook scenarios can interleave two calls.
#ifndef MOE_EP_TESTS_HOST_LL_CALL_H_
#define MOE_EP_TESTS_HOST_LL_CALL_H_

#include <memory>
#include <vector>

#include "tests/common/mirror.h"
#include "tests/common/plugin_api.h"
#include "tests/host/worker_common.h"

namespace moe_ep_test {

class LlCall {
 public:
  LlCall(Ctx& c, const moe_ep_oracle::Problem& p, uint64_t seed);
  ~LlCall();
  // prepare with all three layout outputs; check = false leaves them to
  // check_prepare (a prepare captured in a CUDA graph cannot wait).
  moe_ep_status_t prepare(bool check = true);
  // The same call, its status returned unjudged (a refusal expected).
  moe_ep_status_t prepare_status();
  void check_prepare();  // the layout outputs against the oracle
  moe_ep_status_t dispatch(uint32_t flags, moe_ep_hook_t** hook);
  void check_dispatch();
  void check_dispatch_quietly() { m_cnt_.download(); }  // only waits for the device
  void make_y();  // the expert stand-in on the rows received
  moe_ep_status_t combine(uint32_t flags, moe_ep_hook_t** hook);
  // Combine passing a weights tensor other than the one dispatch carried
  // (must be refused when dispatch carried weights).
  moe_ep_status_t combine_with_other_weights(uint32_t flags, moe_ep_hook_t** hook);
  void set_weights_at_dispatch(bool on) { weights_at_dispatch_ = on; }
  void check_combine();
  moe_ep_handle_t* handle() { return h_; }
  // The oracle's receive of this rank (slot order, counts).
  const moe_ep_oracle::LlDispatchExpected& expected() const { return want_; }
  // The caller frees the handle from now on (from any thread).
  moe_ep_handle_t* release_handle() {
    moe_ep_handle_t* h = h_;
    h_ = nullptr;
    return h;
  }
  void set_stream(void* stream) { stream_ = stream; }
  // New inputs (same token count) into the same buffers, outputs poisoned
  // again: what a replayed CUDA graph reads and must overwrite.
  void reseed(uint64_t seed);
  // Overwrites this rank's topk_idx[0][0] with `value` in the copy the
  // plugin reads (the oracle's expectation is not updated: only the
  // routing-notice scenario uses it). False when the rank has no tokens.
  bool corrupt_first_slot(int64_t value);
  // Names `expert` in every slot of every token of rank `source` (in the
  // copy the plugin reads when `source` is this rank; routing-notice
  // scenario). Whether that is more slots than max_tokens_per_rank, the
  // most one expert takes from one source.
  bool repeat_expert_everywhere(int source, int64_t expert);
  // A deferred dispatch whose hook is freed unrun (its receive abandoned);
  // false when the dispatch did not return OK (reported as `what`).
  bool dispatch_abandoned(const char* what);
  uint64_t seed() const { return seed_; }
  // Pass prepare / dispatch / combine params with these struct_size values
  // (0: the full size), the bytes past them garbage, as an engine built
  // against an older header would. A prepare short of its HT outputs must
  // leave them unwritten (check_prepare then checks exactly that).
  void set_struct_sizes(size_t prepare, size_t dispatch, size_t combine) {
    prepare_size_ = prepare;
    dispatch_size_ = dispatch;
    combine_size_ = combine;
  }

 private:
  Ctx& c_;
  moe_ep_oracle::Problem p_;
  uint64_t seed_;
  int el_, slots_;
  std::vector<moe_ep_oracle::RankInputs> all_;
  moe_ep_oracle::LlDispatchExpected want_;
  std::vector<int32_t> topk32_;
  bool idx32_;
  std::vector<uint8_t> recv_x_, recv_scales_;
  std::vector<int32_t> recv_count_, per_rank_, per_expert_;
  std::vector<uint8_t> in_rank_;
  std::vector<uint16_t> y_, out_;
  Tensor t_topk_, t_x_, t_recv_x_, t_scales_, t_count_, t_y_, t_w_, t_out_;
  Tensor t_per_rank_, t_per_expert_, t_in_rank_;
  bool gpu_;
  Mirror m_topk_, m_x_, m_rx_, m_sc_, m_cnt_, m_y_, m_w_, m_out_;
  Mirror m_per_rank_, m_per_expert_, m_in_rank_;
  moe_ep_handle_t* h_ = nullptr;
  void* stream_ = nullptr;
  bool weights_at_dispatch_;
  size_t prepare_size_ = 0, dispatch_size_ = 0, combine_size_ = 0;
  void poison_outputs();
  void check_prepare_outputs_unwritten();
  moe_ep_status_t combine_with(moe_ep_tensor_t* weights, uint32_t flags, moe_ep_hook_t** hook);
};

}  // namespace moe_ep_test

#endif  // MOE_EP_TESTS_HOST_LL_CALL_H_
