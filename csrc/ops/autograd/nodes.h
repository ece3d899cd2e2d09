// Autograd of the ops (LayerNorm and RMSNorm, plain and gated), in C++ (the Autograd dispatch
// key), written as ATen writes its own. This header holds what every variant shares: the graph
// nodes (one template for the plain ops, one for the gated, each over the variant's index in
// kVariants) and the double backward's formulas; autograd/autograd.cpp holds the forward of
// every variant (what it saves) and their registration. Each forward creates a graph node (a
// torch::autograd::Node) when an input requires grad, saves its input (or r, for the gated ops),
// the small operands and the per-row statistics (mean and rstd; rstd alone for RMSNorm), and the
// node's backward calls the op's registered backward (_layer_norm_modulate_backward, ...) with
// the mask of gradients the graph wants. A plain Node costs the host less than a
// torch::autograd::Function (no context object, no saved-data dictionary, no output wrapping),
// and a Python autograd formula cost more than the four eager ops the fused op replaces.
//
// Double backward (create_graph=True: gradient penalties, Hessian-vector products): the fused
// backward kernels give first-order gradients only, so then the gradients are formed by the same
// formulas in ATen ops (backward_graph), which autograd differentiates again.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/version.h>

#include <algorithm>
#include <array>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

#include "../signatures.h"

namespace adaptiveload {
namespace autograd_detail {

using torch::autograd::Node;
using torch::autograd::SavedVariable;
using torch::autograd::variable_list;

// How torch holds a graph node: std::shared_ptr (deleted by torch::autograd::deleteNode, which
// frees long chains without deep recursion) up to torch 2.12, c10::intrusive_ptr from 2.13.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 13)
template <typename N>
using NodePtr = c10::intrusive_ptr<N>;
template <typename N>
NodePtr<N> new_node() {
  return c10::make_intrusive<N>();
}
#else
template <typename N>
using NodePtr = std::shared_ptr<N>;
template <typename N>
NodePtr<N> new_node() {
  return NodePtr<N>(new N(), torch::autograd::deleteNode);
}
#endif

// Whether the gradient of shift is dy itself: shift per token (x's shape, so nothing is summed)
// and of dy's dtype. The backward then neither computes nor writes it (a sixth of the bytes a
// per-token backward moves); autograd passes dy on, as it does for an addition.
inline bool shift_grad_is_dy(bool wanted, const at::Tensor& shift, const at::Tensor& dy) {
  return wanted && shift.sizes() == dy.sizes() && shift.scalar_type() == dy.scalar_type();
}

inline at::ScalarType acc_type(const at::Tensor& x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// (dx, dshift, dscale, dweight, dbias) of y = ((x - mean) * rstd * w + b) * (1 + scale) + shift
// in differentiable ATen ops; undefined where mask is false (or weight / bias absent). rms:
// RMSNorm (mean = 0, so dx has no mean(g) term).
inline std::array<at::Tensor, 5> backward_graph(const at::Tensor& x, const at::Tensor& shift,
                                                const at::Tensor& scale, const at::Tensor& weight,
                                                const at::Tensor& bias, const at::Tensor& dy,
                                                double eps, const std::array<bool, 5>& mask,
                                                bool rms) {
  const auto acc = acc_type(x);
  const at::Tensor xf = x.to(acc), g_out = dy.to(acc);
  const at::Tensor xc = rms ? xf : xf - xf.mean(-1, true);
  const at::Tensor rstd = at::rsqrt(xc.square().mean(-1, true) + eps);
  const at::Tensor xhat = xc * rstd;
  const at::Tensor w = weight.defined() ? weight.to(acc) : at::Tensor();
  at::Tensor z = w.defined() ? xhat * w : xhat;
  if (bias.defined()) z = z + bias.to(acc);
  const at::Tensor g_z = g_out * (scale.to(acc) + 1);  // d/dz
  const at::Tensor g_xhat = w.defined() ? g_z * w : g_z;
  std::array<at::Tensor, 5> out;
  if (mask[0]) {
    const at::Tensor centred = rms ? g_xhat : g_xhat - g_xhat.mean(-1, true);
    out[0] = (rstd * (centred - xhat * (g_xhat * xhat).mean(-1, true))).to(x.scalar_type());
  }
  if (mask[1]) out[1] = g_out.sum_to_size(shift.sizes()).to(shift.scalar_type());
  if (mask[2]) out[2] = (g_out * z).sum_to_size(scale.sizes()).to(scale.scalar_type());
  if (mask[3] && weight.defined()) {
    out[3] = (g_z * xhat).sum_to_size(weight.sizes()).to(weight.scalar_type());
  }
  if (mask[4] && bias.defined()) out[4] = g_z.sum_to_size(bias.sizes()).to(bias.scalar_type());
  return out;
}

// Forward-mode AD has no formula here: refuse it rather than drop the tangent.
template <typename... T>
inline void refuse_forward_ad(const char* op, const T&... tensors) {
  const bool any = ((tensors.defined() && tensors._fw_grad(/*level=*/0).defined()) || ...);
  TORCH_CHECK(!any, op,
              ": forward-mode AD (torch.func.jvp, torch.autograd.forward_ad) is not "
              "supported");
}

inline const at::Tensor& or_undefined(const std::optional<at::Tensor>& t) {
  static const at::Tensor undefined;
  return t.has_value() ? *t : undefined;
}

inline std::optional<at::Tensor> as_optional(const at::Tensor& t) {
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}

// A tuple of tensors as an array, moved.
template <typename... T>
std::array<at::Tensor, sizeof...(T)> as_array(std::tuple<T...>&& t) {
  return std::apply(
      [](auto&&... v) { return std::array<at::Tensor, sizeof...(T)>{std::move(v)...}; },
      std::move(t));
}

// The gated ops' (dresidual, dh, dgate) in ATen ops (double backward), into out[0..2] where
// mask asks: r = residual + gate * h, dr_total = dr + the norm's dx (in terms of the saved output
// r, whose own dependence on residual, h and gate autograd follows through the op's node).
inline void gated_graph(variable_list& out, const bool* mask, const at::Tensor& dr_total,
                        const at::Tensor& h, const at::Tensor& gate) {
  if (mask[0]) out[0] = dr_total;
  if (mask[1]) out[1] = (dr_total * gate).to(h.scalar_type());
  if (mask[2]) out[2] = (dr_total * h).sum_to_size(gate.sizes()).to(gate.scalar_type());
}

// ---- the graph nodes ----

// The plain ops' node (variant I of kVariants), LayerNorm or RMSNorm. Next edges: x, shift,
// scale, weight, and for LayerNorm bias (an empty edge where weight or bias is absent). Saved: x,
// the operands and the per-row statistics (mean for LayerNorm only, rstd).
template <int I>
struct ModulateBackward final : public Node {
  static constexpr bool kRms = is_rms(kVariants[I]);
  // dx, dshift, dscale, dweight[, dbias]
  static constexpr int kOutputs = grad_inputs(kVariants[I]).size;
  SavedVariable x, shift, scale, weight, bias, mean, rstd;
  double eps = 0.0;

  std::string name() const override {
    return kRms ? "RmsNormModulateBackward" : "LayerNormModulateBackward";
  }

  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (SavedVariable* v : {&x, &shift, &scale, &weight, &bias, &mean, &rstd}) v->reset_data();
  }

  variable_list apply(variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    variable_list out(kOutputs);
    std::array<bool, kOutputs> mask{};
    bool any = false;
    for (int i = 0; i < kOutputs; ++i) any = (mask[i] = task_should_compute_output(i)) || any;
    if (!any || !grads[0].defined()) return out;  // nothing wanted, or y unused: zero
    const at::Tensor x_ = x.unpack(), shift_ = shift.unpack(), scale_ = scale.unpack();
    const at::Tensor weight_ = weight.unpack(), bias_ = kRms ? at::Tensor() : bias.unpack();
    if (at::GradMode::is_enabled()) {  // create_graph=True
      const std::array<bool, 5> all{mask[0], mask[1], mask[2], mask[3],
                                    !kRms && mask[kOutputs - 1]};
      auto g = backward_graph(x_, shift_, scale_, weight_, bias_, grads[0], eps, all, kRms);
      for (int i = 0; i < kOutputs; ++i) out[i] = std::move(g[i]);
      return out;
    }
    if (shift_grad_is_dy(mask[1], shift_, grads[0])) {
      out[1] = grads[0];
      mask[1] = false;
      if (std::none_of(mask.begin(), mask.end(), [](bool m) { return m; })) return out;
    }
    at::AutoDispatchBelowADInplaceOrView below;
    const OptTensor w = as_optional(weight_), b = as_optional(bias_);
    const at::Tensor mean_ = kRms ? at::Tensor() : mean.unpack(), rstd_ = rstd.unpack();
    OpArgs o;
    o.dy = &grads[0], o.x = &x_, o.shift = &shift_, o.scale = &scale_;
    o.weight = &w, o.bias = &b, o.mean = &mean_, o.rstd = &rstd_, o.mask = mask.data();
    std::array<at::Tensor, kOutputs> g = as_array(call_backward<I>(o));
    for (int i = 0; i < kOutputs; ++i)
      if (mask[i]) out[i] = std::move(g[i]);
    return out;
  }
};

// The gated ops' node (variant I of kVariants), LayerNorm or RMSNorm. Next edges: residual, h,
// gate, shift, scale, weight, and for LayerNorm bias. Inputs: dr, dy (either may be undefined
// when its output is unused). r, an output, is saved in place of residual.
template <int I>
struct GatedModulateBackward final : public Node {
  static constexpr bool kRms = is_rms(kVariants[I]);
  // dresidual, dh, dgate, dshift, dscale, dweight[, dbias]
  static constexpr int kOutputs = grad_inputs(kVariants[I]).size;
  SavedVariable r, h, gate, shift, scale, weight, bias, mean, rstd;
  double eps = 0.0;

  std::string name() const override {
    return kRms ? "GatedResidualRmsNormModulateBackward" : "GatedResidualLayerNormModulateBackward";
  }

  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (SavedVariable* v : {&r, &h, &gate, &shift, &scale, &weight, &bias, &mean, &rstd})
      v->reset_data();
  }

  variable_list apply(variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    variable_list out(kOutputs);
    std::array<bool, kOutputs> mask{};
    bool any = false;
    for (int i = 0; i < kOutputs; ++i) any = (mask[i] = task_should_compute_output(i)) || any;
    if (!any || (!grads[0].defined() && !grads[1].defined())) return out;
    const at::Tensor r_ = r.unpack(this->getptr()), h_ = h.unpack(), gate_ = gate.unpack();
    const at::Tensor shift_ = shift.unpack(), scale_ = scale.unpack(), weight_ = weight.unpack();
    const at::Tensor bias_ = kRms ? at::Tensor() : bias.unpack();
    // Undefined: r or y unused. The kernels take dr as optional and need dy.
    const at::Tensor dy = grads[1].defined() ? grads[1] : at::zeros_like(r_);
    const at::Tensor& dr_in = grads[0];
    if (at::GradMode::is_enabled()) {  // create_graph=True
      const at::Tensor dr = dr_in.defined() ? dr_in : at::zeros_like(r_);
      const std::array<bool, 5> norm_mask{mask[0] || mask[1] || mask[2], mask[3], mask[4], mask[5],
                                          !kRms && mask[kOutputs - 1]};
      auto g = backward_graph(r_, shift_, scale_, weight_, bias_, dy, eps, norm_mask, kRms);
      gated_graph(out, mask.data(), g[0].defined() ? dr + g[0] : dr, h_, gate_);
      for (int i = 3; i < kOutputs; ++i) out[i] = std::move(g[i - 2]);
      return out;
    }
    at::AutoDispatchBelowADInplaceOrView below;
    const OptTensor dr = as_optional(dr_in), w = as_optional(weight_), b = as_optional(bias_);
    const at::Tensor mean_ = kRms ? at::Tensor() : mean.unpack(), rstd_ = rstd.unpack();
    OpArgs o;
    o.dr = &dr, o.dy = &dy, o.x = &r_, o.h = &h_, o.gate = &gate_, o.shift = &shift_;
    o.scale = &scale_, o.weight = &w, o.bias = &b, o.mean = &mean_, o.rstd = &rstd_;
    o.mask = mask.data();
    std::array<at::Tensor, kOutputs> g = as_array(call_backward<I>(o));
    for (int i = 0; i < kOutputs; ++i)
      if (mask[i]) out[i] = std::move(g[i]);
    return out;
  }
};

// ---- what every op's forward does around its call ----

// A node of type N for these inputs when one of them requires grad (else null), its next edges
// set in the inputs' order.
template <typename N, typename... T>
NodePtr<N> make_node(const T&... inputs) {
  NodePtr<N> node;
  if (torch::autograd::compute_requires_grad(inputs...)) {
    node = new_node<N>();
    node->set_next_edges(torch::autograd::collect_next_edges(inputs...));
  }
  return node;
}

}  // namespace autograd_detail
}  // namespace adaptiveload
