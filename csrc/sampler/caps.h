// The caps of a micro-batch and every rule that judges against them, in one place: the packing
// test, the test of a sample alone, its refusal, and the default compute cap. Both tables, the
// whole-epoch SampleTable (planner.h) and the streamed StreamTable (stream.h), consult these and
// restate none of them. Plain C++17; no torch, no Python.
//
// Units: tokens (max_tokens, a sample's S), samples (max_batch_size), the cost model's unit
// (max_cost; see CostModel), bytes (a memory policy's budget; see MemoryPolicy).
//
// The cost of a micro-batch of B samples of S_1 .. S_B tokens (BatchStats) is
//
//   cost = CostModel::batch_cost(S_1 .. S_B) * MemoryModel::time_factor(n)
//
// where n is the fewest checkpointed blocks that keep its predicted peak within the memory
// budget (no memory policy, or no such n: a factor of 1). Packing takes a group's samples in
// order into its open micro-batch; one more sample joins unless the grown micro-batch (of two or
// more samples) breaks the caps, that is when
//
//   B > max_batch_size (where > 0),   sum S_i > max_tokens,   cost > max_cost,
//   no n in [0, L] fits the budget,   or (memory policy) n > 0:
//
// under a policy a micro-batch grows only while it needs no recomputation; its samples then run
// in more micro-batches without it (the same samples, less time). A sample exceeds the caps on
// its own, and is skipped or refused rather than packed, when
//
//   S > max_tokens,   memory holds it alone with no n,   or (no memory policy) cost > max_cost;
//
// with a memory policy the compute cap binds micro-batches of two or more samples only: a sample
// over it runs alone. With sequence parallelism over up to D = max_degree ranks, a sample is
// judged by its largest share, ceil(S / D) tokens, where it is over max_tokens (it runs alone,
// split) and against memory: within both, it breaks no cap.
#pragma once

#include <cstdint>
#include <limits>

#include "sampler/cost_model.h"
#include "sampler/memory_model.h"
#include "sampler/sequence_parallel.h"

namespace adaptiveload {

/// Bounds that keep every sum of a plan within int64 (a micro-batch's, a step's, an epoch's
/// tokens) and every loop of planning bounded by the data, not by the caps' magnitude.
inline constexpr int64_t kMaxSeqLen = (int64_t{1} << 40) - 1;  ///< tokens of one sample
inline constexpr int64_t kMaxTokens = int64_t{1} << 62;  ///< max_tokens; also all samples' sum

struct PlanOptions;

/// Throws std::invalid_argument, naming it, where max_tokens is outside [1, kMaxTokens] or
/// max_batch_size < 0 (the arguments of the default compute cap of either table).
void check_cap_arguments(int64_t max_tokens, int64_t max_batch_size);

/// Blocks a micro-batch checkpoints under `memory`: the fewest n that keep it within the budget,
/// -1 where none does; 0 without a policy (nullptr).
inline int64_t checkpointed_blocks(const MemoryPolicy* memory, const BatchStats& b) {
  return memory ? memory->checkpointed_blocks(b) : 0;
}

/// The cost of a micro-batch with n = checkpointed_blocks(memory, b): the cost model's, times
/// the policy's time factor for n (no policy, or n = -1: the cost model's).
inline double micro_batch_cost(const CostModel& cost, const MemoryPolicy* memory,
                               const BatchStats& b, int64_t n) {
  const double c = cost.batch_cost(b);
  return memory && n >= 0 ? c * memory->model.time_factor(n) : c;
}

/// The stats of `fill` samples of `len` tokens and cost f each, summed one by one as packing
/// sums them, so that a micro-batch filled to the default cap costs exactly the cap. A fill
/// larger than the group's `available` samples is never packed: its sum is taken in closed
/// form, which keeps the time independent of the caps' magnitude.
BatchStats uniform_stats(int64_t len, double f, int64_t fill, int64_t available);

/// \brief The caps one plan packs under (see the header comment for the rules): each a
/// comparison or two on a micro-batch's stats, inline, so that packing pays no call for them.
/// Borrows the cost model and the memory policy, which must outlive it.
class Caps {
 public:
  /// \param memory nullptr, or the memory policy every micro-batch must obey
  /// \param max_batch_size samples per micro-batch at most; 0: no limit
  /// \param max_degree D: the most ranks a sample may be split over (1: none)
  Caps(const CostModel& cost, const MemoryPolicy* memory, int64_t max_tokens,
       int64_t max_batch_size, double max_cost, int64_t max_degree = 1)
      : cost_(&cost),
        memory_(memory),
        max_tokens_(max_tokens),
        max_batch_size_(max_batch_size),
        max_cost_(max_cost),
        max_degree_(max_degree) {}
  /// The caps of `options` (max_tokens, max_batch_size, max_cost, sequence_parallel.max_degree).
  Caps(const CostModel& cost, const MemoryPolicy* memory, const PlanOptions& options);

  int64_t max_tokens() const { return max_tokens_; }
  double max_cost() const { return max_cost_; }

  /// checkpointed_blocks(memory, b): -1 where memory holds it with no n, 0 without a policy.
  int64_t checkpointed_blocks(const BatchStats& b) const {
    return adaptiveload::checkpointed_blocks(memory_, b);
  }
  /// micro_batch_cost, with n = checkpointed_blocks(b).
  double cost(const BatchStats& b, int64_t n) const {
    return micro_batch_cost(*cost_, memory_, b, n);
  }

  /// Whether a micro-batch grown to `grown` (two or more samples) breaks the caps, given its
  /// checkpointed blocks n and its cost (what packing computes anyway).
  bool breaks(const BatchStats& grown, int64_t n, double cost) const {
    return over_size(grown) || n < 0 || (memory_ && n > 0) || cost > max_cost_;
  }
  /// The same, computing n and the cost only where the count and the tokens are within caps.
  bool breaks(const BatchStats& grown) const {
    if (over_size(grown)) return true;
    const int64_t n = checkpointed_blocks(grown);
    return n < 0 || (memory_ && n > 0) || cost(grown, n) > max_cost_;
  }

  /// Whether a sample of `len` tokens and cost f = CostModel::sample_cost(len) breaks a cap on
  /// its own: packing skips or refuses it.
  bool exceeds(int64_t len, double f) const {
    BatchStats one;
    one.add(len, f);
    if (max_degree_ == 1)
      return len > max_tokens_ || checkpointed_blocks(one) < 0 ||
             (!memory_ && cost(one, 0) > max_cost_);
    // Split over up to max_degree ranks, a sample runs alone on its shares: the largest share
    // must fit max_tokens and memory.
    BatchStats share;
    share.add(share_tokens(len, max_degree_, 0), f);
    if (len > max_tokens_) return share.tokens > max_tokens_ || share_blocks(share, len) < 0;
    return share_blocks(share, len) < 0 || (!memory_ && cost(one, 0) > max_cost_);
  }

  /// Throws std::invalid_argument saying why sample `sample` (of `len` tokens, cost f), which
  /// exceeds the caps on its own, does and how to let it in.
  [[noreturn]] void refuse(int64_t sample, int64_t len, double f) const;

 private:
  /// checkpointed_blocks of a member's `share` of a sample of `whole` tokens split over
  /// max_degree ranks (MemoryPolicy::share_blocks; 0 without a policy).
  int64_t share_blocks(const BatchStats& share, int64_t whole) const {
    return memory_ ? memory_->share_blocks(share, whole, max_degree_) : 0;
  }
  bool over_size(const BatchStats& b) const {
    return (max_batch_size_ > 0 && b.count > max_batch_size_) || b.tokens > max_tokens_;
  }

  const CostModel* cost_;
  const MemoryPolicy* memory_;
  int64_t max_tokens_;
  int64_t max_batch_size_;
  double max_cost_;
  int64_t max_degree_;
};

/// \brief The default compute cap M_comp for a memory cap, from what a table reads of its data:
///
///   max( cost of the heaviest single sample that fits whole,
///        min over groups of the cost of a micro-batch of that group filled to max_tokens )
///
/// A sample fits whole when it is within max_tokens and memory holds it alone; one that does
/// not is skipped, refused or planned split, and decides nothing. The first term admits every
/// other sample; the second stops the cap from cutting the cheapest group's micro-batches below
/// what memory allows. Micro-batches of heavy groups are then cut to about the cost of a full
/// micro-batch of light ones, which is what makes steps balanceable. A group's full micro-batch
/// holds max_tokens / S of its longest samples S that fit whole, at most max_batch_size (where
/// > 0). With a memory policy, where packing stops a micro-batch of two or more samples before
/// it would need any recomputation, the cap is the max instead of the min over groups, "full"
/// stopping there too (costs include the policy): a cap that never binds sooner, so
/// micro-batches are sized to what memory holds without recomputation, which is where the policy
/// pays. Where no sample fits whole, every sample runs split (or is skipped or refused), where
/// the cap binds no micro-batch: the heaviest single sample's cost keeps reports in scale (1
/// without samples).
///
/// A table feeds it every sample's (or every distinct) length with its f(S), then each group's
/// longest length that fits whole and how many of its samples fit whole:
///
///   DefaultCap cap(cost, memory, max_tokens, max_batch_size);
///   for each sample:  cap.sample(S, f(S));
///   for each group:   cap.group(longest S that fits whole or 0, how many fit whole);
///   return cap.value();
class DefaultCap {
 public:
  /// Throws std::invalid_argument on bad arguments (check_cap_arguments).
  DefaultCap(const CostModel& cost, const MemoryPolicy* memory, int64_t max_tokens,
             int64_t max_batch_size);
  /// Whether a sample of `len` tokens fits whole: len <= max_tokens, and memory holds it alone.
  bool fits_whole(int64_t len) const;
  void sample(int64_t len, double f);
  /// A group's longest length that fits whole (0: none does; the group is left out) and how
  /// many of its samples fit whole.
  void group(int64_t longest, int64_t members);
  double value() const;

 private:
  const CostModel& cost_;
  const MemoryPolicy* memory_;
  int64_t max_tokens_;
  int64_t max_batch_size_;
  double heaviest_ = 0.0;      // over the samples that fit whole
  double heaviest_any_ = 0.0;  // over every sample
  double lightest_full_ = std::numeric_limits<double>::infinity();
  double heaviest_full_ = 0.0;
};

}  // namespace adaptiveload
