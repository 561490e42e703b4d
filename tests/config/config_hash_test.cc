// config_hash_test.cc: canonical text of the agreed keys, its FNV-1a hash,
// and describe_diff, which names the key two ranks disagree on.
#include <stdio.h>
#include <string.h>

#include <functional>
#include <string>
#include <vector>

#include "config_test_util.h"

namespace {

// Independent FNV-1a 64 so the test does not trust the library's.
uint64_t Fnv1a(const std::string &s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

std::string Canonical(const moe_ep_config_t &c) {
  char buf[2048];
  size_t n = mep_config_canonical(&c, buf, sizeof(buf));
  EXPECT_EQ(n, strlen(buf));
  return std::string(buf, n);
}

const char kDefaultCanonical[] =
    "backend=auto\n"
    "dispatch_dtype=bf16\n"
    "double_buffer=true\n"
    "fp8_scale=f32\n"
    "hidden=7168\n"
    "max_tokens_per_rank=128\n"
    "mode=low_latency\n"
    "num_experts=256\n"
    "ranks_per_node=0\n"
    "timeouts.kernel_ms=10000\n"
    "top_k=8\n"
    "transport=auto\n";

TEST(ConfigHash, DefaultCanonicalTextAndHash) {
  moe_ep_config_t c;
  mep_config_defaults(&c);
  EXPECT_EQ(Canonical(c), kDefaultCanonical);
  EXPECT_EQ(mep_config_hash(&c), Fnv1a(kDefaultCanonical));
}

TEST(ConfigHash, TruncatesAndTerminates) {
  moe_ep_config_t c;
  mep_config_defaults(&c);
  char small[20];
  memset(small, 'x', sizeof(small));
  size_t n = mep_config_canonical(&c, small, sizeof(small));
  EXPECT_EQ(n, sizeof(small) - 1);
  EXPECT_EQ(small[sizeof(small) - 1], '\0');
  EXPECT_EQ(std::string(small), std::string(kDefaultCanonical, 19));
  EXPECT_EQ(mep_config_canonical(&c, small, 0), 0u);
}

using ConfigHashYaml = ConfigTest;

TEST_F(ConfigHashYaml, EqualForEqualConfigsIgnoringLocalKeys) {
  ASSERT_EQ(Parse("moe_ep: {top_k: 4, hidden: 2048, log_level: debug}"),
            MOE_EP_OK);
  moe_ep_config_t a = *cfg_;
  // Different order, different log level and bootstrap: still agreed.
  ASSERT_EQ(Parse("moe_ep:\n  bootstrap: {address: 'x:9', timeout_ms: 5, "
                  "token_env: T}\n  hidden: 2048\n  top_k: 4\n"),
            MOE_EP_OK);
  moe_ep_config_t b = *cfg_;
  EXPECT_EQ(Canonical(a), Canonical(b));
  EXPECT_EQ(mep_config_hash(&a), mep_config_hash(&b));
  char diff[256];
  mep_config_describe_diff(Canonical(a).c_str(), Canonical(b).c_str(), diff,
                           sizeof(diff));
  EXPECT_STREQ(diff, "no difference");
}

struct Mutation {
  const char *key;
  std::function<void(moe_ep_config_t *)> apply;
  const char *diff;  // expected describe_diff(default, mutated)
};

TEST(ConfigHash, EveryAgreedKeyChangesHashAndIsNamed) {
  std::vector<Mutation> muts = {
      {"backend", [](moe_ep_config_t *c) { c->backend = MOE_EP_BACKEND_HOST; },
       "backend: auto vs host"},
      {"mode", [](moe_ep_config_t *c) { c->mode = MOE_EP_MODE_HIGH_THROUGHPUT; },
       "mode: low_latency vs high_throughput"},
      {"num_experts", [](moe_ep_config_t *c) { c->num_experts = 257; },
       "num_experts: 256 vs 257"},
      {"hidden", [](moe_ep_config_t *c) { c->hidden = 4096; },
       "hidden: 7168 vs 4096"},
      {"top_k", [](moe_ep_config_t *c) { c->top_k = 9; }, "top_k: 8 vs 9"},
      {"max_tokens_per_rank",
       [](moe_ep_config_t *c) { c->max_tokens_per_rank = 256; },
       "max_tokens_per_rank: 128 vs 256"},
      {"dispatch_dtype",
       [](moe_ep_config_t *c) { c->dispatch_dtype = MOE_EP_DISPATCH_FP8_E4M3; },
       "dispatch_dtype: bf16 vs fp8_e4m3"},
      {"fp8_scale",
       [](moe_ep_config_t *c) { c->fp8_scale = MOE_EP_FP8_SCALE_UE8M0_PACKED; },
       "fp8_scale: f32 vs ue8m0_packed"},
      {"double_buffer", [](moe_ep_config_t *c) { c->double_buffer = 0; },
       "double_buffer: true vs false"},
      {"transport",
       [](moe_ep_config_t *c) { c->transport = MOE_EP_TRANSPORT_GIN; },
       "transport: auto vs gin"},
      {"ranks_per_node", [](moe_ep_config_t *c) { c->ranks_per_node = 8; },
       "ranks_per_node: 0 vs 8"},
      {"timeouts.kernel_ms",
       [](moe_ep_config_t *c) { c->kernel_timeout_ms = 10001; },
       "timeouts.kernel_ms: 10000 vs 10001"},
  };
  moe_ep_config_t base;
  mep_config_defaults(&base);
  const std::string base_text = Canonical(base);
  for (const Mutation &m : muts) {
    moe_ep_config_t c = base;
    m.apply(&c);
    EXPECT_NE(mep_config_hash(&c), mep_config_hash(&base)) << m.key;
    EXPECT_EQ(mep_config_hash(&c), Fnv1a(Canonical(c))) << m.key;
    char diff[256];
    mep_config_describe_diff(base_text.c_str(), Canonical(c).c_str(), diff,
                             sizeof(diff));
    EXPECT_STREQ(diff, m.diff) << m.key;
  }
}

TEST(ConfigHash, LocalKeysDoNotChangeHash) {
  moe_ep_config_t base, c;
  mep_config_defaults(&base);
  mep_config_defaults(&c);
  c.log_level = MOE_EP_LOG_TRACE;
  c.bootstrap_timeout_ms = 1;
  snprintf(c.bootstrap_address, sizeof(c.bootstrap_address), "other:1");
  snprintf(c.bootstrap_token_env, sizeof(c.bootstrap_token_env), "OTHER");
  EXPECT_EQ(mep_config_hash(&c), mep_config_hash(&base));
}

TEST(ConfigHash, DescribeDiffFirstKeyAndMissing) {
  char diff[128];
  mep_config_describe_diff("a=1\nb=2\nc=3\n", "a=1\nb=5\nc=4\n", diff,
                           sizeof(diff));
  EXPECT_STREQ(diff, "b: 2 vs 5");
  mep_config_describe_diff("a=1\n", "a=1\nz=9\n", diff, sizeof(diff));
  EXPECT_STREQ(diff, "z: (missing) vs 9");
  mep_config_describe_diff("a=1\nz=9\n", "a=1\n", diff, sizeof(diff));
  EXPECT_STREQ(diff, "z: 9 vs (missing)");
  mep_config_describe_diff(nullptr, "a=1\n", diff, sizeof(diff));
  EXPECT_STREQ(diff, "(no config to compare)");
}

}  // namespace
