// Sequence parallelism chosen per micro-batch: the degree d of each micro-batch of a step (how
// many ranks process it together, each on its own 1/d of every sample's tokens), the group of d
// ranks that does, and the order each rank runs its shares in. Plain C++17; no torch, no Python.
//
// Groups are aligned: a micro-batch of degree d runs on ranks [g * d, (g + 1) * d) for some g,
// and d is a power of two dividing W. Each rank runs its step's shares by decreasing degree (all
// of degree 8, then 4, then 2, then its own micro-batches), and the members of a group run their
// shared micro-batches in one order, so that the collectives of overlapping groups are entered
// in the same order on every rank (no deadlock) and a group starts when its slowest member is
// free: the step's finish times below include that wait.
//
// One rank's share of a micro-batch of cost c split d ways (the cost model's unit):
//
//   share(d) = measured(d) * f(d) + comm(d)                           where (S, B, d) was measured
//   share(d) = max(floor, (fixed + (c - fixed) / d) * f(d)) + comm(d) elsewhere
//   comm(d)  = comm_fraction * (c - fixed) / d + comm_per_token * g(d) * T * (d - 1) / d^2
//              (d >= 2)
//
// measured(d): the cost model's measured share of this kind (B samples of S tokens, split d
// ways, timed on one GPU as exactly one member's share); fixed: what splitting does not
// shrink, the cost model's per-micro-batch term and its samples' split_kept; floor: its host
// floor (launch time), which every share pays in full; f(d): 1, or with a memory policy the
// time factor of the blocks a member checkpoints to hold its share (c is then the cost fully
// checkpointed);
// T: the micro-batch's tokens. Ulysses moves, per attention layer,
// four all-to-alls of each rank's T / d tokens, of which (d - 1) / d leave the rank: comm_per_token
// is what one token costs to send through all of them, forward and backward (see
// adaptiveload/cost.py, ulysses_comm_per_token). g(d): 1, or where d exceeds what the model's
// heads take the ring's factor on those bytes (Ulysses x ring holds each sample's keys and values
// whole per head shard: adaptiveload/parallel/groups.py, ring_comm_factor; 1.43 at 8 ranks over
// 12 heads). comm_fraction is a flat share where no bandwidth is known.
#pragma once

#include <cstdint>
#include <vector>

namespace adaptiveload {

struct SequenceParallel {
  int64_t max_degree = 1;       ///< D: 1 turns it off; else a power of two dividing W
  double comm_per_token = 0.0;  ///< cost units per token a rank sends, >= 0
  double comm_fraction = 0.0;   ///< share of the split compute added for d >= 2, >= 0
  /// comm_scale[k]: g(2^k), the factor on comm_per_token at degree 2^k, > 0 (1 where absent).
  std::vector<double> comm_scale;
  bool enabled() const { return max_degree > 1; }
};

/// A micro-batch of a step, as degrees see it.
struct SpItem {
  double cost = 0.0;       ///< the cost model's, whole on one rank
  double fixed = 0.0;      ///< the part of it splitting does not shrink
  double floor = 0.0;      ///< the host floor of the micro-batch
  int64_t tokens = 0;      ///< T: all its samples' tokens
  int64_t min_degree = 1;  ///< the fewest ranks whose shares fit max_tokens (and memory)
  /// measured[k]: the measured share at degree 2^k, 0 where not measured (may be short).
  std::vector<double> measured;
  /// With a memory policy: what the shares split (the cost fully checkpointed; < 0: `cost`),
  /// and per degree 2^k the blocks a member checkpoints (-1: its share does not fit) and the
  /// time factor of its compute (planner.h); empty without one.
  double compute = -1.0;
  std::vector<int64_t> checkpointed;
  std::vector<double> factor;
};

/// One rank's share of `item` split over `d` ranks (see the header comment).
double share_cost(const SpItem& item, int64_t d, const SequenceParallel& sp);

/// Tokens of member `member` of `d` of one sample of `seq_len` tokens: the sample is cut into d
/// contiguous pieces, the first seq_len % d of them one token longer.
inline int64_t share_tokens(int64_t seq_len, int64_t d, int64_t member) {
  return seq_len / d + (member < seq_len % d ? 1 : 0);
}

/// A step's micro-batches with degrees: each item's degree and first rank, and each rank's
/// items in the order it runs them.
struct SpStep {
  std::vector<int64_t> degree;                   ///< per item
  std::vector<int64_t> first_rank;               ///< per item: its group is [first, first + d)
  std::vector<std::vector<int64_t>> rank_items;  ///< per rank, items in run order
  double makespan = 0.0;  ///< when the last rank finishes (waits for groups included)
  double busy = 0.0;      ///< sum over ranks of their shares' costs
  /// The rank time of the step's work split no more than it must: over the items, min_degree
  /// times the share there (the whole cost where it fits one rank).
  double reference = 0.0;
  /// 1 - busy / (W * makespan): the share of the step's rank time spent waiting.
  double imbalance(int64_t W) const {
    return makespan > 0.0 ? 1.0 - busy / (static_cast<double>(W) * makespan) : 0.0;
  }
  /// 1 - reference / (W * makespan): the share of the step's rank time lost, to waiting and to
  /// what splitting adds (a share of d ranks costs more than 1/d of the whole: the per-sample
  /// work, the launch floor, the all-to-alls). What mix_tolerance bounds.
  double lost(int64_t W) const {
    return makespan > 0.0 ? 1.0 - reference / (static_cast<double>(W) * makespan) : 0.0;
  }
};

/// \brief Degrees and groups for one step's `items` over `W` ranks, lowering the step's
/// makespan. The best of three starts (every item at its min_degree; the degrees of a target
/// finish time, bisected; every item at one degree) is improved by a local search that doubles
/// or halves one degree at a time while the step's score improves (makespan, then ranks at it,
/// then busy time). Each rank gets at least one item. Throws std::invalid_argument where an
/// item's min_degree exceeds max_degree or the items cannot give every rank one.
SpStep assign_with_degrees(const std::vector<SpItem>& items, int64_t W, const SequenceParallel& sp);

/// Throws std::invalid_argument unless `sp` suits W ranks (the degree a power of two dividing W).
void validate_sequence_parallel(const SequenceParallel& sp, int64_t W);

}  // namespace adaptiveload
