#include "sampler/cost_model.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>

namespace adaptiveload {

namespace {
[[noreturn]] void fail(const std::string& what) {
  throw std::invalid_argument("CostModel: " + what);
}
}  // namespace

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

CostModel CostModel::with_floor(double floor0, double floor_per_sample) const {
  CostModel m = *this;
  m.h0 = floor0;
  m.hs = floor_per_sample;
  m.validate();
  return m;
}

CostModel CostModel::with_split_kept(double kept0, double kept_per_token) const {
  CostModel m = *this;
  m.k0 = kept0;
  m.k1 = kept_per_token;
  m.validate();
  return m;
}

CostModel CostModel::with_measured(const std::vector<MeasuredKind>& kinds) const {
  CostModel m = *this;
  m.measured_.clear();
  m.shares_.clear();
  m.measured_.reserve(kinds.size());
  for (const MeasuredKind& k : kinds) {
    const std::string which =
        "measured kind (seq_len=" + std::to_string(k.seq_len) +
        ", batch=" + std::to_string(k.batch) +
        (k.degree != 1 ? ", degree=" + std::to_string(k.degree) : std::string()) + ")";
    if (k.seq_len < 1 || k.seq_len >= (int64_t{1} << 40)) fail(which + ": seq_len out of range");
    if (k.batch < 1 || k.batch >= (int64_t{1} << 24)) fail(which + ": batch out of range");
    if (k.degree < 1 || k.degree > kMaxMeasuredDegree || (k.degree & (k.degree - 1)) != 0)
      fail(which + ": degree must be a power of two in [1, " + std::to_string(kMaxMeasuredDegree) +
           "]");
    if (!std::isfinite(k.cost) || k.cost <= 0.0)
      fail(which + ": cost must be finite and > 0, got " + std::to_string(k.cost));
    const bool fresh =
        k.degree == 1
            ? m.measured_.emplace(key(k.seq_len, k.batch), k).second
            : m.shares_.emplace(std::make_pair(key(k.seq_len, k.batch), k.degree), k).second;
    if (!fresh) fail(which + " given twice");
  }
  return m;
}

std::vector<MeasuredKind> CostModel::measured() const {
  std::vector<MeasuredKind> out;
  out.reserve(measured_.size());
  for (const auto& kv : measured_) out.push_back(kv.second);
  for (const auto& kv : shares_) out.push_back(kv.second);
  std::sort(out.begin(), out.end(), [](const MeasuredKind& a, const MeasuredKind& b) {
    if (a.seq_len != b.seq_len) return a.seq_len < b.seq_len;
    return a.batch != b.batch ? a.batch < b.batch : a.degree < b.degree;
  });
  return out;
}

double CostModel::measured_share(int64_t seq_len, int64_t batch, int64_t degree) const {
  if (degree == 1) {
    auto it = measured_.find(key(seq_len, batch));
    return it != measured_.end() ? it->second.cost : 0.0;
  }
  auto it = shares_.find(std::make_pair(key(seq_len, batch), degree));
  return it != shares_.end() ? it->second.cost : 0.0;
}

double CostModel::sample_cost(int64_t seq_len) const {
  const double s = static_cast<double>(seq_len);
  if (kind == Kind::kPower) return coef * std::pow(s, p);
  return cs + c1 * s + c2 * s * s;
}

double CostModel::fitted_cost(const BatchStats& b) const {
  return std::max(h0 + hs * static_cast<double>(b.count), batch_overhead() + b.additive);
}

double CostModel::batch_cost(const BatchStats& b) const {
  if (b.uniform_len > 0 && !measured_.empty()) {
    auto it = measured_.find(key(b.uniform_len, b.count));
    if (it != measured_.end()) return it->second.cost;
  }
  return fitted_cost(b);
}

void CostModel::validate() const {
  if (!std::isfinite(h0) || h0 < 0.0) fail("h0 must be finite and >= 0, got " + std::to_string(h0));
  if (!std::isfinite(hs) || hs < 0.0) fail("hs must be finite and >= 0, got " + std::to_string(hs));
  if (!std::isfinite(k0) || k0 < 0.0) fail("k0 must be finite and >= 0, got " + std::to_string(k0));
  if (!std::isfinite(k1) || k1 < 0.0) fail("k1 must be finite and >= 0, got " + std::to_string(k1));
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
    os << "power(p=" << p << ", coef=" << coef;
  } else {
    os << "polynomial(c0=" << c0 << ", c1=" << c1 << ", c2=" << c2;
    if (cs != 0.0) os << ", per_sample=" << cs;
  }
  if (h0 != 0.0 || hs != 0.0) os << ", floor=" << h0 << "+" << hs << "*B";
  if (k0 != 0.0 || k1 != 0.0) os << ", split_kept=" << k0 << "+" << k1 << "*S";
  if (num_measured() > 0) os << ", measured kinds=" << num_measured();
  os << ")";
  return os.str();
}

}  // namespace adaptiveload
