// export_layout_gpu_test.cc: mep_ll_export_layout on one GPU (no NCCL):
// handles built here the way the dispatch receive fills them (per local
// expert, slots in source rank then token order, at most max_tokens per
// source), against DeepEP's src_info and layout_range computed here slot by
// slot; each output alone; 1 and 1024 ranks, max_tokens 1 and 1024, empty
// experts; nothing written past an output.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/kernels_error.h"
#include "kernels/ll/ll.h"
#include "tests/gpu/cuda_ok.h"

namespace {

constexpr size_t kGuard = 64;  // poisoned bytes after each output: an overrun lands there
constexpr uint8_t kPoison = 0xEE;

struct Shape {
  int e_local, world, max_tokens;
  unsigned seed;
  bool empty;  // every source sends nothing
};

// A handle as the receive leaves it, and what DeepEP's form of it must be.
struct Handle {
  std::vector<int32_t> slot_src, src_count, src_info;
  std::vector<int64_t> layout_range;
};

Handle make_handle(const Shape& s) {
  const int EL = s.e_local, R = s.world, M = s.max_tokens;
  const size_t row = static_cast<size_t>(R) * M;
  Handle h;
  h.slot_src.assign(EL * row, 0x5A5A5A5A);  // past the received slots: never read
  h.src_count.assign(static_cast<size_t>(EL) * R, 0);
  h.src_info.assign(EL * row, -1);
  h.layout_range.assign(static_cast<size_t>(EL) * R, 0);
  std::mt19937 rng(s.seed);
  for (int le = 0; le < EL; ++le) {
    int filled = 0;
    for (int r = 0; r < R; ++r) {
      // Counts from 0 to the cap, both ends often.
      int n = s.empty ? 0 : static_cast<int>(rng() % (M + 3)) - 1;
      n = n < 0 ? 0 : (n > M ? M : n);
      int t = 0;
      for (int j = 0; j < n; ++j) {
        t += static_cast<int>(rng() % (M - t - (n - j) + 1));  // ascending, room for the rest
        const size_t at = le * row + filled + j;
        h.slot_src[at] = MEP_LL_SLOT_PACK(r, t, static_cast<int>(rng() % 32));
        h.src_info[at] = t;
        ++t;
      }
      h.src_count[le * R + r] = n;
      h.layout_range[le * R + r] = (static_cast<int64_t>(filled) << 32) | n;
      filled += n;
    }
  }
  return h;
}

template <typename T>
void* upload(const std::vector<T>& v) {
  void* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, v.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}

// The first difference between want and got ([n] each, rows of `per`), or "".
template <typename T>
std::string first_mismatch(const char* what, const std::vector<T>& want, const T* got,
                           size_t per) {
  for (size_t i = 0; i < want.size(); ++i) {
    if (got[i] != want[i]) {
      return std::string(what) + "[" + std::to_string(i / per) + "][" + std::to_string(i % per) +
             "]: expected " + std::to_string(want[i]) + ", got " + std::to_string(got[i]);
    }
  }
  return "";
}

// "" when every byte of h from `from` on is the poison.
std::string untouched(const std::vector<uint8_t>& h, size_t from, const char* what) {
  for (size_t i = from; i < h.size(); ++i) {
    if (h[i] != kPoison) return std::string(what) + ": byte " + std::to_string(i) + " written";
  }
  return "";
}

enum : unsigned { kInfo = 1, kRange = 2 };

void run(const Shape& s, unsigned outputs) {
  const std::string what = "e_local " + std::to_string(s.e_local) + " world " +
                           std::to_string(s.world) + " max_tokens " +
                           std::to_string(s.max_tokens) + " seed " + std::to_string(s.seed) +
                           " outputs " + std::to_string(outputs);
  const Handle h = make_handle(s);
  const size_t info_bytes = h.src_info.size() * 4, range_bytes = h.layout_range.size() * 8;
  void* slot_src = upload(h.slot_src);
  void* src_count = upload(h.src_count);
  void *info = nullptr, *range = nullptr;
  CUDA_OK(cudaMalloc(&info, info_bytes + kGuard));
  CUDA_OK(cudaMalloc(&range, range_bytes + kGuard));
  CUDA_OK(cudaMemset(info, kPoison, info_bytes + kGuard));
  CUDA_OK(cudaMemset(range, kPoison, range_bytes + kGuard));
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  ASSERT_EQ(mep_ll_export_layout(static_cast<const int32_t*>(slot_src),
                                 static_cast<const int32_t*>(src_count), s.e_local, s.world,
                                 s.max_tokens,
                                 (outputs & kInfo) ? static_cast<int32_t*>(info) : nullptr,
                                 (outputs & kRange) ? static_cast<int64_t*>(range) : nullptr,
                                 stream),
            MEP_KSTATUS_OK)
      << what << ": " << mep_kernels_last_error();
  CUDA_OK(cudaStreamSynchronize(stream));
  std::vector<uint8_t> got_info(info_bytes + kGuard), got_range(range_bytes + kGuard);
  CUDA_OK(cudaMemcpy(got_info.data(), info, got_info.size(), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(got_range.data(), range, got_range.size(), cudaMemcpyDeviceToHost));
  if (outputs & kInfo) {
    std::vector<int32_t> v(h.src_info.size());
    std::memcpy(v.data(), got_info.data(), info_bytes);
    EXPECT_EQ(first_mismatch("src_info", h.src_info, v.data(),
                             static_cast<size_t>(s.world) * s.max_tokens), "")
        << what;
    EXPECT_EQ(untouched(got_info, info_bytes, "src_info guard"), "") << what;
  } else {
    EXPECT_EQ(untouched(got_info, 0, "src_info (NULL)"), "") << what;
  }
  if (outputs & kRange) {
    std::vector<int64_t> v(h.layout_range.size());
    std::memcpy(v.data(), got_range.data(), range_bytes);
    EXPECT_EQ(first_mismatch("layout_range", h.layout_range, v.data(), s.world), "") << what;
    EXPECT_EQ(untouched(got_range, range_bytes, "layout_range guard"), "") << what;
  } else {
    EXPECT_EQ(untouched(got_range, 0, "layout_range (NULL)"), "") << what;
  }
  cudaStreamDestroy(stream);
  for (void* b : {slot_src, src_count, info, range}) cudaFree(b);
}

TEST(ExportLayout, MatchesDeepEpForm) {
  const Shape shapes[] = {
      {1, 1, 1, 1, false},      {4, 2, 128, 2, false},  {9, 8, 256, 3, false},
      {2, 1024, 4, 4, false},   {1, 3, 1024, 5, false}, {3, 2, 16, 6, true},
      {32, 16, 128, 7, false},
  };
  for (const Shape& s : shapes) run(s, kInfo | kRange);
}

TEST(ExportLayout, EachOutputAlone) {
  run({5, 4, 64, 11, false}, kInfo);
  run({5, 4, 64, 12, false}, kRange);
}

}  // namespace
