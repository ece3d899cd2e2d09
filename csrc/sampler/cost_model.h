// Cost model of one micro-batch: predicted time as a function of its samples'
// sequence lengths. Plain C++17; no torch, no Python.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace adaptiveload {

/// What the cost of a micro-batch depends on, accumulated sample by sample while packing.
struct BatchStats {
  int64_t count = 0;        ///< samples
  int64_t tokens = 0;       ///< sum of S_i
  double additive = 0.0;    ///< sum of f(S_i)
  int64_t uniform_len = 0;  ///< S when every sample has S tokens; -1 once lengths differ

  void add(int64_t seq_len, double sample_cost) {
    if (count == 0) {
      uniform_len = seq_len;
    } else if (uniform_len != seq_len) {
      uniform_len = -1;
    }
    ++count;
    tokens += seq_len;
    additive += sample_cost;
  }
};

/// The largest degree a measured share may have.
constexpr int64_t kMaxMeasuredDegree = 1024;

/// k of degree 2^k: a degree's index in the per-degree lists (the smallest k with 2^k >= d).
inline size_t degree_level(int64_t degree) {
  size_t level = 0;
  while ((int64_t{1} << level) < degree) ++level;
  return level;
}

/// A measured micro-batch kind: `batch` samples of `seq_len` tokens took `cost`. With
/// `degree` d > 1 it is one rank's share of that micro-batch split d ways (sequence
/// parallelism: each sample's tokens cut into d pieces), timed as exactly that share on one
/// GPU, communication not included.
struct MeasuredKind {
  int64_t seq_len;
  int64_t batch;
  double cost;
  int64_t degree = 1;  ///< a power of two, 1 for a whole micro-batch
};

/// \brief Predicted cost of a micro-batch. Two layers, the first that applies wins:
///
///  1. measured: a micro-batch of B samples of S tokens each whose (S, B) was measured
///     costs exactly what was measured (and a rank's share of it split d ways, where
///     (S, B, d) was: measured_share);
///  2. the fitted form, for everything else:
///       cost(batch) = max( h0 + hs * B,  c0 + sum_i f(S_i) )
///     with f, for the two kinds,
///       - kPower:      f(S) = coef * S^p           (the paper's B x S^p <= M_comp form; c0 = 0)
///       - kPolynomial: f(S) = cs + c1 * S + c2 * S^2  (per-sample work, linear layers,
///                                                      attention)
///     The floor h0 + hs * B (0 unless fitted) is the time below which a micro-batch does not
///     go however small its samples: the host's launch time, which the GPU then waits on.
///
/// S is a sample's token count. Units are the caller's: milliseconds for a calibrated
/// model, "token^p" for the power form. Only ratios between micro-batches matter
/// to the planner, and the compute cap M_comp is in the same unit.
struct CostModel {
  enum class Kind { kPower, kPolynomial };

  Kind kind = Kind::kPower;
  double p = 1.5;     ///< exponent of the power form, in [1, 3]
  double coef = 1.0;  ///< scale of the power form, > 0
  double c0 = 0.0;    ///< fixed cost per micro-batch (polynomial form), >= 0
  double c1 = 0.0;    ///< cost per token (polynomial form), >= 0
  double c2 = 0.0;    ///< cost per token^2 (polynomial form), >= 0; c1 + c2 > 0
  double cs = 0.0;    ///< cost per sample (polynomial form), >= 0: work that does not grow with S
  double h0 = 0.0;    ///< floor per micro-batch, >= 0
  double hs = 0.0;    ///< floor per sample, >= 0
  /// Split kept, k0 + k1 * S per sample, >= 0: the part of a sample's fitted cost that a share
  /// over d ranks (sequence parallelism) still pays in full rather than 1/d of (the text's
  /// projections, the timestep, shards too short to run the GPU at full speed). 0 unless set.
  double k0 = 0.0;
  double k1 = 0.0;

  static CostModel power(double p, double coef = 1.0);
  static CostModel polynomial(double c0, double c1, double c2, double cs = 0.0);

  /// A copy with the floor h0 + hs * B.
  CostModel with_floor(double floor0, double floor_per_sample) const;
  /// A copy whose shares keep k0 + k1 * S of each sample whole (see k0, k1).
  CostModel with_split_kept(double kept0, double kept_per_token) const;
  /// k0 + k1 * S: what a share keeps whole of one sample of S tokens.
  double split_kept(int64_t seq_len) const { return k0 + k1 * static_cast<double>(seq_len); }
  /// A copy whose measured kinds are `kinds` (replacing any it had). Throws on a bad entry
  /// or a kind given twice.
  CostModel with_measured(const std::vector<MeasuredKind>& kinds) const;
  /// The measured kinds, by increasing (seq_len, batch, degree).
  std::vector<MeasuredKind> measured() const;
  int64_t num_measured() const { return static_cast<int64_t>(measured_.size() + shares_.size()); }
  /// What one rank's share of B samples of S tokens split `degree` ways was measured at
  /// (degree 1: the whole micro-batch); 0 where it was not measured.
  double measured_share(int64_t seq_len, int64_t batch, int64_t degree) const;

  /// f(S): the part of a micro-batch's fitted cost that one sample of S tokens adds.
  double sample_cost(int64_t seq_len) const;
  /// The fixed part of a micro-batch's fitted cost (0 for the power form).
  double batch_overhead() const { return kind == Kind::kPolynomial ? c0 : 0.0; }
  /// The cost of a micro-batch from its stats (`additive` = sum of sample_cost).
  double batch_cost(const BatchStats& b) const;
  /// The fitted form only (layer 2), ignoring measurements.
  double fitted_cost(const BatchStats& b) const;
  /// Throws std::invalid_argument naming the bad coefficient.
  void validate() const;
  std::string describe() const;

 private:
  static uint64_t key(int64_t seq_len, int64_t batch) {
    return (static_cast<uint64_t>(seq_len) << 24) ^ static_cast<uint64_t>(batch);
  }
  // (seq_len, batch) -> measured cost. Keys: seq_len < 2^40, batch < 2^24 (checked).
  std::unordered_map<uint64_t, MeasuredKind> measured_;
  // (key(seq_len, batch), degree) -> measured share, degree > 1. Read only while planning
  // with sequence parallelism, once per micro-batch and degree.
  std::map<std::pair<uint64_t, int64_t>, MeasuredKind> shares_;
};

}  // namespace adaptiveload
