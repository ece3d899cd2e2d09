#include "sampler/cost_model.h"

#include <cmath>
#include <sstream>
#include <stdexcept>

namespace adaptiveload {

CostModel CostModel::power(double p, double coef) {
  CostModel m;
  m.kind = Kind::kPower;
  m.p = p;
  m.coef = coef;
  m.validate();
  return m;
}

CostModel CostModel::polynomial(double c0, double c1, double c2, double cs) {
  CostModel m;
  m.kind = Kind::kPolynomial;
  m.c0 = c0;
  m.c1 = c1;
  m.c2 = c2;
  m.cs = cs;
  m.validate();
  return m;
}

double CostModel::sample_cost(int64_t seq_len) const {
  const double s = static_cast<double>(seq_len);
  if (kind == Kind::kPower) return coef * std::pow(s, p);
  return cs + c1 * s + c2 * s * s;
}

void CostModel::validate() const {
  auto fail = [](const std::string& what) { throw std::invalid_argument("CostModel: " + what); };
  if (kind == Kind::kPower) {
    if (!std::isfinite(p) || p < 1.0 || p > 3.0)
      fail("p must be in [1, 3], got " + std::to_string(p));
    if (!std::isfinite(coef) || coef <= 0.0) fail("coef must be > 0, got " + std::to_string(coef));
    return;
  }
  if (!std::isfinite(c0) || c0 < 0.0) fail("c0 must be finite and >= 0, got " + std::to_string(c0));
  if (!std::isfinite(c1) || c1 < 0.0) fail("c1 must be finite and >= 0, got " + std::to_string(c1));
  if (!std::isfinite(c2) || c2 < 0.0) fail("c2 must be finite and >= 0, got " + std::to_string(c2));
  if (!std::isfinite(cs) || cs < 0.0) fail("cs must be finite and >= 0, got " + std::to_string(cs));
  if (c1 + c2 <= 0.0) fail("c1 + c2 must be > 0 (a sample must cost something)");
}

std::string CostModel::describe() const {
  std::ostringstream os;
  if (kind == Kind::kPower) {
    os << "power(p=" << p << ", coef=" << coef << ")";
  } else {
    os << "polynomial(c0=" << c0 << ", c1=" << c1 << ", c2=" << c2;
    if (cs != 0.0) os << ", per_sample=" << cs;
    os << ")";
  }
  return os.str();
}

}  // namespace adaptiveload
