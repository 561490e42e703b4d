// ht_world.h: what the HT world tests share (ht_world_test: one call at a
// time; ht_world_overlap_test: calls free-running across ranks): a case, a
// group of R ranks on one GPU (one_gpu_world.h) with each rank's outputs,
// one layer call's inputs and expectations from the oracle, the kernels'
// argument blocks, and the checks of every rank's outputs against the
// oracle, bit for bit.
#ifndef MEP_TESTS_GPU_HT_WORLD_H_
#define MEP_TESTS_GPU_HT_WORLD_H_

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "kernels/ht/ht.h"
#include "tests/gpu/one_gpu_world.h"
#include "tests/oracle/oracle.h"

namespace ht_world {

namespace o = moe_ep_oracle;

struct Case {
  const char *name;
  int world, node_ranks, transport;  // node_ranks 0: LSA
  int experts, hidden, top_k, max_tokens;
  o::Generator gen;
  bool fp8;
  o::ScaleFormat scales;
  int num_sms;  // per rank
  bool pad;     // worst-case rows past N_recv
  // GIN-emulated with ranks_per_node set: combine sums per node (on the
  // relays when nodes have 2 or more ranks), then across nodes.
  bool sum_nodes = false;
  // Nonzero: odd calls run with this many SMs (another channel count, as
  // after set_num_sms), even calls with num_sms.
  int later_sms = 0;
};

std::ostream &operator<<(std::ostream &os, const Case &c);

constexpr int kLsa = MEP_HT_TRANSPORT_LSA, kEmu = MEP_HT_TRANSPORT_GIN_EMULATED;

// One rank's kernel context and the outputs of a call.
struct RankIo {
  mep_ht_ctx_t ctx = {};
  void *recv_x = nullptr, *recv_scales = nullptr, *recv_idx = nullptr,
       *recv_w = nullptr;
  int32_t *recv_count = nullptr;
  int64_t *num_recv = nullptr;
  void *out = nullptr;
};

// The oracle's description of case c's layer call.
o::Problem ProblemOf(const Case &c);
// 32-bit scale words per fp8 row (0 for bf16).
int ScaleWords(const Case &c);
// Rows of the receive buffers: world * max_tokens.
inline int64_t Capacity(const Case &c) {
  return static_cast<int64_t>(c.world) * c.max_tokens;
}

// A group of c.world ranks on this GPU with every rank's outputs allocated
// for c's capacities.
struct HtGroup {
  std::unique_ptr<mep_world::World> world;
  mep_world::Dev dev;
  std::vector<RankIo> io;
};

// "" or why the group could not be made.
std::string MakeGroup(const Case &c, int timeout_ms, HtGroup *g);
// Allocates io's outputs (not its context) for c's capacities from dev.
// "" or what failed.
std::string AllocOutputs(const Case &c, mep_world::Dev *dev, RankIo *io);

// One layer call of case c on the host: every rank's inputs, each rank's
// expected dispatch and its combine partials (of random sign and wide
// magnitude, so that a sum in another order than the documented one shows).
struct CallData {
  uint64_t seed = 0;
  int set = 0;  // the buffer set the call uses
  std::vector<o::RankInputs> all;
  std::vector<o::HtDispatchExpected> want;
  std::vector<std::vector<uint16_t>> ys;
};
CallData MakeCall(const Case &c, const o::Problem &p, int call);

// Rank r's argument blocks for call d: inputs uploaded into dev, outputs
// io's. The combine's y has N_recv rows, padded to the capacity with NaN
// (which must never be read) in worst-case cases.
mep_ht_dispatch_args_t DispatchArgs(const Case &c, const o::Problem &p,
                                    const CallData &d, int r,
                                    const RankIo &io, mep_world::Dev *dev);
mep_ht_combine_args_t CombineArgs(const Case &c, const CallData &d, int r,
                                  const mep_ht_dispatch_args_t &da,
                                  const RankIo &io, mep_world::Dev *dev);

// "" or the first difference of rank r's dispatch outputs (in io) from the
// oracle's for call d.
std::string CheckDispatch(const Case &c, const CallData &d, int r,
                          const RankIo &io);
// "" or the difference of rank r's combined rows from the oracle's; adds to
// *order_matters the values where summing per node differs from one
// ascending sum (only with nodes of several ranks).
std::string CheckCombine(const Case &c, const o::Problem &p, const CallData &d,
                         int r, const RankIo &io, int64_t *order_matters);

// Over a network transport, the rows each rank has put into its ring at
// every rank of another node (the sender's ring positions, summed over
// channels) must be what hierarchical forwarding promises: to the rank at
// its own index there (its relay), one row per token with an expert
// anywhere on that node; to every other rank there, none. `want` holds the
// running totals [source * R + destination] of all calls so far.
void AddNetworkRows(const Case &c, const o::Problem &p,
                    const std::vector<o::RankInputs> &all,
                    std::vector<int64_t> *want);
std::string CheckNetworkRows(const Case &c, const HtGroup &g,
                             const std::vector<int64_t> &want);
// After a combine summed on the relays, each relay has put back one f32 row
// (two ring slots) per row its network ring brought in from that source.
std::string CheckRelayedCombineRows(const Case &c, const HtGroup &g,
                                    const std::vector<int64_t> &want);

}  // namespace ht_world

#endif  // MEP_TESTS_GPU_HT_WORLD_H_
