// lsa_link_test.cc: the LSA link check's parts that need no GPU: the
// MOE_EP_LSA_LINK policy (its error names the variable, the value and the
// choices), a GPU's description, and the rules decided before NVML is
// asked (policies, another machine, the same GPU); a bus id no machine has
// is unknown whether or not NVML is present.
#include <string>

#include "gtest/gtest.h"

extern "C" {
#include "runtime/error.h"
#include "runtime/nccl/lsa_link.h"
}

namespace {

mep_lsa_gpu_t gpu(const char *host, const char *bus) {
  mep_lsa_gpu_t g{};
  snprintf(g.host, sizeof g.host, "%s", host);
  snprintf(g.bus, sizeof g.bus, "%s", bus);
  return g;
}

TEST(LsaLink, PolicyParsesItsThreeNames) {
  mep_lsa_link_policy_t p = MEP_LSA_LINK_ASSUME_PCIE;
  ASSERT_EQ(mep_lsa_link_policy_parse(nullptr, &p), MOE_EP_OK);
  EXPECT_EQ(p, MEP_LSA_LINK_DETECT);
  p = MEP_LSA_LINK_ASSUME_PCIE;
  ASSERT_EQ(mep_lsa_link_policy_parse("", &p), MOE_EP_OK);
  EXPECT_EQ(p, MEP_LSA_LINK_DETECT);
  ASSERT_EQ(mep_lsa_link_policy_parse("detect", &p), MOE_EP_OK);
  EXPECT_EQ(p, MEP_LSA_LINK_DETECT);
  ASSERT_EQ(mep_lsa_link_policy_parse("nvlink", &p), MOE_EP_OK);
  EXPECT_EQ(p, MEP_LSA_LINK_ASSUME_NVLINK);
  ASSERT_EQ(mep_lsa_link_policy_parse("pcie", &p), MOE_EP_OK);
  EXPECT_EQ(p, MEP_LSA_LINK_ASSUME_PCIE);
}

TEST(LsaLink, UnknownPolicyNamesVariableValueAndChoices) {
  mep_lsa_link_policy_t p = MEP_LSA_LINK_DETECT;
  ASSERT_EQ(mep_lsa_link_policy_parse("NVLink", &p), MOE_EP_ERR_INVALID_ARGUMENT);
  const std::string msg = mep_last_error();
  EXPECT_NE(msg.find("MOE_EP_LSA_LINK"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'NVLink'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("detect, nvlink or pcie"), std::string::npos) << msg;
  EXPECT_EQ(p, MEP_LSA_LINK_DETECT) << "a refused value must leave the policy as it was";
}

TEST(LsaLink, DescribeNamesThisMachineAndCopiesTheBus) {
  mep_lsa_gpu_t a, b;
  mep_lsa_gpu_describe("0000:3B:00.0", &a);
  mep_lsa_gpu_describe("0000:3C:00.0", &b);
  EXPECT_STRNE(a.host, "") << "neither the boot id nor the hostname was read";
  EXPECT_STREQ(a.host, b.host);
  EXPECT_STREQ(a.bus, "0000:3B:00.0");
  mep_lsa_gpu_describe(nullptr, &b);
  EXPECT_STREQ(b.bus, "");
}

TEST(LsaLink, PoliciesDecideWithoutAsking) {
  const mep_lsa_gpu_t a = gpu("m1", "0000:01:00.0"), b = gpu("m1", "0000:02:00.0");
  EXPECT_EQ(mep_lsa_link_between(&a, &b, MEP_LSA_LINK_ASSUME_NVLINK), MEP_LSA_LINK_NVLINK);
  EXPECT_EQ(mep_lsa_link_between(&a, &b, MEP_LSA_LINK_ASSUME_PCIE), MEP_LSA_LINK_PCIE);
  // even the same GPU: "pcie" is how the fallback is exercised on any machine
  EXPECT_EQ(mep_lsa_link_between(&a, &a, MEP_LSA_LINK_ASSUME_PCIE), MEP_LSA_LINK_PCIE);
}

TEST(LsaLink, DetectRulesBeforeNvml) {
  const mep_lsa_gpu_t a = gpu("m1", "0000:01:00.0");
  const mep_lsa_gpu_t other_machine = gpu("m2", "0000:01:00.0");
  const mep_lsa_gpu_t same_gpu = gpu("m1", "0000:01:00.0");
  const mep_lsa_gpu_t nameless = gpu("", "0000:02:00.0");
  // load/store between machines is multi-node NVLink
  EXPECT_EQ(mep_lsa_link_between(&a, &other_machine, MEP_LSA_LINK_DETECT), MEP_LSA_LINK_NVLINK);
  // ranks sharing one GPU: its own memory
  EXPECT_EQ(mep_lsa_link_between(&a, &same_gpu, MEP_LSA_LINK_DETECT), MEP_LSA_LINK_NVLINK);
  EXPECT_EQ(mep_lsa_link_between(&a, &nameless, MEP_LSA_LINK_DETECT), MEP_LSA_LINK_UNKNOWN);
}

TEST(LsaLink, BusIdsNoMachineHasAreUnknown) {
  const mep_lsa_gpu_t a = gpu("m1", "00FF:FE:1F.6"), b = gpu("m1", "00FF:FE:1F.7");
  EXPECT_EQ(mep_lsa_link_between(&a, &b, MEP_LSA_LINK_DETECT), MEP_LSA_LINK_UNKNOWN);
}

TEST(LsaLink, WorstFirstOrderAndNames) {
  // a team is worth its worst link: the ranks agree by a min-reduction
  EXPECT_LT(MEP_LSA_LINK_PCIE, MEP_LSA_LINK_UNKNOWN);
  EXPECT_LT(MEP_LSA_LINK_UNKNOWN, MEP_LSA_LINK_NVLINK);
  EXPECT_STREQ(mep_lsa_link_name(MEP_LSA_LINK_NVLINK), "NVLink");
  EXPECT_STREQ(mep_lsa_link_name(MEP_LSA_LINK_PCIE), "PCIe");
  EXPECT_STREQ(mep_lsa_link_name(MEP_LSA_LINK_UNKNOWN), "unknown");
}

}  // namespace
