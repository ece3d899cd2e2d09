// How representative a window's steps are of the window's data: the measure the planner's
// `representative` rule (PlanOptions) holds each window to, against uniform shuffles of the same
// micro-batches. The epoch-level measure users see is adaptiveload.composition (Python); this
// is the same measure over one window.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace adaptiveload {

/// (cost, micro-batch id) of a window's micro-batch.
using Item = std::pair<double, int64_t>;

/// Means over a window's steps of the total-variation distance between each group's share of
/// the step's tokens (samples) and its share of the window's, and of the share of the window's
/// major groups (over kMajorShare of its tokens or samples) a step lacks. The last counts each
/// group a step lacks, not only whether it lacks one: with few micro-batches a step, most steps
/// of a shuffle lack some group, and which ones (a modality, all the images) is what matters.
struct StepMix {
  double tokens = 0.0;
  double samples = 0.0;
  double missing = 0.0;
  /// Share of steps lacking the short or the long samples (where each holds over kMajorShare of
  /// the window's tokens or samples): groups split at the geometric mean of the shortest and
  /// the longest group's mean length, which on a video mix parts images from clips.
  double lacking_kind = 0.0;
  /// As representative as the shuffles' mean `bar` is, up to the slack of an 8-draw estimate:
  /// distances within kShuffleSlack of the bar's, and no more groups missing than the bar (a
  /// plan faster than a shuffle at one sample per micro-batch puts its long clips together, and
  /// the slack would let steps without a clip, or without an image, add up over the epoch).
  bool within(const StepMix& bar) const;
  void add(const StepMix& one, double weight) {
    tokens += weight * one.tokens;
    samples += weight * one.samples;
    missing += weight * one.missing;
    lacking_kind += weight * one.lacking_kind;
  }
};

/// Relative slack on the shuffles' measure: what a bar estimated from a few shuffles may be off
/// by, inside what the library promises over the epoch (1.10x a shuffle's distance, steps
/// without an image within 3 points of a shuffle's).
constexpr double kShuffleSlack = 0.05;
/// Absolute slack on the share of steps lacking a kind: the epoch's promise is 3 points.
constexpr double kLackingSlack = 0.015;

/// A group holding more than this share of the window's tokens or samples counts as missing
/// from a step without it (as adaptiveload.composition counts it over the epoch).
constexpr double kMajorShare = 0.05;

class WindowMix {
 public:
  /// The window's micro-batches are ids [first, first + n); group, tokens and samples of each.
  WindowMix(int64_t first, const std::vector<int32_t>& group, const std::vector<int64_t>& tokens,
            const std::vector<int64_t>& samples);

  /// The measure of `arranged` (steps of per_step items each, step after step).
  StepMix measure(const std::vector<Item>& arranged, int64_t steps, int64_t per_step);

 private:
  int64_t first_;
  // Per micro-batch of the window, together (measure reads them in the arrangement's order,
  // one cache line per micro-batch): its group's place, samples and tokens.
  struct Entry {
    int32_t place;
    int32_t samples;
    int64_t tokens;
  };
  std::vector<Entry> entry_;
  std::vector<double> share_tokens_, share_samples_;  // per group place: window shares
  std::vector<uint8_t> major_;                        // per group place: over kMajorShare
  int64_t num_major_ = 0;
  std::vector<uint8_t> long_;  // per group place: of the long kind
  bool kinds_major_[2] = {false, false};
  // Per group place, scratch of one step.
  std::vector<int64_t> step_tokens_, step_samples_;
  std::vector<int32_t> touched_;
};

}  // namespace adaptiveload
