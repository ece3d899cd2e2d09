// The epoch planner of the dual-constraint adaptive batch sampler.
// Plain C++17 on plain arrays; no torch, no Python.
//
// An epoch plan lists, for every optimizer step t, every data-parallel rank r and
// every micro-batch k < K of that step, the dataset indices of one micro-batch:
//
//   micro-batch id m = (t * W + r) * K + k,   samples = plan.samples[offsets[m] : offsets[m+1]]
//
// Every micro-batch obeys two caps:
//   memory:  sum_i S_i            <= max_tokens       (M_mem, tokens)
//   compute: cost(micro-batch)    <= max_cost         (M_comp, the cost model's unit;
//                                                       see CostModel for the cost)
// and, when the table has a memory policy, a third:
//   memory:  some n in [0, L] checkpointed blocks keeps the predicted peak within the
//            budget (see MemoryModel); the plan records the fewest such n per
//            micro-batch, and the micro-batch's cost is the cost model's (which describes
//            fully checkpointed micro-batches) times MemoryModel::time_factor(n).
// and never mixes group keys. With balancing on, each step's W*K micro-batches are
// drawn from a window of `lookahead_steps` steps, and then assigned to ranks, K each, by
// longest processing time first (then swaps between the slowest and the fastest rank), which
// minimizes the slowest rank of the step. How a window's micro-batches form its steps trades
// balance against how representative each step is of the data:
//
//   - the window's micro-batches are sorted by cost and cut into `strata` contiguous cost
//     strata of whole steps; each stratum's micro-batches, by group, are dealt round-robin
//     to its steps, so that a step holds the groups of its stratum in proportion;
//   - strata = steps gives steps of similar cost (the best balance, but same-shape
//     micro-batches cost the same, so a step often holds one or two groups); strata = 1
//     mixes the whole window (every step a representative draw of it);
//   - the planner takes the fewest strata (1, 2, 4, ...) whose steps keep the window's
//     predicted imbalance, the mean over its steps of 1 - mean/max rank cost, within
//     mix_tolerance; none: strata = steps.
//
// With uneven_counts, K is the average: each step still holds W*K micro-batches, but a
// rank may take any number >= 1 of them, so that a rank of one expensive micro-batch and
// a rank of several cheap ones finish the step together. A step's micro-batches stay
// contiguous, rank after rank:
//
//   micro-batch id m = rank_offsets[t * W + r] + k,   0 <= k < count(t, r) >= 1
//   count(t, r) = rank_offsets[t * W + r + 1] - rank_offsets[t * W + r]
//
// (rank_offsets[t * W] = t * W * K). The loop must then synchronize gradients once per
// step, at each rank's last micro-batch of it.
//
// With sequence parallelism (uneven counts only) a step's micro-batch of degree d is listed
// once in each of its d ranks' lists, so step t is ids [rank_offsets[t * W], rank_offsets[(t +
// 1) * W]) and holds W * K micro-batches in more listings; `degrees` and `members` say which.
#pragma once

#include <cstdint>
#include <vector>

#include "sampler/caps.h"
#include "sampler/cost_model.h"
#include "sampler/memory_model.h"
#include "sampler/plan_layout.h"
#include "sampler/sequence_parallel.h"

namespace adaptiveload {

/// Micro-batches of one step at most, W * K (kMaxSeqLen and kMaxTokens: caps.h).
inline constexpr int64_t kMaxStepMicroBatches = int64_t{1} << 20;

/// What to do with a sample that alone breaks a cap.
enum class OversizePolicy { kError, kSkip };

/// \brief The dataset as the planner sees it: one sequence length and one group key
/// per index, plus the cost model. Built once; planning an epoch reads it only.
class SampleTable {
 public:
  /// \param seq_lens   n token counts, each in [1, kMaxSeqLen], kMaxTokens at most in all
  /// \param group_ids  n dense group ids in [0, G), every id used, or nullptr; a micro-batch
  ///                   never mixes groups. The caller numbers its keys (the Python sampler:
  ///                   in sorted key order); nullptr means the key is the sequence length,
  ///                   and distinct lengths are numbered in increasing order.
  /// \param memory     nullptr, or the memory policy every micro-batch must obey.
  SampleTable(const int64_t* seq_lens, int64_t n, const int64_t* group_ids, CostModel cost,
              const MemoryPolicy* memory = nullptr);

  /// \brief A table of samples whose lengths were validated already (a streamed segment's,
  /// stream.h), built in one pass without checks: sample i has the `length_of[i]`-th of the
  /// distinct `lengths`, whose f(S) is `costs[length_of[i]]`, and group `group_ids[i]`, dense
  /// in [0, num_groups) with every id used. No memory policy.
  static SampleTable of_lengths(const int32_t* length_of, const int64_t* lengths,
                                const double* costs, const int32_t* group_ids, int64_t n,
                                int64_t num_groups, const CostModel& cost);

  int64_t size() const { return static_cast<int64_t>(samples_.size()); }
  int64_t num_groups() const { return num_groups_; }
  int64_t seq_len(int64_t i) const { return samples_[i].seq_len; }
  int32_t group(int64_t i) const { return group_[i]; }
  /// The length every sample of group g has, or 0 where its lengths differ.
  int64_t group_uniform_len(int64_t g) const { return group_uniform_len_[g]; }
  double sample_cost(int64_t i) const { return samples_[i].cost; }
  const CostModel& cost_model() const { return cost_; }
  bool has_memory_policy() const { return has_memory_; }
  const MemoryPolicy& memory_policy() const { return memory_; }
  /// The memory policy, or nullptr without one.
  const MemoryPolicy* memory() const { return has_memory_ ? &memory_ : nullptr; }
  /// The caps of `options` over this table's cost model and memory policy (caps.h).
  Caps caps(const PlanOptions& options) const { return Caps(cost_, memory(), options); }

  /// Checkpointed blocks of a micro-batch under the memory policy: -1 when it does not
  /// fit the budget, 0 without a policy.
  int64_t checkpointed_blocks(const BatchStats& b) const {
    return adaptiveload::checkpointed_blocks(memory(), b);
  }
  /// True when a micro-batch fits the memory budget (always, without a policy).
  bool fits_memory(const BatchStats& b) const { return checkpointed_blocks(b) >= 0; }
  /// The cost of a micro-batch: the cost model's, times the policy's time factor.
  double stats_cost(const BatchStats& b) const;

  /// cost(batch) for an arbitrary list of indices.
  double batch_cost(const int64_t* indices, int64_t count) const;
  /// cost of a micro-batch holding sample i alone.
  double single_cost(int64_t i) const;

  /// The default compute cap M_comp for a memory cap (DefaultCap, caps.h), over every sample.
  double default_max_cost(int64_t max_tokens, int64_t max_batch_size = 0) const;

  /// True when sample i alone breaks a cap (Caps::exceeds, caps.h: over max_tokens, over
  /// max_cost without a memory policy, or beyond the memory budget; with sequence parallelism
  /// up to `max_degree` ranks, a sample whose share fits runs alone, split). The planner uses
  /// this same test, so a sample it accepts here it accepts there.
  bool exceeds_caps(int64_t i, int64_t max_tokens, double max_cost, int64_t max_degree = 1) const;

  /// Indices of the samples that alone break a cap (see exceeds_caps), ascending.
  std::vector<int64_t> oversize_samples(int64_t max_tokens, double max_cost,
                                        int64_t max_degree = 1) const;

 private:
  SampleTable() = default;

  // Length and f(S) side by side: planning reads both for samples in random order,
  // so one cache line serves both.
  struct Sample {
    int64_t seq_len;
    double cost;
  };
  std::vector<Sample> samples_;
  std::vector<int32_t> group_;  // dense group id per sample (the caller's, or by length)
  std::vector<int64_t> group_max_len_;
  std::vector<int64_t> group_uniform_len_;  // per group: its one length, or 0
  std::vector<int64_t> group_size_;         // samples per group
  int64_t num_groups_ = 0;
  CostModel cost_;
  bool has_memory_ = false;
  MemoryPolicy memory_;
};

struct PlanOptions {
  int64_t max_tokens = 0;              ///< M_mem: tokens per micro-batch, in [1, kMaxTokens]
  int64_t max_batch_size = 0;          ///< samples per micro-batch at most; 0: no limit
  double max_cost = 0.0;               ///< M_comp: > 0 (callers pass default_max_cost() when unset)
  int64_t num_replicas = 1;            ///< W: data-parallel ranks (W * K <= kMaxStepMicroBatches)
  int64_t micro_batches_per_step = 1;  ///< K: micro-batches per rank per optimizer step
  bool shuffle = true;
  uint64_t seed = 0;
  int64_t epoch = 0;
  bool drop_last = false;
  /// Balance steps: sort each window of lookahead_steps steps by cost and assign each
  /// step's micro-batches to ranks by LPT. Off: micro-batches keep their shuffled
  /// order and go to ranks round-robin (what bucket samplers do today).
  bool balance = true;
  int64_t lookahead_steps = 64;  ///< window, in optimizer steps; >= 1
  OversizePolicy oversize = OversizePolicy::kError;
  /// Any count >= 1 of a step's W*K micro-batches per rank (K is then the average; see
  /// assign_uneven). Needs balance. Off: exactly K per rank.
  bool uneven_counts = false;
  /// Predicted imbalance, in [0, 1], a window's steps may take on to mix the data's groups
  /// (see plan_epoch). 0: steps of similar cost, as sorted (the best balance; steps often
  /// hold one or two groups). 1: every window fully mixed. The Python sampler's default is
  /// MIX_TOLERANCE in python/adaptiveload/sampler/samplers.py.
  double mix_tolerance = 0.0;
  /// Steps at least as representative as a shuffle (window_mix.h): each window takes, of the
  /// arrangements of its micro-batches into steps (cost strata dealt round-robin by group, 1 to
  /// the window's step count), the best balanced among those whose steps are as close to the
  /// window's mix of groups as uniform shuffles of the same micro-batches are, by tokens, by
  /// samples and in steps missing a major group (one stratum where none is). mix_tolerance is
  /// then unused. The Python samplers' default (composition="representative").
  bool representative = false;
  /// Sequence parallelism chosen per micro-batch (sequence_parallel.h): off by default. On, each
  /// step's micro-batches get degrees and groups that lower its slowest rank, a micro-batch of
  /// degree d is listed once per member rank (its share), and max_tokens bounds each share.
  /// Needs uneven_counts (and no memory policy).
  SequenceParallel sequence_parallel;
};

struct EpochPlan {
  int64_t num_replicas = 1;
  int64_t micro_batches_per_step = 1;
  int64_t num_steps = 0;
  std::vector<int64_t> samples;  ///< dataset indices, micro-batch after micro-batch
  std::vector<int64_t> offsets;  ///< num_micro_batches + 1 offsets into samples
  std::vector<double> costs;     ///< predicted cost per micro-batch
  std::vector<int64_t> tokens;   ///< sum of S per micro-batch
  std::vector<uint8_t> padding;  ///< 1 where a micro-batch repeats samples to fill the last step
  std::vector<int32_t> checkpointed;    ///< blocks to checkpoint per micro-batch (memory policy
                                        ///< only; empty without one)
  int64_t num_padded_samples = 0;       ///< repeated samples added (drop_last = false)
  int64_t num_dropped_samples = 0;      ///< samples left out of this epoch (drop_last = true)
  int64_t num_split_micro_batches = 0;  ///< micro-batches halved to fill whole steps
  std::vector<int64_t> skipped;         ///< samples over a cap, left out (OversizePolicy::kSkip)
  /// uneven_counts only (empty otherwise): num_steps * W + 1 micro-batch ids; those of
  /// (step t, rank r) are [rank_offsets[t * W + r], rank_offsets[t * W + r + 1]).
  std::vector<int64_t> rank_offsets;
  /// balance only: per window of lookahead_steps steps, the cost strata its steps were mixed
  /// from (1: the whole window mixed; the window's step count: steps of similar cost).
  std::vector<int64_t> window_strata;
  /// Sequence parallelism only (empty otherwise): per listed micro-batch, its degree d and this
  /// rank's place in its group (the group is ranks [r - member, r - member + d)). A micro-batch
  /// of degree d is listed d times, once per member, with that member's share of its tokens
  /// (`tokens`) and cost (`costs`); member 0's listing stands for the micro-batch.
  std::vector<int32_t> degrees;
  std::vector<int32_t> members;

  int64_t num_micro_batches() const { return static_cast<int64_t>(offsets.size()) - 1; }
  /// The plan's index arithmetic (plan_layout.h), over its own arrays.
  PlanLayout layout() const {
    return {num_replicas, micro_batches_per_step, num_steps,
            rank_offsets.empty() ? nullptr : rank_offsets.data()};
  }
  /// Micro-batches of rank r in step t: K, or any count >= 1 with uneven_counts.
  int64_t micro_batches_in_step(int64_t step, int64_t rank) const {
    return layout().micro_batches_in_step(step, rank);
  }
  int64_t micro_batch_id(int64_t step, int64_t rank, int64_t k) const {
    return layout().micro_batch_id(step, rank, k);
  }
};

/// Throws std::invalid_argument, naming the option, where `options` are out of range (what
/// plan_epoch checks first).
void check_plan_options(const PlanOptions& options);

/// \brief Plans one epoch for all ranks. Deterministic in (table, options, exclude):
/// every rank computes the same plan without communication.
/// \param exclude nullptr or table.size() flags; flagged samples are left out (used to
///                resume an epoch whose first part was already consumed).
/// Each non-excluded, non-skipped sample appears exactly once, except the repeats of
/// padding micro-batches. Throws std::invalid_argument on bad options or, with
/// OversizePolicy::kError, on the first sample that alone breaks a cap.
EpochPlan plan_epoch(const SampleTable& table, const PlanOptions& options,
                     const uint8_t* exclude = nullptr);

class Rng;

/// \brief Plans `bucketed`, the samples of an epoch (or of one segment of a streamed epoch,
/// stream.h) already grouped: group g is bucketed[group_begin[g], group_begin[g + 1]), each in
/// the order packing takes it. Steps 2 on of plan_epoch: packing under the caps, the
/// micro-batches shuffled by `order_rng` (with o.shuffle), fitted to whole steps, balanced by
/// window; the result is added to `plan` (whose `skipped` the caller filled). Appends padding
/// repeats to `bucketed`.
void plan_bucketed(const SampleTable& table, const PlanOptions& options,
                   std::vector<int64_t>& bucketed, const std::vector<int64_t>& group_begin,
                   Rng& order_rng, EpochPlan& plan);

/// \brief Assigns n_items costs to num_bins bins, exactly per_bin items each
/// (n_items = num_bins * per_bin), minimizing the largest bin sum greedily: items in
/// decreasing cost go to the least loaded bin that still has room (LPT).
/// \return bin of each item.
std::vector<int64_t> assign_to_ranks(const double* costs, int64_t n_items, int64_t num_bins,
                                     int64_t per_bin);

/// Up to this many runs of equal cost (items in decreasing cost), assign_to_ranks keeps its
/// open bins in two sorted queues merged once per run; with more, in a heap. Same result.
constexpr int64_t kLptMaxRuns = 64;

/// assign_to_ranks with the heap whatever the runs (what tests compare the queues against).
std::vector<int64_t> assign_to_ranks_heap(const double* costs, int64_t n_items, int64_t num_bins,
                                          int64_t per_bin);

/// \brief Assigns n_items >= num_bins costs to num_bins bins, any count >= 1 each,
/// minimizing the largest bin sum greedily: the num_bins largest items open one bin each,
/// every further item (in decreasing cost) goes to the least loaded bin (LPT), and then
/// an item of the most loaded bin moves to, or swaps with one of, the least loaded bin
/// while that lowers the larger of their two sums. The result is never worse than assign_to_ranks
/// with per_bin = n_items / num_bins when that divides: where it would be, that assignment is
/// returned. \return bin of each item.
std::vector<int64_t> assign_uneven(const double* costs, int64_t n_items, int64_t num_bins);

}  // namespace adaptiveload
