// The problem every norm-modulate op poses (LayerNorm and RMSNorm, plain and gated), host side:
// input validation, the mapping from a row of x to the matching row of a broadcast operand, the
// plan for reducing the gradients of broadcast operands, the validated problems a backend's
// kernels get, and the ops' result tuples. Used by the host prologue (entry_points.h), the CPU
// kernels (cpu/) and the CUDA kernels (cuda/).
//
// Math (per row of D elements, statistics in fp32, fp64 for fp64 input):
//   LayerNorm: mean = sum(x) / D,  rstd = 1 / sqrt(sum((x - mean)^2) / D + eps)
//   RMSNorm:   mean = 0 (not computed or saved),  rstd = 1 / sqrt(sum(x^2) / D + eps)
//   xhat = (x - mean) * rstd,  xn = xhat * weight + bias   (RMSNorm: no bias)
//   y    = xn * (1 + scale) + shift
// The gated ops first form r = residual + gate * h (rounded to residual's dtype) and normalize r.
#pragma once

#include <ATen/ATen.h>

#include <initializer_list>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace adaptiveload {

// The ops' result tuples, by size: FwdN of a forward op, BwdN of a backward op.
using Fwd2 = std::tuple<at::Tensor, at::Tensor>;
using Fwd3 = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using Fwd4 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using Bwd4 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using Bwd5 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using Bwd6 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using Bwd7 =
    std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

using OptTensor = std::optional<at::Tensor>;

// Element offset of the operand row that pairs with row r of x (r over x's flattened leading
// dims): (r / inner) * outer_stride + (r % inner) * inner_stride.
struct RowMap {
  int64_t inner = 1;
  int64_t outer_stride = 0;
  int64_t inner_stride = 0;
};

inline int64_t row_offset(const RowMap& m, int64_t r) {
  return (r / m.inner) * m.outer_stride + (r % m.inner) * m.inner_stride;
}

// Expands the operand's leading dims over x's leading shape `lead` (stride 0 where broadcast),
// drops size-1 dims and merges neighbours whose strides chain. At most two dims may remain.
inline std::optional<RowMap> make_row_map(at::IntArrayRef lead, at::IntArrayRef sizes,
                                          at::IntArrayRef strides) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (size, stride), outermost first
  const int64_t pad = static_cast<int64_t>(lead.size()) - static_cast<int64_t>(sizes.size());
  for (int64_t i = 0; i < static_cast<int64_t>(lead.size()); ++i) {
    const int64_t n = lead[i];
    if (n == 1) continue;
    const int64_t j = i - pad;
    const int64_t stride = (j >= 0 && sizes[j] != 1) ? strides[j] : 0;
    if (!dims.empty() && dims.back().second == stride * n) {
      dims.back() = {dims.back().first * n, stride};
    } else {
      dims.emplace_back(n, stride);
    }
  }
  if (dims.empty()) return RowMap{};
  if (dims.size() == 1) return RowMap{dims[0].first, 0, dims[0].second};
  if (dims.size() == 2) return RowMap{dims[1].first, dims[0].second, dims[1].second};
  return std::nullopt;
}

inline at::IntArrayRef leading(const at::Tensor& t) { return t.sizes().slice(0, t.dim() - 1); }

inline bool is_supported_dtype(at::ScalarType st, bool allow_double) {
  return st == at::kBFloat16 || st == at::kHalf || st == at::kFloat ||
         (allow_double && st == at::kDouble);
}

struct NamedTensor {
  const char* name;
  const at::Tensor& tensor;
};

// The one validation helper of the LayerNorm-modulate ops. `x` is the tensor being normalized
// (x, or residual for the fused op); `broadcast` holds shift/scale/gate, which must broadcast to
// x with a last dim of D; weight and bias are optional (D,) vectors.
inline void check_inputs(const char* op, const char* x_name, const at::Tensor& x,
                         std::initializer_list<NamedTensor> broadcast,
                         const std::optional<at::Tensor>& weight,
                         const std::optional<at::Tensor>& bias) {
  const bool cpu = x.device().is_cpu();
  TORCH_CHECK(cpu || x.device().is_cuda(), op, ": ", x_name, " must be a CPU or CUDA tensor, got ",
              x.device());
  TORCH_CHECK(is_supported_dtype(x.scalar_type(), cpu), op, ": ", x_name,
              " must be bfloat16, float16 or float32", cpu ? " (or float64 on CPU)" : "", ", got ",
              x.scalar_type());
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) > 0, op, ": ", x_name,
              " must have a non-empty last dim D, got shape ", x.sizes());
  TORCH_CHECK(x.is_contiguous(), op, ": ", x_name,
              " must be contiguous (stride 1 in the last dim, rows back to back), got shape ",
              x.sizes(), " and strides ", x.strides(), "; call .contiguous() first");
  const int64_t D = x.size(-1);
  for (const auto& nt : broadcast) {
    const at::Tensor& t = nt.tensor;
    TORCH_CHECK(t.device() == x.device(), op, ": ", nt.name, " is on ", t.device(), " but ", x_name,
                " is on ", x.device());
    TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == x.scalar_type(), op, ": ",
                nt.name, " must be float32 or ", x_name, "'s dtype ", x.scalar_type(), ", got ",
                t.scalar_type());
    TORCH_CHECK(t.dim() >= 1 && t.dim() <= x.dim() && t.size(-1) == D, op, ": ", nt.name,
                " must have last dim D=", D, " and at most ", x.dim(),
                " dims, e.g. (D,), (B, 1, D)", " or ", x_name, "'s shape; got shape ", t.sizes());
    const int64_t pad = x.dim() - t.dim();
    for (int64_t i = 0; i < t.dim() - 1; ++i) {
      TORCH_CHECK(t.size(i) == 1 || t.size(i) == x.size(i + pad), op, ": ", nt.name, " of shape ",
                  t.sizes(), " is not broadcastable to ", x_name, " of shape ", x.sizes(),
                  " (each leading dim must be 1 or match)");
    }
  }
  for (const auto* p : {&weight, &bias}) {
    if (!p->has_value()) continue;
    const at::Tensor& t = **p;
    const char* name = p == &weight ? "weight" : "bias";
    TORCH_CHECK(t.device() == x.device(), op, ": ", name, " is on ", t.device(), " but ", x_name,
                " is on ", x.device());
    TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == x.scalar_type(), op, ": ", name,
                " must be float32 or ", x_name, "'s dtype ", x.scalar_type(), ", got ",
                t.scalar_type());
    TORCH_CHECK(t.dim() == 1 && t.size(0) == D, op, ": ", name, " must have shape (", D, ",), got ",
                t.sizes());
  }
}

// The fused op's h must be residual's twin: same device, shape and dtype.
inline void check_residual_pair(const char* op, const at::Tensor& residual, const at::Tensor& h) {
  TORCH_CHECK(h.device() == residual.device(), op, ": h is on ", h.device(), " but residual is on ",
              residual.device());
  TORCH_CHECK(h.sizes() == residual.sizes(), op, ": h must have residual's shape ",
              residual.sizes(), ", got ", h.sizes());
  TORCH_CHECK(h.scalar_type() == residual.scalar_type(), op, ": h must have residual's dtype ",
              residual.scalar_type(), ", got ", h.scalar_type());
}

inline at::ScalarType resolve_out_dtype(const char* op, const at::Tensor& x,
                                        std::optional<at::ScalarType> out_dtype) {
  const at::ScalarType st = out_dtype.value_or(x.scalar_type());
  TORCH_CHECK(is_supported_dtype(st, x.device().is_cpu()), op,
              ": out_dtype must be bfloat16, float16 or float32 (float64 on CPU), got ", st);
  return st;
}

// Dtype of the saved per-row statistics.
inline at::ScalarType stats_dtype(const at::Tensor& x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// A gradient input of a backward op (dy, dr) must have the normalized tensor's shape and device.
inline void check_grad_input(const char* op, const char* name, const at::Tensor& g,
                             const char* x_name, const at::Tensor& x) {
  TORCH_CHECK(g.sizes() == x.sizes() && g.device() == x.device(), op, ": ", name, " must have ",
              x_name, "'s shape ", x.sizes(), " and device ", x.device(), ", got ", g.sizes(),
              " on ", g.device());
}

// A forward op's outputs, CPU and CUDA alike: y in the resolved output dtype, and the per-row
// mean (LayerNorm only; undefined for RMSNorm) and rstd in stats_dtype(x).
struct ForwardOutputs {
  at::Tensor y, mean, rstd;
};

inline ForwardOutputs make_forward_outputs(const char* op, const at::Tensor& x,
                                           std::optional<at::ScalarType> out_dtype, bool rms) {
  ForwardOutputs o;
  o.y = at::empty(x.sizes(), x.options().dtype(resolve_out_dtype(op, x, out_dtype)));
  o.rstd = at::empty(leading(x), x.options().dtype(stats_dtype(x)));
  if (!rms) o.mean = at::empty_like(o.rstd);
  return o;
}

// A broadcast operand ready for the kernels: stride 1 in D and a RowMap over x's rows. Patterns
// that do not reduce to two dims are materialized (a correct, slower path).
struct Operand {
  at::Tensor tensor;
  RowMap map;
};

inline Operand prepare_operand(const at::Tensor& t, const at::Tensor& x) {
  at::Tensor u = (t.size(-1) == 1 || t.stride(-1) == 1) ? t : t.contiguous();
  auto map = make_row_map(leading(x), leading(u), u.strides().slice(0, u.dim() - 1));
  if (!map) {
    u = u.expand(x.sizes()).contiguous();
    map = RowMap{x.numel() / x.size(-1), 0, x.size(-1)};
  }
  return {u, *map};
}

// How the gradient of one broadcast operand (or of weight/bias) is produced.
enum class GradMode : int { kNone = 0, kGrouped = 1, kElementwise = 2 };

struct GradTarget {
  GradMode mode = GradMode::kNone;
  int64_t group = 0;  // kGrouped: rows of x per output row; they are contiguous
  at::Tensor out;     // the gradient: operand's shape and dtype, contiguous (empty if not needed)
  at::Tensor buf;     // kElementwise: one value per element of x; `out` itself or an fp32 temp
};

// Grouped when each operand row is shared by a contiguous run of x's rows (shared, per-sample);
// elementwise when every x row has its own operand row (per-token), else via an fp32 temp that
// finish_grad sums down to the operand's shape.
inline GradTarget make_grad_target(const at::Tensor& operand, const at::Tensor& x, bool needed,
                                   at::ScalarType temp_dtype) {
  GradTarget g;
  if (!needed) {
    g.out = at::empty({0}, operand.options());
    return g;
  }
  g.out = at::empty(operand.sizes(), operand.options().memory_format(at::MemoryFormat::Contiguous));
  const int64_t rows = x.numel() / x.size(-1);
  const auto lead = leading(operand);
  std::vector<int64_t> row_strides(lead.size());
  int64_t s = 1;
  for (int64_t i = static_cast<int64_t>(lead.size()) - 1; i >= 0; --i) {
    row_strides[i] = s;
    s *= lead[i];
  }
  auto map = make_row_map(leading(x), lead, row_strides);
  if (map && map->inner_stride == 0 && (map->outer_stride == 1 || map->inner == rows)) {
    g.mode = GradMode::kGrouped;
    g.group = std::max<int64_t>(map->inner, 1);
    if (map->outer_stride == 0) g.group = std::max<int64_t>(rows, 1);
  } else if (operand.numel() == x.numel()) {
    g.mode = GradMode::kElementwise;
    g.buf = g.out;
  } else {
    g.mode = GradMode::kElementwise;
    g.buf = at::empty(x.sizes(), x.options().dtype(temp_dtype));
  }
  return g;
}

inline void finish_grad(GradTarget& g) {
  if (g.mode == GradMode::kElementwise && !g.buf.is_same(g.out)) {
    g.out.copy_(g.buf.sum_to_size(g.out.sizes()));
  }
}

// Rows per group that every grouped reduction's groups are a whole number of (group sizes are
// suffix products of x's leading shape, so the smallest divides the others).
inline int64_t min_group(std::initializer_list<const GradTarget*> targets, int64_t rows) {
  int64_t g = std::max<int64_t>(rows, 1);
  for (const auto* t : targets) {
    if (t->mode == GradMode::kGrouped) g = std::min(g, t->group);
  }
  for (const auto* t : targets) {
    TORCH_INTERNAL_ASSERT(t->mode != GradMode::kGrouped || t->group % g == 0);
  }
  return g;
}

// Per-row statistics saved by a forward op, as a backward op receives them: rstd, and mean
// unless it is undefined (the RMSNorm ops save none).
inline void check_stats(const char* op, const at::Tensor& mean, const at::Tensor& rstd,
                        const at::Tensor& x) {
  const int64_t rows = x.numel() / x.size(-1);
  for (const at::Tensor* t : {&mean, &rstd}) {
    if (t == &mean && !mean.defined()) continue;
    const char* name = t == &mean ? "mean" : "rstd";
    TORCH_CHECK(t->scalar_type() == stats_dtype(x) && t->numel() == rows, op, ": ", name,
                " must be ", stats_dtype(x), " with ", rows, " elements (one per row), got ",
                t->scalar_type(), " with ", t->numel());
    TORCH_CHECK(t->device() == x.device(), op, ": ", name, " must be on ", x.device());
  }
}

// ---- what a backend's kernels get (entry_points.h builds these) ----

// A validated forward problem with its outputs allocated. For the gated op, x is residual,
// and h, gate and the output r are set: the kernels form r = residual + gate * h (rounded to
// x's dtype) and normalize r. rms: RMSNorm (no mean: `mean` is undefined, bias absent).
struct ForwardProblem {
  bool rms = false;
  const at::Tensor* x;
  const at::Tensor* h = nullptr;  // gated op: contiguous
  const Operand* gate = nullptr;
  at::Tensor* r = nullptr;
  const Operand* shift;
  const Operand* scale;
  const std::optional<at::Tensor>* weight;
  const std::optional<at::Tensor>* bias;
  double eps;
  at::Tensor* y;
  at::Tensor* mean;
  at::Tensor* rstd;
};

// Gradient targets in the kernels' slot order.
enum TargetSlot : int { kTargetShift = 0, kTargetScale, kTargetGate, kTargetWeight, kTargetBias };

// A validated backward problem with its outputs allocated. x is the normalized tensor (r for
// the gated op, with dr, h and gate set). dx is x's gradient (dresidual for the gated op: dr
// plus the norm's backward), empty when not needed and no gated gradient depends on it.
// rms: RMSNorm (mean undefined, bias absent).
struct BackwardProblem {
  bool rms = false;
  const at::Tensor* dy;
  const at::Tensor* x;
  const at::Tensor* dr = nullptr;  // gated op; may be undefined
  const at::Tensor* h = nullptr;   // gated op; contiguous
  const Operand* gate = nullptr;   // gated op
  const Operand* scale;
  const std::optional<at::Tensor>* weight;
  const std::optional<at::Tensor>* bias;
  const at::Tensor* mean;
  const at::Tensor* rstd;
  at::Tensor* dx;
  at::Tensor* dh = nullptr;  // gated op; empty when not needed
  GradTarget* targets[5];    // by TargetSlot; mode kNone when not needed
};

}  // namespace adaptiveload
