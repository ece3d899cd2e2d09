// Cost model of one micro-batch: predicted time as a function of its samples'
// sequence lengths. Plain C++17; no torch, no Python.
#pragma once

#include <cstdint>
#include <string>

namespace adaptiveload {

/// \brief Predicted cost of a micro-batch, additive over its samples:
///
///   cost(batch) = c0 + sum_i f(S_i)
///
/// with, for the two kinds,
///   - kPower:      f(S) = coef * S^p           (the paper's B x S^p <= M_comp form; c0 = 0)
///   - kPolynomial: f(S) = cs + c1 * S + c2 * S^2  (per-sample work, linear layers, attention)
///
/// S is a sample's token count. Units are the caller's: milliseconds for a calibrated
/// polynomial, "token^p" for the power form. Only ratios between micro-batches matter
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

  static CostModel power(double p, double coef = 1.0);
  static CostModel polynomial(double c0, double c1, double c2, double cs = 0.0);

  /// f(S): the part of a micro-batch's cost that one sample of S tokens adds.
  double sample_cost(int64_t seq_len) const;
  /// The fixed part of a micro-batch's cost (0 for the power form).
  double batch_overhead() const { return kind == Kind::kPolynomial ? c0 : 0.0; }
  /// Throws std::invalid_argument naming the bad coefficient.
  void validate() const;
  std::string describe() const;
};

}  // namespace adaptiveload
