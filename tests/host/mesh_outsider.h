// mesh_outsider.h: a UCX process of its own (context, worker, endpoint)
// that sends active messages with the host mesh's id to a worker address,
// as a process outside the group that reached the mesh's port would: what
// the host mesh's stranger and network-reader tests send with.
#ifndef MOE_EP_TESTS_HOST_MESH_OUTSIDER_H_
#define MOE_EP_TESTS_HOST_MESH_OUTSIDER_H_

#include <time.h>

#include <cstdint>
#include <string>

#include <ucp/api/ucp.h>

#include "runtime/host/host_mesh_impl.h"
#include "tests/host/mesh_rank.h"

namespace moe_ep_test {

class MeshOutsider {
 public:
  explicit MeshOutsider(int timeout_ms) : timeout_ms_(timeout_ms) {}
  ~MeshOutsider() {
    if (ep_ != nullptr) {
      ucp_request_param_t p = {};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = UCP_EP_CLOSE_FLAG_FORCE;
      void *req = ucp_ep_close_nbx(ep_, &p);
      if (UCS_PTR_IS_PTR(req)) {
        Progress(req);
        ucp_request_free(req);
      }
    }
    if (worker_ != nullptr) ucp_worker_destroy(worker_);
    if (context_ != nullptr) ucp_cleanup(context_);
  }
  MeshOutsider(const MeshOutsider &) = delete;
  MeshOutsider &operator=(const MeshOutsider &) = delete;

  // "" or what failed.
  std::string Open(const void *address) {
    ucp_params_t cp = {};
    cp.field_mask = UCP_PARAM_FIELD_FEATURES;
    cp.features = UCP_FEATURE_AM;
    if (ucp_init(&cp, nullptr, &context_) != UCS_OK) return "ucp_init failed";
    ucp_worker_params_t wp = {};
    if (ucp_worker_create(context_, &wp, &worker_) != UCS_OK) return "ucp_worker_create failed";
    ucp_ep_params_t ep = {};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    ep.address = static_cast<const ucp_address_t *>(address);
    if (ucp_ep_create(worker_, &ep, &ep_) != UCS_OK) return "ucp_ep_create failed";
    return "";
  }

  // One active message with the mesh's id; the send's completion status.
  ucs_status_t Send(const void *header, size_t header_len, const void *data, size_t len,
                    bool rendezvous) {
    ucp_request_param_t p = {};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = rendezvous ? UCP_AM_SEND_FLAG_RNDV : UCP_AM_SEND_FLAG_EAGER;
    void *req = ucp_am_send_nbx(ep_, MEP_HOST_AM_ID, header, header_len, data, len, &p);
    if (req == nullptr) return UCS_OK;
    if (UCS_PTR_IS_ERR(req)) return UCS_PTR_STATUS(req);
    const ucs_status_t st = Progress(req);
    ucp_request_free(req);
    return st;
  }
  // With a header as the mesh lays it out.
  ucs_status_t Send(const mep_host_msg_t &h, const void *data, size_t len,
                    bool rendezvous = false) {
    return Send(&h, sizeof(h), data, len, rendezvous);
  }

 private:
  ucs_status_t Progress(void *req) {
    const int64_t deadline = MonoMs() + timeout_ms_;
    ucs_status_t st;
    while ((st = ucp_request_check_status(req)) == UCS_INPROGRESS && MonoMs() < deadline)
      ucp_worker_progress(worker_);
    return st;
  }

  int timeout_ms_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_ep_h ep_ = nullptr;
};

}  // namespace moe_ep_test

#endif  // MOE_EP_TESTS_HOST_MESH_OUTSIDER_H_
