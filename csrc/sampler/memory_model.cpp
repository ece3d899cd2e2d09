#include "sampler/memory_model.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>

namespace adaptiveload {

namespace {
[[noreturn]] void fail(const std::string& what) {
  throw std::invalid_argument("MemoryModel: " + what);
}
}  // namespace

double MemoryModel::peak(int64_t count, int64_t tokens, int64_t checkpointed, double held) const {
  const double t = static_cast<double>(tokens);
  const double n = static_cast<double>(checkpointed);
  const double kept = static_cast<double>(std::max<int64_t>(num_blocks - checkpointed, 1));
  const double per_token = mt + ma * kept + mc * n + (checkpointed > 0 ? mr : 0.0);
  return m0 + (mb + mbk * kept) * static_cast<double>(count) + t * per_token + held * kept;
}

int64_t MemoryModel::checkpointed_blocks(int64_t count, int64_t tokens, double budget,
                                         double held) const {
  // The fewest n in [0, L] with peak(n) <= limit, in a few evaluations whatever L: n = 0 keeps
  // every block; on [1, L - 1] the peak is linear in n (kept = L - n), so its first n under the
  // limit is the end where it is lowest when it does not fall, and a division when it does;
  // n = L keeps one block (max(L - n, 1)). The peak need not fall in n (mc, mr).
  const double limit = budget / (1.0 + margin);
  const auto at = [&](int64_t n) { return peak(count, tokens, n, held); };
  if (at(0) <= limit) return 0;
  const int64_t last = num_blocks - 1;  // the linear part is n in [1, last]
  if (last >= 1) {
    const double p1 = at(1);
    const double slope = at(last) - p1;  // over last - 1 steps of n
    int64_t n = 1;
    if (p1 > limit && slope < 0.0 && at(last) <= limit) {
      const double per_step = -slope / static_cast<double>(std::max<int64_t>(last - 1, 1));
      const double steps = std::ceil((p1 - limit) / per_step);
      n = std::clamp<int64_t>(1 + static_cast<int64_t>(std::min(steps, 1e18)), 1, last);
      // Rounding of the division: settle on the exact first n by evaluating its neighbours.
      while (n < last && at(n) > limit) ++n;
      while (n > 1 && at(n - 1) <= limit) --n;
    }
    if (at(n) <= limit) return n;
  }
  if (num_blocks >= 1 && at(num_blocks) <= limit) return num_blocks;
  return -1;
}

double MemoryModel::time_factor(int64_t checkpointed) const {
  return 1.0 - recompute_share * static_cast<double>(num_blocks - checkpointed) /
                   static_cast<double>(num_blocks);
}

void MemoryModel::validate() const {
  if (num_blocks < 1 || num_blocks > kMaxBlocks)
    fail("num_blocks must be in [1, " + std::to_string(kMaxBlocks) + "], got " +
         std::to_string(num_blocks));
  const std::pair<const char*, double> fields[] = {{"m0", m0}, {"mb", mb},        {"mbk", mbk},
                                                   {"mt", mt}, {"ma", ma},        {"mc", mc},
                                                   {"mr", mr}, {"margin", margin}};
  for (const auto& [name, v] : fields)
    if (!std::isfinite(v) || v < 0.0)
      fail(std::string(name) + " must be finite and >= 0, got " + std::to_string(v));
  if (!(ma > 0.0 || mt > 0.0)) fail("mt or ma must be > 0 (memory that grows with tokens)");
  if (!std::isfinite(recompute_share) || recompute_share < 0.0 || recompute_share >= 1.0)
    fail("recompute_share must be in [0, 1), got " + std::to_string(recompute_share));
}

void MemoryPolicy::validate() const {
  for (size_t k = 0; k < held_per_token.size(); ++k)
    if (!std::isfinite(held_per_token[k]) || held_per_token[k] < 0.0)
      fail("held_per_token must be finite and >= 0, got " + std::to_string(held_per_token[k]) +
           " at degree " + std::to_string(int64_t{1} << k));
}

std::string MemoryModel::describe() const {
  std::ostringstream s;
  s << "MemoryModel(L=" << num_blocks << ", peak = " << m0 << " + B*(" << mb << " + " << mbk
    << "*max(L-n,1)) + T*(" << mt << " + " << ma << "*max(L-n,1) + " << mc << "*n + " << mr
    << "*[n>0]) bytes, margin=" << margin << ", recompute_share=" << recompute_share << ")";
  return s.str();
}

}  // namespace adaptiveload
