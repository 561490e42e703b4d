// host_bytes_test.cc: the host backend's size hint (what group_info's
// bytes_allocated reports) counts every communication buffer a rank holds:
// the region the peers put into and the staging of one destination's rows
// (max_tokens_per_rank rows of the largest row), for both modes.
#include <gtest/gtest.h>

extern "C" {
#include "runtime/config.h"
#include "runtime/error.h"
#include "runtime/group.h"
#include "runtime/host/host_layout.h"
}

namespace {

TEST(HostBytes, HintIsTheRegionAndTheStaging) {
  for (int mode : {MOE_EP_MODE_LOW_LATENCY, MOE_EP_MODE_HIGH_THROUGHPUT}) {
    for (int world : {1, 2, 8}) {
      moe_ep_config_t cfg;
      mep_config_defaults(&cfg);
      cfg.backend = MOE_EP_BACKEND_HOST;
      cfg.mode = mode;
      cfg.num_experts = 64;
      cfg.hidden = 7168;
      cfg.top_k = 8;
      cfg.max_tokens_per_rank = mode == MOE_EP_MODE_LOW_LATENCY ? 128 : 4096;
      uint64_t hint = 0;
      ASSERT_EQ(mep_buffer_size_hint(&cfg, world, &hint), MOE_EP_OK) << mep_last_error();
      mep_host_layout_t l;
      mep_host_layout_init(&l, &cfg, world);
      const uint64_t staging = (uint64_t)cfg.max_tokens_per_rank * l.row_max;
      EXPECT_GT(staging, 0u);
      EXPECT_EQ(hint, mep_host_layout_bytes(&l) + staging) << "mode " << mode << " world " << world;
    }
  }
}

}  // namespace
