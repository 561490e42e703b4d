// worker_adopt.cc: the engine's own NCCL communicator, for group_create to
// adopt (--adopt_comm), as an engine that already runs NCCL passes its
// communicator in moe_ep_group_params_t.nccl_comm. NCCL is opened at run
// time by the plugin's rule (MOE_EP_NCCL_LIBRARY, else libnccl.so.2), so
// both resolve to the same loaded library and the worker needs no NCCL to
// build or to run without this option. The communicator has run one
// all-reduce before group_create, as an engine's has: NCCL's kernels are
// loaded and its lazy setup is done.
#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "tests/host/worker_common.h"

namespace moe_ep_test {

namespace {

struct Nccl {
  ncclResult_t (*get_unique_id)(ncclUniqueId*) = nullptr;
  ncclResult_t (*init_rank)(ncclComm_t*, int, ncclUniqueId, int) = nullptr;
  ncclResult_t (*all_reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                             cudaStream_t) = nullptr;
  ncclResult_t (*destroy)(ncclComm_t) = nullptr;
  const char* (*error_string)(ncclResult_t) = nullptr;
};

bool open_nccl(Ctx& c, Nccl* n) {
  const char* path = std::getenv("MOE_EP_NCCL_LIBRARY");
  if (path == nullptr || *path == '\0') path = "libnccl.so.2";
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);  // kept open: the plugin shares it
  if (lib == nullptr) {
    const char* why = dlerror();
    fail(c, 0, "adopt_comm", std::string("cannot load NCCL from '") + path + "': " +
                                 (why ? why : "unknown error"));
    return false;
  }
  *reinterpret_cast<void**>(&n->get_unique_id) = dlsym(lib, "ncclGetUniqueId");
  *reinterpret_cast<void**>(&n->init_rank) = dlsym(lib, "ncclCommInitRank");
  *reinterpret_cast<void**>(&n->all_reduce) = dlsym(lib, "ncclAllReduce");
  *reinterpret_cast<void**>(&n->destroy) = dlsym(lib, "ncclCommDestroy");
  *reinterpret_cast<void**>(&n->error_string) = dlsym(lib, "ncclGetErrorString");
  if (!n->get_unique_id || !n->init_rank || !n->all_reduce || !n->destroy || !n->error_string) {
    fail(c, 0, "adopt_comm", std::string("'") + path + "' lacks an NCCL entry point");
    return false;
  }
  return true;
}

bool nccl_ok(Ctx& c, const Nccl& n, ncclResult_t r, const char* call) {
  if (r == ncclSuccess) return true;
  fail(c, 0, "adopt_comm", std::string(call) + ": " + n.error_string(r));
  return false;
}

// Rank 0's unique id through a file under barrier_dir (written whole, then
// renamed into place); the others poll for it, 120 s at most.
bool share_id(Ctx& c, const Nccl& n, ncclUniqueId* id) {
  if (c.opt.barrier_dir.empty()) {
    fail(c, 0, "adopt_comm", "--barrier_dir is not set: the ranks share NCCL's id there");
    return false;
  }
  const std::string path = c.opt.barrier_dir + "/nccl_id";
  if (c.rank == 0) {
    if (!nccl_ok(c, n, n.get_unique_id(id), "ncclGetUniqueId")) return false;
    const std::string tmp = path + ".tmp";
    const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    const bool ok = fd >= 0 && write(fd, id->internal, sizeof id->internal) ==
                                   static_cast<ssize_t>(sizeof id->internal);
    if (fd >= 0) close(fd);
    if (!ok || rename(tmp.c_str(), path.c_str()) != 0) {
      fail(c, 0, "adopt_comm", "cannot write NCCL's id to " + path);
      return false;
    }
    return true;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  for (;;) {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      const ssize_t got = read(fd, id->internal, sizeof id->internal);
      close(fd);
      if (got == static_cast<ssize_t>(sizeof id->internal)) return true;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      fail(c, 0, "adopt_comm", "no NCCL id from rank 0 in " + path + " within 120 s");
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

Nccl nccl;  // opened by adopt_comm_create

}  // namespace

void* adopt_comm_create(Ctx& c) {
  const char* r = std::getenv("MOE_EP_RANK");
  const char* w = std::getenv("MOE_EP_WORLD_SIZE");
  if (r == nullptr || w == nullptr) {
    fail(c, 0, "adopt_comm", "MOE_EP_RANK and MOE_EP_WORLD_SIZE must be set (moe_ep_run)");
    return nullptr;
  }
  c.rank = std::atoi(r);
  const int world = std::atoi(w);
  Nccl& n = nccl;  // opened here, used again by adopt_comm_destroy
  ncclUniqueId id;
  ncclComm_t comm = nullptr;
  if (!open_nccl(c, &n) || !share_id(c, n, &id) ||
      !nccl_ok(c, n, n.init_rank(&comm, world, id, c.rank), "ncclCommInitRank"))
    return nullptr;
  // One all-reduce, as an engine's communicator has run before it is lent.
  cudaStream_t s = nullptr;
  int* buf = nullptr;
  bool ok = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess &&
            cudaMalloc(&buf, sizeof(int)) == cudaSuccess;
  ok = ok && nccl_ok(c, n, n.all_reduce(buf, buf, 1, ncclInt32, ncclSum, comm, s), "ncclAllReduce");
  ok = ok && cudaStreamSynchronize(s) == cudaSuccess;
  if (buf != nullptr) cudaFree(buf);
  if (s != nullptr) cudaStreamDestroy(s);
  if (!ok) {
    fail(c, 0, "adopt_comm", "the communicator's first all-reduce did not complete");
    n.destroy(comm);
    return nullptr;
  }
  std::fprintf(stderr, "rank %d: group_create adopts this process's NCCL communicator\n", c.rank);
  return comm;
}

void adopt_comm_destroy(Ctx& c, void* comm) {
  if (comm == nullptr) return;  // else nccl was opened and resolved
  nccl_ok(c, nccl, nccl.destroy(static_cast<ncclComm_t>(comm)), "ncclCommDestroy");
}

}  // namespace moe_ep_test
