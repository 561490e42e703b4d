// ll_world_check.h: what the LL one-GPU world tests share: a rank's
// receive and combine buffers, and the check of a rank's receive against
// the oracle that also makes the expert outputs y from the rows received.
#ifndef MEP_TESTS_GPU_LL_WORLD_CHECK_H_
#define MEP_TESTS_GPU_LL_WORLD_CHECK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/ll/ll.h"
#include "tests/gpu/one_gpu_world.h"
#include "tests/oracle/oracle.h"

namespace mep_world {

// One rank's context, receive buffers, handle storage and combine output.
struct RankBufs {
  mep_ll_ctx_t ctx = {};
  void *recv_x = nullptr, *recv_scales = nullptr, *y = nullptr, *out = nullptr;
  int32_t *recv_count = nullptr, *slot_src = nullptr, *src_count = nullptr;
  int32_t *src_tokens = nullptr;
  mep_ll_route_t *route = nullptr;
};

// The LL dims of problem p's shape, both buffer sets, over `transport`.
mep_ll_dims_t DimsFor(const moe_ep_oracle::Problem &p, int transport);

// Every rank of `w`: its context (PointAtRank, `transport`, `num_sms`, the
// kernels' bound from timeout_ms) and its buffers, sized for dims' rows of
// either dtype. "" or the first failure's sentence.
std::string MakeRanks(const World &w, const mep_ll_dims_t &dims, int transport,
                      int num_sms, int timeout_ms, Dev *dev,
                      std::vector<RankBufs> *rb);

// A second call's receive buffers, handle storage and combine output for
// b (its context untouched): a rank with two dispatches pending. False
// when an allocation failed.
bool AllocCallBuffers(const mep_ll_dims_t &dims, Dev *dev, RankBufs *b);

// Rank r's receive against the oracle (counts, slot sources, rows and
// scales bit for bit), then y from the rows as received
// (moe_ep_oracle::expert_fn_row), uploaded to b.y (cudaMemcpy from pageable
// memory: the caller orders the uploads before the ranks' streams use y)
// and indexed for the combine oracle by (source, token, k) in *y_of_slot.
// Fatal gtest failures name `where`.
void CheckReceiveMakeY(const moe_ep_oracle::Problem &p,
                       const std::vector<moe_ep_oracle::RankInputs> &all, int r,
                       const RankBufs &b, const std::string &where,
                       std::vector<uint16_t> *y,
                       std::vector<std::vector<const uint16_t *>> *y_of_slot);

// The handle storage and buffers of b in a dispatch's or a combine's
// arguments (the rest of the arguments untouched).
void UseBuffers(const RankBufs &b, mep_ll_dispatch_args_t *a);
void UseBuffers(const RankBufs &b, mep_ll_combine_args_t *a);

// One layer call of every rank: the inputs, the dispatch and combine
// arguments, and the expert outputs y made from each rank's receive.
struct Call {
  std::vector<moe_ep_oracle::RankInputs> all;
  std::vector<mep_ll_dispatch_args_t> da;
  std::vector<mep_ll_combine_args_t> ca;
  std::vector<std::vector<uint16_t>> y;
  std::vector<std::vector<const uint16_t *>> y_of_slot;
};

// Every rank's arguments for a dispatch (bf16 rows) on `set` and its
// combine on `comb_set`, their handle storage rb[r]'s (as the runtime keeps
// it per buffer set); the weights go with the dispatch, or with
// weights_at_dispatch false with the combine.
void MakeCall(const moe_ep_oracle::Problem &p, uint64_t seed, int set, int comb_set,
              const std::vector<RankBufs> &rb, Dev *dev, Call *c,
              bool weights_at_dispatch = true);

// Every rank's combine output (rb[s].out) against the oracle, bit for bit.
void CheckCombine(const moe_ep_oracle::Problem &p, const Call &c,
                  const std::vector<RankBufs> &rb, uint64_t seed);

}  // namespace mep_world

#endif  // MEP_TESTS_GPU_LL_WORLD_CHECK_H_
