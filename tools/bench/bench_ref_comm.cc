// bench_ref_comm.cc: see bench_ref_comm.h.
#include "tools/bench/bench_ref_comm.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "absl/flags/flag.h"
#include "tools/bench/bench_case.h"
#include "tools/bench/bench_flags.h"
#include "tools/bench/bench_util.h"

namespace mep_bench {

std::string NcclIdPath() {
  const char* addr = getenv("MOE_EP_BOOTSTRAP_ADDRESS");
  if (addr == nullptr || strchr(addr, ':') == nullptr) {
    Die("MOE_EP_BOOTSTRAP_ADDRESS is unset or has no ':port' (start the bench with moe_ep_run)");
  }
  const char* port = strrchr(addr, ':') + 1;
  for (const char* c = port; *c; c++) {
    if (*c < '0' || *c > '9') Die("MOE_EP_BOOTSTRAP_ADDRESS='%s': port is not a number", addr);
  }
  return std::string("/tmp/moe_ep_bench_ncclid_") + port;
}

ncclUniqueId ShareNcclId(int rank, int world) {
  ncclUniqueId id;
  if (world == 1) {
    NCCL_CHECK(ncclGetUniqueId(&id));
    return id;
  }
  std::string path = NcclIdPath();
  const char* tok = getenv("MOE_EP_JOB_TOKEN");
  std::string token = tok ? tok : "";
  if (token.size() > 200) token.resize(200);
  size_t bytes = token.size() + 1 + sizeof(id.internal);
  if (rank == 0) {
    NCCL_CHECK(ncclGetUniqueId(&id));
    std::string tmp = path + ".tmp." + std::to_string(getpid());
    int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) Die("cannot create %s: %s", tmp.c_str(), strerror(errno));
    std::string buf = token + "\n" + std::string(id.internal, sizeof(id.internal));
    if (write(fd, buf.data(), buf.size()) != static_cast<ssize_t>(buf.size()) || fsync(fd) != 0) {
      Die("cannot write %s: %s", tmp.c_str(), strerror(errno));
    }
    if (close(fd) != 0) Die("cannot close %s: %s", tmp.c_str(), strerror(errno));
    if (rename(tmp.c_str(), path.c_str()) != 0) {
      Die("cannot rename %s to %s: %s", tmp.c_str(), path.c_str(), strerror(errno));
    }
    return id;
  }
  double deadline = NowS() + absl::GetFlag(FLAGS_id_wait_s);
  for (;;) {
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      std::string buf(bytes + 1, '\0');
      ssize_t n = read(fd, &buf[0], buf.size());
      close(fd);
      if (n == static_cast<ssize_t>(bytes) && buf.compare(0, token.size() + 1, token + "\n") == 0) {
        memcpy(id.internal, buf.data() + token.size() + 1, sizeof(id.internal));
        return id;
      }
    }
    if (NowS() > deadline) {
      Die("no NCCL id from rank 0 in %s after %d s (--id_wait_s)", path.c_str(),
          absl::GetFlag(FLAGS_id_wait_s));
    }
    usleep(10000);
  }
}

void Ref::Barrier() {
  NCCL_CHECK(ncclAllReduce(barrier_buf, barrier_buf, 1, ncclInt32, ncclSum, comm, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
}

std::vector<double> Ref::Gather(const std::vector<double>& mine) {
  CUDA_CHECK(cudaMemcpyAsync(gather_buf + static_cast<size_t>(g_rank) * kNumStats, mine.data(),
                             kNumStats * sizeof(double), cudaMemcpyHostToDevice, stream));
  NCCL_CHECK(ncclAllGather(gather_buf + static_cast<size_t>(g_rank) * kNumStats, gather_buf,
                           kNumStats, ncclFloat64, comm, stream));
  std::vector<double> all(static_cast<size_t>(world) * kNumStats);
  CUDA_CHECK(cudaMemcpyAsync(all.data(), gather_buf, all.size() * sizeof(double),
                             cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  return all;
}

std::vector<std::string> Ref::GatherText(const std::string& mine) {
  const size_t kLen = 256;
  char* buf = nullptr;
  CUDA_CHECK(cudaMalloc(&buf, kLen * world));
  std::string padded = mine.substr(0, kLen - 1);
  padded.resize(kLen, '\0');
  CUDA_CHECK(cudaMemcpyAsync(buf + kLen * g_rank, padded.data(), kLen, cudaMemcpyHostToDevice,
                             stream));
  NCCL_CHECK(ncclAllGather(buf + kLen * g_rank, buf, kLen, ncclInt8, comm, stream));
  std::vector<char> host(kLen * world);
  CUDA_CHECK(cudaMemcpyAsync(host.data(), buf, host.size(), cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  CUDA_CHECK(cudaFree(buf));
  std::vector<std::string> out;
  for (int r = 0; r < world; r++) out.emplace_back(host.data() + kLen * r);
  return out;
}

}  // namespace mep_bench
