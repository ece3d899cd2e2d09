// Sequence lengths for the C++ tests: an image + video mix with Wan 2.1 token counts.
#pragma once

#include <cstdint>
#include <iterator>
#include <random>
#include <vector>

namespace adaptiveload {

inline std::vector<int64_t> wan_mix(int64_t n, uint32_t seed) {
  const int64_t lens[] = {1560, 3600, 32760, 46800, 75600, 14040};
  const double weights[] = {0.5, 0.1, 0.2, 0.05, 0.1, 0.05};
  std::mt19937 gen(seed);
  std::discrete_distribution<int> pick(std::begin(weights), std::end(weights));
  std::vector<int64_t> out(n);
  for (auto& s : out) s = lens[pick(gen)];
  return out;
}

}  // namespace adaptiveload
