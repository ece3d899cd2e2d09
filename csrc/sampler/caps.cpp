#include "sampler/caps.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "sampler/planner.h"
#include "sampler/sequence_parallel.h"

namespace adaptiveload {

namespace {

[[noreturn]] void invalid(const std::string& what) { throw std::invalid_argument(what); }

}  // namespace

void check_cap_arguments(int64_t max_tokens, int64_t max_batch_size) {
  if (max_tokens <= 0 || max_tokens > kMaxTokens)
    invalid("max_tokens must be in [1, 2^62], got " + std::to_string(max_tokens));
  if (max_batch_size < 0)
    invalid("max_batch_size must be >= 0 (0: no limit), got " + std::to_string(max_batch_size));
}

BatchStats uniform_stats(int64_t len, double f, int64_t fill, int64_t available) {
  BatchStats s;
  if (fill > available) {
    s.count = fill;
    s.tokens = fill * len;  // <= max_tokens
    s.additive = static_cast<double>(fill) * f;
    s.uniform_len = len;
    return s;
  }
  for (int64_t b = 0; b < fill; ++b) s.add(len, f);
  return s;
}

Caps::Caps(const CostModel& cost, const MemoryPolicy* memory, const PlanOptions& o)
    : Caps(cost, memory, o.max_tokens, o.max_batch_size, o.max_cost,
           o.sequence_parallel.max_degree) {}

void Caps::refuse(int64_t i, int64_t s, double f) const {
  const std::string sample = "sample " + std::to_string(i);
  const std::string skip = "skip such samples with on_oversize='skip'";
  // What one rank holds of it: all of it, or with sequence parallelism its largest share.
  const int64_t D = max_degree_;
  const int64_t held = share_tokens(s, D, 0);
  BatchStats one;
  one.add(held, f);
  if (share_blocks(one, s) < 0) {
    const MemoryModel& m = memory_->model;
    const double peak = m.peak(1, held, m.num_blocks, memory_->held(D) * static_cast<double>(s));
    const std::string split = D > 1 ? ", split over sequence_parallel = " + std::to_string(D) +
                                          " ranks (" + std::to_string(held) + " tokens each)"
                                    : "";
    invalid(sample + " has " + std::to_string(s) + " tokens" + split + "; with all " +
            std::to_string(m.num_blocks) + " blocks checkpointed its predicted peak is " +
            std::to_string(peak / (1 << 20)) + " MiB, " +
            std::to_string(peak * (1.0 + m.margin) / (1 << 20)) + " MiB with the margin of " +
            std::to_string(m.margin) + ", over the budget of " +
            std::to_string(memory_->budget / (1 << 20)) + " MiB (raise the memory budget, or " +
            skip + ")");
  }
  if (D > 1 && s > max_tokens_)
    invalid(sample + " has " + std::to_string(s) + " tokens: split over sequence_parallel = " +
            std::to_string(D) + " ranks, each share holds " + std::to_string(held) +
            ", more than max_tokens = " + std::to_string(max_tokens_) +
            " (raise sequence_parallel or max_tokens, or " + skip + ")");
  if (s > max_tokens_)
    invalid(sample + " has " + std::to_string(s) + " tokens, more than max_tokens = " +
            std::to_string(max_tokens_) + " (raise max_tokens, or " + skip + ")");
  BatchStats whole;
  whole.add(s, f);
  invalid(sample + " (" + std::to_string(s) + " tokens) has predicted cost " +
          std::to_string(cost(whole, checkpointed_blocks(whole))) + ", more than max_cost = " +
          std::to_string(max_cost_) + " (raise max_cost, or " + skip + ")");
}

DefaultCap::DefaultCap(const CostModel& cost, const MemoryPolicy* memory, int64_t max_tokens,
                       int64_t max_batch_size)
    : cost_(cost), memory_(memory), max_tokens_(max_tokens), max_batch_size_(max_batch_size) {
  check_cap_arguments(max_tokens, max_batch_size);
}

bool DefaultCap::fits_whole(int64_t len) const {
  BatchStats one;
  one.add(len, 0.0);
  return len <= max_tokens_ && checkpointed_blocks(memory_, one) >= 0;
}

void DefaultCap::sample(int64_t len, double f) {
  BatchStats one;
  one.add(len, f);
  const double c = micro_batch_cost(cost_, memory_, one, checkpointed_blocks(memory_, one));
  heaviest_any_ = std::max(heaviest_any_, c);
  if (fits_whole(len)) heaviest_ = std::max(heaviest_, c);
}

void DefaultCap::group(int64_t len, int64_t members) {
  if (len == 0) return;  // no sample of the group fits whole
  const double f = cost_.sample_cost(len);
  int64_t fill = max_tokens_ / len;
  if (max_batch_size_ > 0) fill = std::min(fill, max_batch_size_);
  if (memory_) {
    BatchStats probe;
    probe.add(len, f);
    if (checkpointed_blocks(memory_, probe) < 0) return;
    // What memory allows without recomputation: the largest fill that checkpoints nothing (the
    // peak grows with the fill, so a bisection finds it).
    int64_t lo = 1, hi = fill;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo + 1) / 2;
      if (memory_->model.checkpointed_blocks(mid, mid * len, memory_->budget) == 0) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    fill = lo;
  }
  const BatchStats full = uniform_stats(len, f, fill, members);
  const double c = micro_batch_cost(cost_, memory_, full, checkpointed_blocks(memory_, full));
  lightest_full_ = std::min(lightest_full_, c);
  heaviest_full_ = std::max(heaviest_full_, c);
}

double DefaultCap::value() const {
  if (heaviest_ == 0.0) return heaviest_any_ > 0.0 ? heaviest_any_ : 1.0;
  // With a memory policy packing already stops where a micro-batch would need recomputation, so
  // the default cap is the one that never binds sooner: every group's micro-batches fill what
  // memory holds without recomputation, the longest samples run alone, and balancing works
  // with the costs that result.
  if (memory_) return std::max(heaviest_, heaviest_full_);
  return std::max(heaviest_, lightest_full_);
}

}  // namespace adaptiveload
