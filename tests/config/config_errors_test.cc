// config_errors_test.cc: every rejected input gives MOE_EP_ERR_CONFIG (never
// a crash or a config) and a sentence naming the key's full path, its line
// and what is allowed.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "config_test_util.h"

namespace {

using ConfigErrors = ConfigTest;

TEST_F(ConfigErrors, UnknownKeySuggestsClosest) {
  ExpectError("moe_ep:\n  mode: low_latency\n  topk: 4\n",
              {"unknown key 'topk'", "line 3", "did you mean 'top_k'?",
               "allowed keys under moe_ep: backend, mode, num_experts, hidden, "
               "top_k, max_tokens_per_rank, dispatch_dtype, fp8_scale, "
               "double_buffer, transport, ranks_per_node, bootstrap, timeouts, "
               "log_level"});
  ExpectError("moe_ep:\n  bootstrap:\n    adress: 'h:1'\n",
              {"unknown key 'bootstrap.adress'", "line 3",
               "did you mean 'bootstrap.address'?",
               "allowed keys under moe_ep.bootstrap: address, timeout_ms, "
               "token_env"});
  // A nested key written at the top level points to where it belongs.
  ExpectError("moe_ep:\n  timeout_ms: 5\n",
              {"unknown key 'timeout_ms'", "line 2",
               "did you mean 'bootstrap.timeout_ms'?"});
  ExpectError("moe_ep:\n  timeouts:\n    kernel: 5\n",
              {"'timeouts.kernel'", "line 3",
               "did you mean 'timeouts.kernel_ms'?", "kernel_ms"});
}

TEST_F(ConfigErrors, UnknownKeyFarFromAnyHasNoSuggestion) {
  ExpectError("moe_ep:\n\n  zzzzzzzzzzzz: 1\n",
              {"unknown key 'zzzzzzzzzzzz'", "line 3", "allowed keys"});
  EXPECT_EQ(std::string(mep_last_error()).find("did you mean"),
            std::string::npos)
      << mep_last_error();
}

TEST_F(ConfigErrors, WrongTypes) {
  ExpectError("moe_ep:\n  top_k:\n    a: 1\n",
              {"'top_k'", "line 2", "a mapping", "integer 1..32"});
  ExpectError("moe_ep:\n  num_experts: [1, 2]\n",
              {"'num_experts'", "line 2", "a sequence", "integer 1..65536"});
  ExpectError("moe_ep:\n  top_k: abc\n",
              {"'top_k'", "line 2", "'abc' is not an integer", "integer 1..32"});
  ExpectError("moe_ep:\n  hidden: 3.5\n",
              {"'hidden'", "line 2", "'3.5' is not an integer", "8..32768"});
  ExpectError("moe_ep:\n  top_k: 0x10\n", {"'top_k'", "not an integer"});
  // YAML 1.1 readers (PyYAML, which engines use) take 01024 as octal 532.
  ExpectError("moe_ep:\n  hidden: 01024\n",
              {"'hidden'", "line 2", "'01024' has a leading zero", "octal",
               "8..32768"});
  ExpectError("moe_ep:\n  ranks_per_node: -08\n", {"'-08' has a leading zero"});
  ASSERT_EQ(Parse("moe_ep:\n  ranks_per_node: 0\n  hidden: 1024\n"), MOE_EP_OK)
      << mep_last_error();
  EXPECT_EQ(cfg_->hidden, 1024);
  ExpectError("moe_ep:\n  num_experts: 99999999999\n",
              {"'num_experts'", "line 2", "does not fit in a 32-bit integer",
               "integer 1..65536"});
  ExpectError("moe_ep:\n  num_experts: -99999999999999999999999\n",
              {"'num_experts'", "does not fit"});
  ExpectError("moe_ep:\n  backend: gpu\n",
              {"'backend'", "line 2", "'gpu'", "one of auto, host, nccl"});
  ExpectError("moe_ep:\n  mode: fast\n",
              {"'mode'", "line 2", "one of low_latency, high_throughput"});
  ExpectError("moe_ep:\n  dispatch_dtype: fp16\n",
              {"'dispatch_dtype'", "one of bf16, fp8_e4m3"});
  ExpectError("moe_ep:\n  fp8_scale: e8m0\n",
              {"'fp8_scale'", "one of f32, ue8m0, ue8m0_packed"});
  ExpectError("moe_ep:\n  transport: rdma\n",
              {"'transport'", "one of auto, lsa, gin, gin_emulated"});
  ExpectError("moe_ep:\n  log_level: loud\n",
              {"'log_level'", "one of none, error, warn, info, debug, trace"});
  ExpectError("moe_ep:\n  ranks_per_node: two\n",
              {"config key 'ranks_per_node' (line 2): 'two' is not an "
               "integer; allowed: integer 0..1024 (0 = unset; otherwise a "
               "divisor of the world size)"});
  ExpectError("moe_ep:\n  ranks_per_node: 2.5\n",
              {"'ranks_per_node'", "line 2", "'2.5' is not an integer"});
  ExpectError("moe_ep:\n  ranks_per_node: [8]\n",
              {"'ranks_per_node'", "line 2", "a sequence", "integer 0..1024"});
  ExpectError("moe_ep:\n  double_buffer: maybe\n",
              {"'double_buffer'", "line 2", "'maybe' is not a boolean",
               "true/false/yes/no/on/off/1/0"});
  ExpectError("moe_ep:\n  bootstrap:\n    timeout_ms: {a: 1}\n",
              {"'bootstrap.timeout_ms'", "line 3", "a mapping",
               "integer 1..3600000"});
  ExpectError("moe_ep:\n  top_k:\n", {"'top_k'", "line 2", "has no value",
                                       "integer 1..32"});
  ExpectError("moe_ep:\n  top_k: \"1\\0\"\n",
              {"'top_k'", "line 2", "NUL character"});
}

TEST_F(ConfigErrors, OutOfRange) {
  ExpectError("moe_ep:\n  top_k: 33\n",
              {"'top_k' = 33", "line 2", "out of range", "integer 1..32"});
  ExpectError("moe_ep:\n  top_k: 0\n", {"'top_k' = 0", "line 2", "1..32"});
  ExpectError("moe_ep:\n  num_experts: 65537\n",
              {"'num_experts' = 65537", "line 2", "1..65536"});
  ExpectError("moe_ep:\n  num_experts: -1\n",
              {"'num_experts' = -1", "line 2", "1..65536"});
  ExpectError("x: 1\nmoe_ep:\n  bootstrap:\n    timeout_ms: 0\n",
              {"'bootstrap.timeout_ms' = 0", "line 4", "integer 1..3600000"});
  ExpectError("moe_ep:\n  timeouts:\n    kernel_ms: 3600001\n",
              {"'timeouts.kernel_ms' = 3600001", "line 3", "1..3600000"});
  ExpectError("moe_ep:\n  ranks_per_node: -1\n",
              {"config key 'ranks_per_node' = -1 (line 2) is out of range; "
               "allowed: integer 0..1024 (0 = unset; otherwise a divisor of "
               "the world size)"});
  ExpectError(
      "moe_ep:\n  ranks_per_node: 1025\n",
      {"'ranks_per_node' = 1025", "line 2", "out of range", "integer 0..1024"});
  ExpectError("moe_ep:\n  hidden: 4\n",
              {"'hidden' = 4", "line 2", "out of range", "8..32768"});
  ExpectError("moe_ep:\n  hidden: 32776\n", {"'hidden' = 32776", "8..32768"});
  ExpectError("moe_ep:\n  hidden: 100\n",
              {"'hidden' = 100", "line 2", "not a multiple of 8",
               "a multiple of 8"});
}

TEST_F(ConfigErrors, ModeDependentTokensAndFp8Hidden) {
  ExpectError("moe_ep:\n  max_tokens_per_rank: 2048\n",
              {"'max_tokens_per_rank' = 2048", "line 2",
               "out of range for mode low_latency", "1..1024 in mode low_latency",
               "1..65536 in mode high_throughput"});
  ExpectError("moe_ep:\n  mode: high_throughput\n  max_tokens_per_rank: 65537\n",
              {"'max_tokens_per_rank' = 65537", "line 3",
               "for mode high_throughput"});
  ExpectError("moe_ep:\n  hidden: 7176\n  dispatch_dtype: fp8_e4m3\n",
              {"'hidden' = 7176", "line 2", "multiple of 128",
               "fp8_e4m3 (line 3)"});
}

TEST_F(ConfigErrors, StringRules) {
  std::string long_addr(300, 'a');
  ExpectError("moe_ep:\n  bootstrap:\n    address: " + long_addr + ":1\n",
              {"'bootstrap.address'", "line 3", "at most 255"});
  ExpectError("moe_ep:\n  bootstrap:\n    address: localhost\n",
              {"'bootstrap.address' = 'localhost'", "line 3", "no ':port'",
               "port 1..65535"});
  ExpectError("moe_ep:\n  bootstrap:\n    address: 'h:0'\n",
              {"'bootstrap.address'", "port 0", "port 1..65535"});
  ExpectError("moe_ep:\n  bootstrap:\n    address: 'h:65536'\n",
              {"'bootstrap.address'", "above 65535"});
  ExpectError("moe_ep:\n  bootstrap:\n    address: 'h:12x'\n",
              {"'bootstrap.address'", "not a number"});
  ExpectError("moe_ep:\n  bootstrap:\n    address: ':80'\n",
              {"'bootstrap.address'", "empty host"});
  ExpectError("moe_ep:\n  bootstrap:\n    address: '::1:80'\n",
              {"'bootstrap.address'", "[addr]:port"});
  ExpectError("moe_ep:\n  bootstrap:\n    address: 'a b:80'\n",
              {"'bootstrap.address'", "not allowed in a host name"});
  ExpectError("moe_ep:\n  bootstrap:\n    token_env: 1BAD\n",
              {"'bootstrap.token_env' = '1BAD'", "line 3",
               "[A-Za-z_][A-Za-z0-9_]*"});
  ExpectError("moe_ep:\n  bootstrap:\n    token_env: " + std::string(64, 'T') +
                  "\n",
              {"'bootstrap.token_env'", "line 3", "at most 63"});
}

TEST_F(ConfigErrors, DuplicateKeys) {
  ExpectError("moe_ep:\n  top_k: 4\n  hidden: 256\n  top_k: 6\n",
              {"duplicate key 'top_k'", "line 4", "first set at line 2"});
  ExpectError("moe_ep:\n  bootstrap:\n    timeout_ms: 1\n    timeout_ms: 2\n",
              {"duplicate key 'bootstrap.timeout_ms'", "line 4",
               "first set at line 3"});
  ExpectError("moe_ep: {}\nmodel: x\nmoe_ep:\n  top_k: 4\n",
              {"duplicate key 'moe_ep'", "line 3", "first at line 1"});
}

TEST_F(ConfigErrors, MalformedYaml) {
  ExpectError("moe_ep:\n  top_k: 4\n  hidden: [1, 2\n",
              {"malformed YAML", "line 4", "did not find expected ',' or ']'"});
  ExpectError("moe_ep:\n  top_k: 4\n bad: 1\n",
              {"malformed YAML", "line 3"});
  ExpectError("moe_ep:\n  top_k: \"unterminated\n",
              {"malformed YAML", "found unexpected end of stream"});
  ExpectError("moe_ep:\n  top_k: *nope\n",
              {"malformed YAML", "line 2", "undefined alias"});
  // Invalid UTF-8 on line 3 is reported with that line.
  ExpectError(std::string("moe_ep:\n  top_k: 4\n  hidden: \xff\xfe\n"),
              {"malformed YAML", "line 3", "UTF-8"});
}

TEST_F(ConfigErrors, MissingOrMisshapenSection) {
  ExpectError("model: llama\nserving:\n  port: 8000\n",
              {"no 'moe_ep:' section", "line 1"});
  ExpectError("model: llama\nmoe-ep:\n  top_k: 4\n",
              {"no 'moe_ep:' section", "did you mean 'moe_ep'",
               "'moe-ep' at line 2"});
  ExpectError("\n# only a comment\n", {"empty"});
  ExpectError("- moe_ep\n- b\n", {"line 1", "a sequence, not a mapping"});
  ExpectError("moe_ep: 5\n", {"'moe_ep' is scalar '5'", "line 1",
                              "must be a mapping"});
  ExpectError("x: 1\nmoe_ep: [top_k, 4]\n",
              {"'moe_ep' is a sequence", "line 2", "must be a mapping"});
  ExpectError("moe_ep:\n  bootstrap: 5\n",
              {"'bootstrap' is scalar '5'", "line 2",
               "mapping with keys: address, timeout_ms, token_env"});
  ExpectError("moe_ep:\n  timeouts: [1]\n",
              {"'timeouts' is a sequence", "line 2", "kernel_ms"});
  ExpectError("moe_ep:\n  ? [a, b]\n  : 1\n",
              {"a key under moe_ep is a sequence", "line 2", "plain names"});
}

// A config file may be 16 MiB, not a byte more.
TEST_F(ConfigErrors, FileSizeBoundIsInclusive) {
  const std::string path = std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") +
                           "/config_size_bound.yaml";
  const std::string head = "moe_ep: {top_k: 4}\n#";
  const size_t bound = 16u << 20;
  for (size_t size : {bound, bound + 1}) {
    std::string text = head + std::string(size - head.size() - 1, 'x') + "\n";
    ASSERT_EQ(text.size(), size);
    FILE *f = fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(fwrite(text.data(), 1, text.size(), f), text.size());
    fclose(f);
    moe_ep_config_t *cfg = nullptr;
    const moe_ep_status_t st = mep_config_from_yaml(path.c_str(), &cfg);
    if (size == bound) {
      EXPECT_EQ(st, MOE_EP_OK) << mep_last_error();
      if (cfg != nullptr) {
        EXPECT_EQ(cfg->top_k, 4);
      }
      mep_config_free(cfg);
    } else {
      EXPECT_EQ(st, MOE_EP_ERR_CONFIG);
      EXPECT_NE(std::string(mep_last_error()).find("is larger than 16777216 bytes"),
                std::string::npos)
          << mep_last_error();
    }
  }
  remove(path.c_str());
}

TEST_F(ConfigErrors, DeepNestingAndAnchorFloodsFailFast) {
  // libyaml's scanner is O(depth) per token and its loader O(anchors) per
  // anchor: 1 MiB of '[' took hours. The parse must stop where a limit is
  // passed (the 65th level, the 1025th anchor), which the sentences show;
  // a parse that went on would run into the test's own time limit instead
  // (no clock is read here: a loaded machine must not fail this).
  ExpectError("moe_ep: {}\nx: " + std::string(1 << 20, '[') + "\n",
              {"more than 64 levels of nesting", "line 2"});
  std::string anchors = "moe_ep: {}\n";
  for (int i = 0; i < 100000; i++) {
    anchors += "a" + std::to_string(i) + ": &x" + std::to_string(i) + " 1\n";
  }
  ExpectError(anchors, {"more than 1024 anchors", "line 1026"});
  // Within the limits, nesting and anchors still work.
  ASSERT_EQ(Parse("x: " + std::string(60, '[') + std::string(60, ']') +
                  "\nmoe_ep: {top_k: &k 4, hidden: 256}\ny: *k\n"),
            MOE_EP_OK)
      << mep_last_error();
  EXPECT_EQ(cfg_->top_k, 4);
}

TEST_F(ConfigErrors, NodeFloodFailsBeforeTheLoaderHoldsIt) {
  // libyaml's loader keeps every node of the document, the engine's own
  // keys included: a flat list of millions of items held gigabytes. The
  // 262145th node is refused by name, before anything is loaded.
  // One item per line, so the line the refusal names pins the limit: the
  // root mapping, "moe_ep", its {}, "x" and the list are nodes 1-5, so
  // item i (line 2 + i) is node 5 + i and item 262140, on line 262142, is
  // the 262145th.
  std::string flood = "moe_ep: {}\nx:\n";
  for (int i = 0; i < 270000; i++) flood += "- a\n";
  ExpectError(flood, {"more than 262144 nodes", "line 262142:"});
  // A list of a few thousand is an ordinary engine config.
  std::string many = "moe_ep: {top_k: 4, hidden: 256}\nx: [";
  for (int i = 0; i < 5000; i++) many += "a,";
  many += "a]\n";
  ASSERT_EQ(Parse(many), MOE_EP_OK) << mep_last_error();
  EXPECT_EQ(cfg_->top_k, 4);
}

TEST_F(ConfigErrors, AMoeEpSectionInALaterDocumentIsRefused) {
  // Only the first document is read; a moe_ep section in a later one (an
  // override appended after '---', say) would be dropped without a word.
  ExpectError("moe_ep:\n  top_k: 4\n---\nmoe_ep:\n  top_k: 8\n",
              {"document 2 has a 'moe_ep' section", "line 4", "config text",
               "reads the first document only"});
  ExpectError("moe_ep: {}\n---\na: 1\n---\nb: 2\nmoe_ep: {top_k: 2}\n",
              {"document 3 has a 'moe_ep' section", "line 6"});
  // A later document is otherwise the engine's: 'moe_ep' as a value, a
  // nested key or a list item there is not a section.
  ASSERT_EQ(Parse("moe_ep:\n  top_k: 4\n...\n---\nkey: moe_ep\n"
                  "engine: {moe_ep: 1}\nx: [moe_ep]\n---\n- moe_ep\n"),
            MOE_EP_OK)
      << mep_last_error();
  EXPECT_EQ(cfg_->top_k, 4);
  // Broken YAML anywhere in the text is still broken.
  ExpectError("moe_ep:\n  top_k: 4\n---\n[[[ : : bad\n", {"line"});
}

TEST_F(ConfigErrors, TextLargerThanAFileMayBeIsRefused) {
  // A file is read up to 16 MiB; text given directly has the same bound,
  // checked before libyaml sees it.
  std::string text = "moe_ep: {top_k: 4}\n#";
  text.resize((16u << 20) + 1, 'x');
  moe_ep_status_t st = Parse(text);
  std::string err = mep_last_error();
  EXPECT_EQ(st, MOE_EP_ERR_CONFIG) << err;
  EXPECT_EQ(cfg_, nullptr);
  EXPECT_NE(err.find("config text is 16777217 bytes, larger than 16777216"),
            std::string::npos)
      << err;
  text.resize(16u << 20);
  ASSERT_EQ(Parse(text), MOE_EP_OK) << mep_last_error();
  EXPECT_EQ(cfg_->top_k, 4);
}

}  // namespace
