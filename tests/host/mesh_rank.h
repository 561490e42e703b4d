// mesh_rank.h: one rank of a host-mesh test that runs every rank in one
// process: its bootstrap and mesh, made on a thread of its own since both
// are collective.
#ifndef MEP_TESTS_HOST_MESH_RANK_H_
#define MEP_TESTS_HOST_MESH_RANK_H_

#include <time.h>

#include <cstdint>
#include <string>

#include "runtime/bootstrap.h"
#include "runtime/error.h"
#include "runtime/host/host_mesh.h"

namespace moe_ep_test {

inline int64_t MonoMs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

struct MeshRank {
  int rank = 0;
  mep_bootstrap_t *bs = nullptr;
  mep_host_mesh_t *mesh = nullptr;
  moe_ep_status_t st = MOE_EP_OK;
  std::string msg;

  // Bootstrap and mesh both bounded by timeout_ms.
  void Create(const std::string &address, int world, const char *token, size_t region,
              int timeout_ms) {
    mep_bootstrap_params_t p = {};
    p.rank = rank;
    p.world_size = world;
    p.address = address.c_str();
    p.timeout_ms = timeout_ms;
    p.token = token;
    st = mep_bootstrap_create(&p, &bs);
    if (st == MOE_EP_OK) st = mep_host_mesh_create(bs, region, timeout_ms, &mesh);
    if (st != MOE_EP_OK) msg = mep_last_error();
  }
};

}  // namespace moe_ep_test

#endif  // MEP_TESTS_HOST_MESH_RANK_H_
