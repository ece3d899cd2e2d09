// Memory model of one micro-batch with activation checkpointing, and the policy that
// spends memory headroom on speed. Plain C++17; no torch, no Python.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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
/// `held` (bytes, >= 0) is memory per kept block beyond the micro-batch's own activations: a
/// member of a split micro-batch at a degree the model's heads do not divide (Ulysses x ring)
/// holds the whole samples' keys and values for its head shard (MemoryPolicy::held_per_token);
/// it adds held * max(L - n, 1).
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

  /// peak(B, T, n) in bytes, plus `held` per kept block; n in [0, L].
  double peak(int64_t count, int64_t tokens, int64_t checkpointed, double held = 0.0) const;
  /// The fewest checkpointed blocks n whose peak, with the margin, stays within
  /// `budget` bytes; -1 when even n = L does not. A few evaluations of peak(), whatever L.
  int64_t checkpointed_blocks(int64_t count, int64_t tokens, double budget,
                              double held = 0.0) const;
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
  /// held_per_token[k]: bytes per token of a micro-batch per kept block that a member of it
  /// split over 2^k ranks holds beyond its share (the ring's keys and values of the whole
  /// samples, where the model's heads do not divide 2^k: adaptiveload/cost.py,
  /// sequence_parallel_held_bytes_of); 0 where absent. Each finite and >= 0.
  std::vector<double> held_per_token;

  /// n for a micro-batch (see MemoryModel::checkpointed_blocks).
  int64_t checkpointed_blocks(const BatchStats& b) const {
    return model.checkpointed_blocks(b.count, b.tokens, budget);
  }
  /// n for one member's share of a micro-batch of `whole_tokens` split over `degree` ranks:
  /// `share` holds the member's samples and tokens.
  int64_t share_blocks(const BatchStats& share, int64_t whole_tokens, int64_t degree) const {
    return model.checkpointed_blocks(share.count, share.tokens, budget,
                                     held(degree) * static_cast<double>(whole_tokens));
  }
  /// held_per_token at `degree` (0 at 1 and where absent).
  double held(int64_t degree) const {
    const size_t level = degree_level(degree);
    return degree > 1 && level < held_per_token.size() ? held_per_token[level] : 0.0;
  }
  /// Throws std::invalid_argument naming a bad held_per_token (the model is validated apart).
  void validate() const;
};

}  // namespace adaptiveload
