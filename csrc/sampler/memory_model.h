// Memory model of one micro-batch with activation checkpointing, and the policy that
// spends memory headroom on speed. Plain C++17; no torch, no Python.
#pragma once

#include <cstdint>
#include <string>

#include "sampler/cost_model.h"

namespace adaptiveload {

/// \brief Predicted peak memory (bytes) of a training step on one micro-batch of B samples
/// holding T tokens in all, when the first n of the model's L blocks run with activation
/// checkpointing:
///
///   peak(B, T, n) = m0 + B * ( mb + mbk * max(L - n, 1) )
///                      + T * ( mt + ma * max(L - n, 1) + mc * n + [n > 0] * mr )
///
///   m0  fixed: weights, gradients, workspace
///   mb  per sample (text context, per-sample embeddings)
///   mbk per sample per block that keeps its activations (cross-attention over the sample's
///       text: the same for an image and a video, so it dominates micro-batches of many images)
///   mt  per token, whatever the policy (embedding, head, loss, the block input stream)
///   ma  per token per block that keeps its activations (not checkpointed). The peak comes
///       at the end of the forward, with the L - n blocks' activations alive, or, when every
///       block is checkpointed, while one block's activations are rebuilt in its backward:
///       hence max(L - n, 1) blocks (measured: n = L saves next to nothing over n = L - 1)
///   mc  per token per checkpointed block (its saved input)
///   mr  per token, once when any block is checkpointed (what recomputation adds besides)
///
/// Every coefficient is >= 0; fitted by least squares on measured peaks (fit.py).
/// `margin` >= 0 is the relative headroom the policy keeps: a micro-batch is planned
/// with n blocks only when peak(B, T, n) * (1 + margin) <= budget.
///
/// The time of a micro-batch with n checkpointed blocks, relative to one with all L
/// checkpointed, is  1 - recompute_share * (L - n) / L : `recompute_share` in [0, 1) is
/// the part of a fully checkpointed step spent recomputing forwards.
struct MemoryModel {
  /// The most blocks a model may have: far above any DiT's (tens), so a count past it is a
  /// mistake (a wrong field), refused by validate().
  static constexpr int64_t kMaxBlocks = 10000;

  int64_t num_blocks = 0;  ///< L in [1, kMaxBlocks]
  double m0 = 0.0;
  double mb = 0.0;
  double mbk = 0.0;
  double mt = 0.0;
  double ma = 0.0;
  double mc = 0.0;
  double mr = 0.0;
  double margin = 0.0;
  double recompute_share = 0.0;

  /// peak(B, T, n) in bytes; n in [0, L].
  double peak(int64_t count, int64_t tokens, int64_t checkpointed) const;
  /// The fewest checkpointed blocks n whose peak, with the margin, stays within
  /// `budget` bytes; -1 when even n = L does not. A few evaluations of peak(), whatever L.
  int64_t checkpointed_blocks(int64_t count, int64_t tokens, double budget) const;
  /// Time of a micro-batch with n checkpointed blocks relative to n = L.
  double time_factor(int64_t checkpointed) const;
  /// Throws std::invalid_argument naming the bad field.
  void validate() const;
  std::string describe() const;
};

/// A memory model with the budget it plans for: what the planner consults when given.
struct MemoryPolicy {
  MemoryModel model;
  double budget = 0.0;  ///< bytes, > 0

  /// n for a micro-batch (see MemoryModel::checkpointed_blocks).
  int64_t checkpointed_blocks(const BatchStats& b) const {
    return model.checkpointed_blocks(b.count, b.tokens, budget);
  }
};

}  // namespace adaptiveload
