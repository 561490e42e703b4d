// ll_layout.cc: DeepEP's (src_info, layout_range) of an LL receive, counted
// from the oracle's slot list.
#include "tests/oracle/ll.h"

namespace moe_ep_oracle {

LlHandleLayout ll_handle_layout(const Problem& p, const LlDispatchExpected& d) {
  check_problem(p);
  const int L = d.num_local_experts, S = d.slots_per_expert;
  LlHandleLayout out;
  out.src_info.assign(static_cast<size_t>(L) * S, -1);
  out.layout_range.assign(static_cast<size_t>(L) * p.world, 0);
  for (int e = 0; e < L; ++e) {
    std::vector<int64_t> count(p.world, 0);
    for (int i = 0; i < d.recv_count[e]; ++i) {
      const LlSlot& sl = d.slots[d.row(e, i)];
      out.src_info[static_cast<size_t>(e) * S + i] = sl.src_token;
      count[sl.src_rank] += 1;
    }
    int64_t begin = 0;
    for (int s = 0; s < p.world; ++s) {
      out.layout_range[static_cast<size_t>(e) * p.world + s] = (begin << 32) | count[s];
      begin += count[s];
    }
  }
  return out;
}

}  // namespace moe_ep_oracle
