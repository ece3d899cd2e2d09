// Plans that stream: an epoch planned segment by segment, when the loop reaches each, so that
// neither the plan nor a copy of the dataset's lengths is ever held whole.
//
// The epoch's order is a keyed permutation of the dataset (Permutation: position p -> sample,
// computed, never stored; the key is (seed, epoch)). It is cut into segments: segment j covers
// positions [begin_j, begin_{j+1}). Each segment is planned alone, exactly as plan_epoch plans an
// epoch (planner.h: grouped, packed under both caps, micro-batches shuffled, windows of
// lookahead_steps steps balanced and mixed), from its samples in permutation order. A segment
// holds at least `min_samples` positions and ends at the first position after that where its
// micro-batches fill whole windows of lookahead_steps steps of W * K micro-batches (whole steps
// without balancing). So only the epoch's last segment is fitted to steps (halved, padded or
// dropped, as plan_epoch fits an epoch), every window but the epoch's last is whole, as in a
// plan of the whole epoch, and where segment j + 1 starts depends only on where j started:
// (epoch, j, begin_j) locates any point of the epoch.
//
// What a process holds: the dataset's lengths and group ids, borrowed (a memory-mapped file that
// every rank process of a node shares), a few numbers per distinct length and per group, and
// one segment's plan. Memory policies are not supported here (SampleTable is the table for
// those); sequence parallelism options pass through to plan_bucketed but are not yet exposed or
// tested by the streaming sampler.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <utility>
#include <vector>

#include "sampler/caps.h"
#include "sampler/cost_model.h"
#include "sampler/planner.h"

namespace adaptiveload {

/// \brief Thrown where planning reads a length or a group id the table was not built from: the
/// borrowed arrays changed under it (a memory-mapped file rewritten in place). An
/// std::invalid_argument, so that Python sees a ValueError.
class DataChanged : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// \brief The dataset as a streamed plan reads it: borrowed arrays of one length and at most one
/// group id per sample (int32 or int64 each), which must outlive the table. Built with one
/// sequential pass that validates them and counts per distinct length and per group.
///
/// The arrays are read again while planning, and may have changed since (a memory-mapped file
/// rewritten in place): every value planning reads goes through length_index and group, which
/// check it against what the table was built from (a length among its distinct lengths, a group
/// id in [0, num_groups())) and throw DataChanged where it is not, before anything is indexed by
/// it. A change to values the table holds (one known length for another) is not seen here: the
/// digest, or the caller's look at the file, tells that.
class StreamTable {
 public:
  /// \param seq_lens    n lengths, each in [1, kMaxSeqLen], kMaxTokens at most in all
  /// \param lens_width  4 (int32) or 8 (int64)
  /// \param group_ids   nullptr (the key is the length) or n dense ids in [0, G), every id used
  /// \param group_width 4 or 8 (ignored without group ids)
  StreamTable(const void* seq_lens, int lens_width, int64_t n, const void* group_ids,
              int group_width, CostModel cost);

  int64_t size() const { return n_; }
  int64_t num_groups() const { return num_groups_; }
  const CostModel& cost_model() const { return cost_; }
  /// A 64-bit digest of every length and group id, in order (what a resumed state checks).
  uint64_t digest() const { return digest_; }

  /// Sample i's length as stored now, unchecked (see length_index).
  int64_t seq_len(int64_t i) const {
    return lens_width_ == 4 ? static_cast<const int32_t*>(lens_)[i]
                            : static_cast<const int64_t*>(lens_)[i];
  }
  /// The index among the distinct lengths of `len`, sample i's length as read: a lookup in a
  /// dense table for short lengths, a bisection for long ones. Throws DataChanged where the
  /// table has no such length.
  int32_t length_index(int64_t i, int64_t len) const {
    if (static_cast<uint64_t>(len) < length_slot_.size()) {  // a negative len is not
      const int32_t j = length_slot_[len];
      if (j >= 0) return j;
      length_changed(i, len);
    }
    return long_length_index(i, len);
  }
  /// Sample i's group: its id (checked to be in [0, num_groups()), else DataChanged), or
  /// without group ids the index of its length.
  int32_t group(int64_t i) const {
    if (!groups_) return length_index(i, seq_len(i));
    const int64_t g = group_width_ == 4 ? static_cast<const int32_t*>(groups_)[i]
                                        : static_cast<const int64_t*>(groups_)[i];
    if (static_cast<uint64_t>(g) >= static_cast<uint64_t>(num_groups_)) group_changed(i, g);
    return static_cast<int32_t>(g);
  }
  bool has_group_ids() const { return groups_ != nullptr; }
  /// The distinct lengths, increasing: how many, the j-th, and its cost f(S).
  int64_t num_lengths() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t length(int64_t j) const { return lengths_[j]; }
  double length_cost(int64_t j) const { return length_cost_[j]; }
  const int64_t* lengths_data() const { return lengths_.data(); }
  const double* length_costs_data() const { return length_cost_.data(); }

  /// The caps of `options` over this table's cost model (caps.h; no memory policy).
  Caps caps(const PlanOptions& options) const { return Caps(cost_, nullptr, options); }
  /// The default compute cap (DefaultCap, caps.h), over the distinct lengths.
  double default_max_cost(int64_t max_tokens, int64_t max_batch_size = 0) const;
  /// (how many samples alone break a cap (Caps::exceeds), the first of them or -1): a pass over
  /// the lengths only when some distinct length breaks one.
  std::pair<int64_t, int64_t> oversize(int64_t max_tokens, double max_cost,
                                       int64_t max_degree) const;

 private:
  int32_t long_length_index(int64_t i, int64_t len) const;
  [[noreturn]] void length_changed(int64_t i, int64_t len) const;
  [[noreturn]] void group_changed(int64_t i, int64_t g) const;

  const void* lens_;
  int lens_width_;
  int64_t n_;
  const void* groups_;
  int group_width_;
  CostModel cost_;
  std::vector<int64_t> lengths_;        // distinct lengths, increasing
  std::vector<int64_t> length_count_;   // samples per distinct length
  std::vector<double> length_cost_;     // f(S) per distinct length
  std::vector<int32_t> length_slot_;    // length -> index into lengths_ (-1: none), short lengths
  std::vector<int64_t> group_max_len_;  // per group
  std::vector<int64_t> group_size_;     // per group
  int64_t num_groups_ = 0;
  uint64_t digest_ = 0;
};

/// Instruction sets Permutation::fill has builds for (x86-64; elsewhere only the baseline).
enum class VectorIsa { kBaseline, kAvx2, kAvx512 };

/// \brief A keyed permutation of [0, n): a Feistel network over the smallest even power of two
/// >= n, walked until it lands below n. Identity without shuffle.
class Permutation {
 public:
  Permutation(int64_t n, uint64_t seed, int64_t epoch, bool shuffle);
  int64_t operator()(int64_t position) const;
  /// out[j] = (*this)(begin + j) for j < count: the same values, a block at a time (the
  /// network's rounds on several positions at once, in vector registers where the processor
  /// has them).
  void fill(int64_t begin, int64_t count, int64_t* out) const;
  /// As fill, with the build for `isa` (tests compare them); throws where the processor lacks it.
  void fill_with(VectorIsa isa, int64_t begin, int64_t count, int64_t* out) const;
  /// Whether this processor runs the build for `isa` (the baseline: always).
  static bool supports(VectorIsa isa);
  int64_t size() const { return n_; }

  /// The network's rounds on `count` values in place, as one build has them.
  using FeistelFn = void (*)(uint64_t* x, int64_t count, const uint64_t* keys, int half_bits,
                             uint64_t mask);

 private:
  uint64_t feistel(uint64_t x) const;
  void fill_blocks(FeistelFn rounds, int64_t begin, int64_t count, int64_t* out) const;
  int64_t n_;
  bool identity_;
  int half_bits_ = 1;
  uint64_t mask_ = 1;
  uint64_t keys_[4] = {0, 0, 0, 0};
};

/// One segment of a streamed epoch: positions [begin, end) of the permutation.
struct Segment {
  int64_t begin = 0;
  int64_t end = 0;
  std::vector<int64_t> samples;    ///< its samples in permutation order, those over a cap left out
  std::vector<int32_t> length_of;  ///< the length of each of `samples`, as read: its index
                                   ///< among the table's distinct lengths
  std::vector<int32_t> groups;     ///< the group of each of `samples`, as read
  std::vector<int64_t> skipped;    ///< its samples over a cap (OversizePolicy::kSkip)
};

/// \brief The segment that starts at position `begin`: at least `min_samples` positions
/// (>= 1), then up to the first position where its micro-batches fill whole windows and at
/// least `min_samples` positions are left, or to the epoch's end. `prefix` (`prefix_count`
/// samples) come first, before the positions, and count towards its windows: what a resume
/// under other settings re-plans of a segment of the old ones joins the next (begin may then
/// be perm.size(): the prefix alone ends the epoch). Throws std::invalid_argument on bad
/// options and on a sample over a cap under OversizePolicy::kError (Caps::refuse), DataChanged
/// on a length or group id the table was not built from.
Segment next_segment(const StreamTable& table, const PlanOptions& options, const Permutation& perm,
                     int64_t begin, int64_t min_samples, const int64_t* prefix = nullptr,
                     int64_t prefix_count = 0);

/// \brief The plan of a segment (next_segment's, same options), as plan_samples plans its
/// samples with `key`, without reading them again.
EpochPlan plan_segment(const StreamTable& table, const PlanOptions& options, Segment&& segment,
                       uint64_t key);

/// \brief The plan of `count` samples, in the order given (a segment's, or what is left of one
/// after a resume under other settings), as plan_epoch plans an epoch of them; `key` keys the
/// shuffle of its micro-batches (with options.epoch and options.seed). Samples over a cap are
/// skipped or refused per options.oversize; DataChanged as next_segment. Dataset indices in the
/// plan are the table's.
EpochPlan plan_samples(const StreamTable& table, const PlanOptions& options, const int64_t* samples,
                       int64_t count, uint64_t key);

}  // namespace adaptiveload
