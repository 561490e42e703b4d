// bench_util.cc: see bench_util.h.
#include "tools/bench/bench_util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

namespace mep_bench {

int g_rank = -1;
const moe_ep_plugin_v1_t* g_ep = nullptr;

void Die(const char* fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  fprintf(stderr, "moe_ep_bench rank %d: %s\n", g_rank, buf);
  fflush(stderr);
  fflush(stdout);
  _exit(1);  // no teardown: NCCL / plugin threads may be mid-operation
}

int EnvInt(const char* name, int def) {
  const char* v = getenv(name);
  if (v == nullptr || *v == '\0') return def;
  char* end = nullptr;
  long x = strtol(v, &end, 10);
  if (*end != '\0' || x < 0 || x > 1 << 20) Die("environment %s='%s' is not a valid number", name, v);
  return static_cast<int>(x);
}

std::vector<int> IntList(const std::vector<std::string>& in, const char* flag, int lo, int hi) {
  std::vector<int> out;
  for (const std::string& s : in) {
    char* end = nullptr;
    long v = strtol(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0' || v < lo || v > hi) {
      Die("--%s: '%s' is not an integer in [%d, %d]", flag, s.c_str(), lo, hi);
    }
    out.push_back(static_cast<int>(v));
  }
  if (out.empty()) Die("--%s is empty", flag);
  return out;
}

double NowS() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

std::string Fmt(const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

const char* TransportName(int t) {
  static const char* const n[] = {"auto", "lsa", "gin", "gin_emulated", "ucx_host"};
  return t >= 0 && t < 5 ? n[t] : "?";
}

std::string JsonEscape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\', o += c;
    else if (static_cast<unsigned char>(c) < 0x20) o += Fmt("\\u%04x", c);
    else o += c;
  }
  return o;
}

void Desc::Set(void* data, int code, int bits, int dev, std::vector<int64_t> dims) {
  memset(&t, 0, sizeof t);
  for (size_t i = 0; i < dims.size(); i++) shape[i] = dims[i];
  t.data = data;
  t.device = {MOE_EP_DEVICE_CUDA, dev};
  t.ndim = static_cast<int32_t>(dims.size());
  t.dtype = {static_cast<uint8_t>(code), static_cast<uint8_t>(bits), 1};
  t.shape = shape;
  t.strides = nullptr;
}

}  // namespace mep_bench
