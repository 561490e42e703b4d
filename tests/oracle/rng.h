// rng.h: splitmix64 (Steele, Lea & Flood 2014; Vigna's public-domain
// reference), the oracle's only source of randomness: tiny and fully specified.
#ifndef MOE_EP_TESTS_ORACLE_RNG_H_
#define MOE_EP_TESTS_ORACLE_RNG_H_

#include <cstdint>

namespace moe_ep_oracle {

// The splitmix64 output function: a bijective 64-bit mix.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t state) : state_(state) {}
  uint64_t next() { return mix64(state_ += 0x9E3779B97F4A7C15ull); }
  // Uniform in [0, n) by modulo; the bias (n / 2^64) is irrelevant here.
  uint64_t below(uint64_t n) { return next() % n; }
  // Uniform in [0, 1) with 53 random bits.
  double unit() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }

 private:
  uint64_t state_;
};

// Independent streams per (seed, rank, purpose), so e.g. x does not change
// when only the routing generator does:
//   state0 = mix64(mix64(seed + 0x9E3779B97F4A7C15 * (rank + 1)) + stream)
enum class Stream : uint64_t { kCount = 1, kX = 2, kIdx = 3, kWeights = 4 };

inline SplitMix64 make_stream(uint64_t seed, int rank, Stream s) {
  uint64_t r = static_cast<uint64_t>(rank) + 1;
  return SplitMix64(mix64(mix64(seed + 0x9E3779B97F4A7C15ull * r) + static_cast<uint64_t>(s)));
}

}  // namespace moe_ep_oracle

#endif  // MOE_EP_TESTS_ORACLE_RNG_H_
