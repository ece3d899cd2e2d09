// A small counter-based random generator with a fixed algorithm, so plans are the
// same on every rank, platform and standard library (std::shuffle is not).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace adaptiveload {

class Rng {
 public:
  /// Independent streams for each (seed, stream) pair.
  Rng(uint64_t seed, uint64_t stream) : state_(mix(seed) ^ mix(stream + 0x632be59bd9b4e019ULL)) {}

  /// splitmix64
  uint64_t next() {
    state_ += 0x9e3779b97f4a7c15ULL;
    return mix(state_);
  }

  /// Uniform in [0, n), unbiased (Lemire's multiply-and-reject).
  uint64_t below(uint64_t n) {
    __uint128_t m = static_cast<__uint128_t>(next()) * n;
    uint64_t low = static_cast<uint64_t>(m);
    if (low < n) {
      const uint64_t threshold = (0 - n) % n;
      while (low < threshold) {
        m = static_cast<__uint128_t>(next()) * n;
        low = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }

 private:
  static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  uint64_t state_;
};

/// Fisher-Yates on data[0, n).
template <typename T>
void shuffle_range(T* data, int64_t n, Rng& rng) {
  for (int64_t i = n; i > 1; --i) {
    const int64_t j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i)));
    std::swap(data[i - 1], data[j]);
  }
}

template <typename T>
void shuffle_in_place(std::vector<T>& v, Rng& rng) {
  shuffle_range(v.data(), static_cast<int64_t>(v.size()), rng);
}

}  // namespace adaptiveload
