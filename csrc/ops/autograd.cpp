// Autograd of both ops, in C++ (the Autograd dispatch key): each forward saves its input (or
// r, for the gated op), the small operands and the per-row mean and rstd, and each backward
// calls the op's registered backward (_layer_norm_modulate_backward, ...) with the mask of
// gradients wanted. Doing this in C++ keeps a call's host time to the dispatcher's: a Python
// autograd formula cost more host time than the four eager ops the fused op replaces.
//
// Double backward (create_graph=True: gradient penalties, Hessian-vector products): the fused
// backward kernels give first-order gradients only, so then the gradients are formed by the same
// formulas in ATen ops (backward_graph), which autograd differentiates again.
#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <array>
#include <tuple>

#include "op_handles.h"

namespace adaptiveload {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::ScalarType acc_type(const at::Tensor& x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// (dx, dshift, dscale, dweight, dbias) of y = ((x - mean) * rstd * w + b) * (1 + scale) + shift
// in differentiable ATen ops; undefined where mask is false (or weight / bias absent).
std::array<at::Tensor, 5> backward_graph(const at::Tensor& x, const at::Tensor& shift,
                                         const at::Tensor& scale, const at::Tensor& weight,
                                         const at::Tensor& bias, const at::Tensor& dy, double eps,
                                         const std::array<bool, 5>& mask) {
  const auto acc = acc_type(x);
  const at::Tensor xf = x.to(acc), g_out = dy.to(acc);
  const at::Tensor xc = xf - xf.mean(-1, true);
  const at::Tensor rstd = at::rsqrt(xc.square().mean(-1, true) + eps);
  const at::Tensor xhat = xc * rstd;
  const at::Tensor w = weight.defined() ? weight.to(acc) : at::Tensor();
  at::Tensor z = w.defined() ? xhat * w : xhat;
  if (bias.defined()) z = z + bias.to(acc);
  const at::Tensor g_z = g_out * (scale.to(acc) + 1);  // d/dz
  const at::Tensor g_xhat = w.defined() ? g_z * w : g_z;
  std::array<at::Tensor, 5> out;
  if (mask[0]) {
    out[0] = (rstd * (g_xhat - g_xhat.mean(-1, true) - xhat * (g_xhat * xhat).mean(-1, true)))
                 .to(x.scalar_type());
  }
  if (mask[1]) out[1] = g_out.sum_to_size(shift.sizes()).to(shift.scalar_type());
  if (mask[2]) out[2] = (g_out * z).sum_to_size(scale.sizes()).to(scale.scalar_type());
  if (mask[3] && weight.defined()) {
    out[3] = (g_z * xhat).sum_to_size(weight.sizes()).to(weight.scalar_type());
  }
  if (mask[4] && bias.defined()) out[4] = g_z.sum_to_size(bias.sizes()).to(bias.scalar_type());
  return out;
}

// ---- layer_norm_modulate ----

class LayerNormModulate : public torch::autograd::Function<LayerNormModulate> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& shift,
                               const at::Tensor& scale, const std::optional<at::Tensor>& weight,
                               const std::optional<at::Tensor>& bias, double eps,
                               std::optional<at::ScalarType> out_dtype) {
    const auto& op = layer_norm_modulate_handle();
    at::AutoDispatchBelowADInplaceOrView below;
    auto [y, mean, rstd] = op.call(x, shift, scale, weight, bias, eps, out_dtype);
    ctx->save_for_backward(
        {x, shift, scale, weight.value_or(at::Tensor()), bias.value_or(at::Tensor()), mean, rstd});
    ctx->saved_data["eps"] = eps;
    ctx->mark_non_differentiable({mean, rstd});
    // No zero-filled gradients for mean and rstd (two allocations and fills per backward).
    ctx->set_materialize_grads(false);
    return {y, mean, rstd};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto& op = layer_norm_modulate_backward_handle();
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &shift = saved[1], &scale = saved[2];
    const at::Tensor &weight = saved[3], &bias = saved[4], &mean = saved[5], &rstd = saved[6];
    // needs_input_grad counts the tensor inputs only: x, shift, scale[, weight][, bias].
    int edge = 3;
    const bool need_w = weight.defined() && ctx->needs_input_grad(edge++);
    const bool need_b = bias.defined() && ctx->needs_input_grad(edge);
    const std::array<bool, 5> mask{ctx->needs_input_grad(0), ctx->needs_input_grad(1),
                                   ctx->needs_input_grad(2), need_w, need_b};
    variable_list out(7);
    if (!grads[0].defined()) return out;  // y unused: every gradient is zero
    if (!(mask[0] || mask[1] || mask[2] || mask[3] || mask[4])) return out;
    if (at::GradMode::is_enabled()) {  // create_graph=True
      auto g = backward_graph(x, shift, scale, weight, bias, grads[0],
                              ctx->saved_data["eps"].toDouble(), mask);
      for (int i = 0; i < 5; ++i) out[i] = g[i];
      return out;
    }
    auto w = weight.defined() ? std::optional<at::Tensor>(weight) : std::nullopt;
    auto b = bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt;
    auto [dx, dshift, dscale, dweight, dbias] =
        op.call(grads[0], x, shift, scale, w, b, mean, rstd, mask);
    const at::Tensor g[5] = {dx, dshift, dscale, dweight, dbias};
    for (int i = 0; i < 5; ++i)
      if (mask[i]) out[i] = g[i];
    return out;
  }
};

Fwd3 layer_norm_modulate_autograd(const at::Tensor& x, const at::Tensor& shift,
                                  const at::Tensor& scale, const std::optional<at::Tensor>& weight,
                                  const std::optional<at::Tensor>& bias, double eps,
                                  std::optional<at::ScalarType> out_dtype) {
  auto out = LayerNormModulate::apply(x, shift, scale, weight, bias, eps, out_dtype);
  return {out[0], out[1], out[2]};
}

// ---- gated_residual_layer_norm_modulate ----

class GatedResidualLayerNormModulate
    : public torch::autograd::Function<GatedResidualLayerNormModulate> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& residual,
                               const at::Tensor& h, const at::Tensor& gate, const at::Tensor& shift,
                               const at::Tensor& scale, const std::optional<at::Tensor>& weight,
                               const std::optional<at::Tensor>& bias, double eps,
                               std::optional<at::ScalarType> out_dtype) {
    const auto& op = gated_residual_layer_norm_modulate_handle();
    at::AutoDispatchBelowADInplaceOrView below;
    auto [r, y, mean, rstd] =
        op.call(residual, h, gate, shift, scale, weight, bias, eps, out_dtype);
    // r (an output, the next residual stream) replaces residual; h is needed for dgate.
    ctx->save_for_backward({r, h, gate, shift, scale, weight.value_or(at::Tensor()),
                            bias.value_or(at::Tensor()), mean, rstd});
    ctx->saved_data["eps"] = eps;
    ctx->mark_non_differentiable({mean, rstd});
    ctx->set_materialize_grads(false);
    return {r, y, mean, rstd};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto& op = gated_residual_layer_norm_modulate_backward_handle();
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &r = saved[0], &h = saved[1], &gate = saved[2], &shift = saved[3];
    const at::Tensor &scale = saved[4], &weight = saved[5], &bias = saved[6];
    const at::Tensor &mean = saved[7], &rstd = saved[8];
    int edge = 5;  // residual, h, gate, shift, scale[, weight][, bias]
    const bool need_w = weight.defined() && ctx->needs_input_grad(edge++);
    const bool need_b = bias.defined() && ctx->needs_input_grad(edge);
    std::array<bool, 7> mask{};
    for (int i = 0; i < 5; ++i) mask[i] = ctx->needs_input_grad(i);
    mask[5] = need_w;
    mask[6] = need_b;
    variable_list out(9);
    bool any = false;
    for (bool m : mask) any = any || m;
    if (!any) return out;
    if (!grads[0].defined() && !grads[1].defined()) return out;
    // Undefined: r or y unused. The kernels take dr as optional and need dy.
    const at::Tensor dy = grads[1].defined() ? grads[1] : at::zeros_like(saved[0]);
    const at::Tensor& dr_in = grads[0];
    if (at::GradMode::is_enabled()) {  // create_graph=True
      const at::Tensor dr = dr_in.defined() ? dr_in : at::zeros_like(r);
      // In terms of the saved output r, whose own dependence on residual, h and gate autograd
      // follows through this op's node.
      const std::array<bool, 5> ln_mask{mask[0] || mask[1] || mask[2], mask[3], mask[4], mask[5],
                                        mask[6]};
      auto g = backward_graph(r, shift, scale, weight, bias, dy, ctx->saved_data["eps"].toDouble(),
                              ln_mask);
      const at::Tensor dr_total = g[0].defined() ? dr + g[0] : dr;  // r = residual + gate * h
      if (mask[0]) out[0] = dr_total;
      if (mask[1]) out[1] = (dr_total * gate).to(h.scalar_type());
      if (mask[2]) out[2] = (dr_total * h).sum_to_size(gate.sizes()).to(gate.scalar_type());
      for (int i = 0; i < 4; ++i) out[3 + i] = g[1 + i];
      return out;
    }
    auto w = weight.defined() ? std::optional<at::Tensor>(weight) : std::nullopt;
    auto b = bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt;
    auto dr = dr_in.defined() ? std::optional<at::Tensor>(dr_in) : std::nullopt;
    auto res = op.call(dr, dy, r, h, gate, shift, scale, w, b, mean, rstd, mask);
    const at::Tensor g[7] = {std::get<0>(res), std::get<1>(res), std::get<2>(res), std::get<3>(res),
                             std::get<4>(res), std::get<5>(res), std::get<6>(res)};
    for (int i = 0; i < 7; ++i)
      if (mask[i]) out[i] = g[i];
    return out;
  }
};

Fwd4 gated_residual_layer_norm_modulate_autograd(const at::Tensor& residual, const at::Tensor& h,
                                                 const at::Tensor& gate, const at::Tensor& shift,
                                                 const at::Tensor& scale,
                                                 const std::optional<at::Tensor>& weight,
                                                 const std::optional<at::Tensor>& bias, double eps,
                                                 std::optional<at::ScalarType> out_dtype) {
  auto out = GatedResidualLayerNormModulate::apply(residual, h, gate, shift, scale, weight, bias,
                                                   eps, out_dtype);
  return {out[0], out[1], out[2], out[3]};
}

}  // namespace

TORCH_LIBRARY_IMPL(adaptiveload, Autograd, m) {
  m.impl("layer_norm_modulate", &layer_norm_modulate_autograd);
  m.impl("gated_residual_layer_norm_modulate", &gated_residual_layer_norm_modulate_autograd);
}

}  // namespace adaptiveload
