// bench_ref_comm.h: the bench's own NCCL communicator: it carries the
// all-to-all reference, the barriers before each timed loop, and the
// gathering of every rank's numbers and descriptions to rank 0.
#ifndef MOE_EP_TOOLS_BENCH_BENCH_REF_COMM_H_
#define MOE_EP_TOOLS_BENCH_BENCH_REF_COMM_H_

#include <cuda_runtime.h>
#include <nccl.h>

#include <string>
#include <vector>

namespace mep_bench {

// Rank 0's ncclUniqueId travels through a file named after the bootstrap
// port; the job token inside it tells this job's file from a stale one.
ncclUniqueId ShareNcclId(int rank, int world);
// The file ShareNcclId used (rank 0 removes it once every rank joined).
std::string NcclIdPath();

struct Ref {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  int* barrier_buf = nullptr;
  double* gather_buf = nullptr;  // [world][kNumStats]
  int world = 1;

  void Barrier();
  std::vector<double> Gather(const std::vector<double>& mine);  // [world][kNumStats]
  std::vector<std::string> GatherText(const std::string& mine);
};

}  // namespace mep_bench

#endif  // MOE_EP_TOOLS_BENCH_BENCH_REF_COMM_H_
