// The ops' entry points, shared by every backend: validation, outputs, broadcast operands and
// gradient targets (the host prologue), then the backend's kernels. Each backend registers
// these templates instantiated with its two kernel functions:
//
//   m.impl("layer_norm_modulate", &layer_norm_modulate_op<fwd_cpu, nullptr>);
//
// `Config`: the explicit configuration a private *_with_config op passes through (CUDA's
// tuning-table rows), nullptr for the ops themselves.
#pragma once

#include <array>
#include <string>
#include <tuple>

#include "problem.h"

namespace adaptiveload {

using ForwardKernels = void (*)(const ForwardProblem&, const std::string* config);
using BackwardKernels = void (*)(const BackwardProblem&, const std::string* config);

// Fwd2, Fwd3, Fwd4, Bwd4, Bwd5, Bwd6, Bwd7: the ops' result tuples (problem.h).

// The inputs both entry points take: the gated op's (x, h, gate, ...) when h is given, else
// the plain op's.
inline void check_op_inputs(const char* op, const char* x_name, const at::Tensor& x,
                            const std::optional<at::Tensor>& h,
                            const std::optional<at::Tensor>& gate, const at::Tensor& shift,
                            const at::Tensor& scale, const std::optional<at::Tensor>& weight,
                            const std::optional<at::Tensor>& bias) {
  if (h.has_value()) {
    TORCH_CHECK(gate.has_value(), op, ": the gated op needs gate");
    check_inputs(op, x_name, x, {{"gate", *gate}, {"shift", shift}, {"scale", scale}}, weight,
                 bias);
    check_residual_pair(op, x, *h);
  } else {
    check_inputs(op, x_name, x, {{"shift", shift}, {"scale", scale}}, weight, bias);
  }
}

// The gated op when h is given (then gate is too), else the plain op; RMSNorm when rms (no
// bias). Returns (r, y, mean, rstd), r undefined for the plain op, mean for RMSNorm.
inline Fwd4 forward_entry(ForwardKernels kernels, const char* op, bool rms, const at::Tensor& x,
                          const std::optional<at::Tensor>& h_in,
                          const std::optional<at::Tensor>& gate, const at::Tensor& shift,
                          const at::Tensor& scale, const std::optional<at::Tensor>& weight,
                          const std::optional<at::Tensor>& bias, double eps,
                          std::optional<at::ScalarType> out_dtype, const std::string* config) {
  const bool gated = h_in.has_value();
  const char* x_name = gated ? "residual" : "x";
  check_op_inputs(op, x_name, x, h_in, gate, shift, scale, weight, bias);
  at::Tensor h, r;
  if (gated) {
    h = h_in->contiguous();
    r = at::empty_like(x, at::MemoryFormat::Contiguous);
  }
  auto [y, mean, rstd] = make_forward_outputs(op, x, out_dtype, rms);
  if (x.numel() == 0) return {r, y, mean, rstd};
  const Operand sh = prepare_operand(shift, x), sc = prepare_operand(scale, x);
  const Operand g = gated ? prepare_operand(*gate, x) : Operand{};
  ForwardProblem p{};
  p.rms = rms;
  p.x = &x;
  if (gated) p.h = &h, p.gate = &g, p.r = &r;
  p.shift = &sh;
  p.scale = &sc;
  p.weight = &weight;
  p.bias = &bias;
  p.eps = eps;
  p.y = &y;
  p.mean = &mean;
  p.rstd = &rstd;
  kernels(p, config);
  return {r, y, mean, rstd};
}

// Gradients in output-mask order (dx or dresidual, dh, dgate, dshift, dscale, dweight, dbias);
// masked-off outputs come back empty. The plain op passes no h (then dh and dgate are undefined);
// RMSNorm (rms) passes an undefined mean and no bias.
inline Bwd7 backward_entry(BackwardKernels kernels, const char* op, bool rms,
                           const std::optional<at::Tensor>& dr_in, const at::Tensor& dy_in,
                           const at::Tensor& x, const std::optional<at::Tensor>& h_in,
                           const std::optional<at::Tensor>& gate, const at::Tensor& shift,
                           const at::Tensor& scale, const std::optional<at::Tensor>& weight,
                           const std::optional<at::Tensor>& bias, const at::Tensor& mean,
                           const at::Tensor& rstd, std::array<bool, 7> mask,
                           const std::string* config) {
  const bool gated = h_in.has_value();
  const char* x_name = gated ? "r" : "x";
  check_op_inputs(op, x_name, x, h_in, gate, shift, scale, weight, bias);
  check_grad_input(op, "dy", dy_in, x_name, x);
  TORCH_INTERNAL_ASSERT(rms != mean.defined(), op, ": mean is saved by LayerNorm only");
  check_stats(op, mean, rstd, x);
  const at::Tensor dy = dy_in.contiguous();
  at::Tensor h, dr;
  if (gated) {
    h = h_in->contiguous();
    if (dr_in.has_value() && dr_in->defined()) {
      check_grad_input(op, "dr", *dr_in, x_name, x);
      dr = dr_in->to(x.scalar_type()).contiguous();  // kernels read dr in r's dtype
    }
  }
  const auto acc = stats_dtype(x);
  const auto contiguous = at::MemoryFormat::Contiguous;
  at::Tensor dx = mask[0] ? at::empty_like(x, contiguous) : at::empty({0}, x.options());
  // The plain op has no dh or dgate (left undefined; its entry point drops them).
  at::Tensor dh;
  if (gated) dh = mask[1] ? at::empty_like(h, contiguous) : at::empty({0}, x.options());
  GradTarget dgate = gated ? make_grad_target(*gate, x, mask[2], acc) : GradTarget{};
  GradTarget dshift = make_grad_target(shift, x, mask[3], acc);
  GradTarget dscale = make_grad_target(scale, x, mask[4], acc);
  GradTarget dweight = make_grad_target(weight.value_or(x), x, mask[5] && weight.has_value(), acc);
  GradTarget dbias = make_grad_target(bias.value_or(x), x, mask[6] && bias.has_value(), acc);
  if (x.numel() > 0) {
    const Operand sc = prepare_operand(scale, x);
    const Operand g = gated ? prepare_operand(*gate, x) : Operand{};
    const at::Tensor mean_c = rms ? at::Tensor() : mean.contiguous(), rstd_c = rstd.contiguous();
    BackwardProblem p{};
    p.rms = rms;
    p.dy = &dy;
    p.x = &x;
    if (gated) p.dr = &dr, p.h = &h, p.gate = &g, p.dh = &dh;
    p.scale = &sc;
    p.weight = &weight;
    p.bias = &bias;
    p.mean = &mean_c;
    p.rstd = &rstd_c;
    p.dx = &dx;
    p.targets[kTargetShift] = &dshift;
    p.targets[kTargetScale] = &dscale;
    p.targets[kTargetGate] = &dgate;
    p.targets[kTargetWeight] = &dweight;
    p.targets[kTargetBias] = &dbias;
    kernels(p, config);
    for (GradTarget* t : p.targets) finish_grad(*t);
  } else {
    for (GradTarget* t : {&dgate, &dshift, &dscale, &dweight, &dbias})
      if (t->out.defined() && t->out.numel() > 0) t->out.zero_();
  }
  return {dx, dh, dgate.out, dshift.out, dscale.out, dweight.out, dbias.out};
}

// ---- the ops, for m.impl ----

template <ForwardKernels K>
Fwd3 layer_norm_modulate_op(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale,
                            const std::optional<at::Tensor>& weight,
                            const std::optional<at::Tensor>& bias, double eps,
                            std::optional<at::ScalarType> out_dtype) {
  auto [r, y, mean, rstd] =
      forward_entry(K, "layer_norm_modulate", false, x, std::nullopt, std::nullopt, shift, scale,
                    weight, bias, eps, out_dtype, nullptr);
  return {y, mean, rstd};
}

template <BackwardKernels K>
Bwd5 layer_norm_modulate_backward_op(const at::Tensor& dy, const at::Tensor& x,
                                     const at::Tensor& shift, const at::Tensor& scale,
                                     const std::optional<at::Tensor>& weight,
                                     const std::optional<at::Tensor>& bias, const at::Tensor& mean,
                                     const at::Tensor& rstd, std::array<bool, 5> mask) {
  const std::array<bool, 7> m7{mask[0], false, false, mask[1], mask[2], mask[3], mask[4]};
  auto g =
      backward_entry(K, "_layer_norm_modulate_backward", false, std::nullopt, dy, x, std::nullopt,
                     std::nullopt, shift, scale, weight, bias, mean, rstd, m7, nullptr);
  return {std::get<0>(g), std::get<3>(g), std::get<4>(g), std::get<5>(g), std::get<6>(g)};
}

template <ForwardKernels K>
Fwd4 gated_residual_layer_norm_modulate_op(const at::Tensor& residual, const at::Tensor& h,
                                           const at::Tensor& gate, const at::Tensor& shift,
                                           const at::Tensor& scale,
                                           const std::optional<at::Tensor>& weight,
                                           const std::optional<at::Tensor>& bias, double eps,
                                           std::optional<at::ScalarType> out_dtype) {
  return forward_entry(K, "gated_residual_layer_norm_modulate", false, residual, h, gate, shift,
                       scale, weight, bias, eps, out_dtype, nullptr);
}

template <BackwardKernels K>
Bwd7 gated_residual_layer_norm_modulate_backward_op(
    const std::optional<at::Tensor>& dr, const at::Tensor& dy, const at::Tensor& r,
    const at::Tensor& h, const at::Tensor& gate, const at::Tensor& shift, const at::Tensor& scale,
    const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    const at::Tensor& mean, const at::Tensor& rstd, std::array<bool, 7> mask) {
  return backward_entry(K, "_gated_residual_layer_norm_modulate_backward", false, dr, dy, r, h,
                        gate, shift, scale, weight, bias, mean, rstd, mask, nullptr);
}

// The RMSNorm ops: the same entry points with rms set, no bias and no mean.

template <ForwardKernels K>
Fwd2 rms_norm_modulate_op(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale,
                          const std::optional<at::Tensor>& weight, double eps,
                          std::optional<at::ScalarType> out_dtype) {
  auto [r, y, mean, rstd] =
      forward_entry(K, "rms_norm_modulate", true, x, std::nullopt, std::nullopt, shift, scale,
                    weight, std::nullopt, eps, out_dtype, nullptr);
  return {y, rstd};
}

template <BackwardKernels K>
Bwd4 rms_norm_modulate_backward_op(const at::Tensor& dy, const at::Tensor& x,
                                   const at::Tensor& shift, const at::Tensor& scale,
                                   const std::optional<at::Tensor>& weight, const at::Tensor& rstd,
                                   std::array<bool, 4> mask) {
  const std::array<bool, 7> m7{mask[0], false, false, mask[1], mask[2], mask[3], false};
  auto g = backward_entry(K, "_rms_norm_modulate_backward", true, std::nullopt, dy, x, std::nullopt,
                          std::nullopt, shift, scale, weight, std::nullopt, at::Tensor(), rstd, m7,
                          nullptr);
  return {std::get<0>(g), std::get<3>(g), std::get<4>(g), std::get<5>(g)};
}

template <ForwardKernels K>
Fwd3 gated_residual_rms_norm_modulate_op(const at::Tensor& residual, const at::Tensor& h,
                                         const at::Tensor& gate, const at::Tensor& shift,
                                         const at::Tensor& scale,
                                         const std::optional<at::Tensor>& weight, double eps,
                                         std::optional<at::ScalarType> out_dtype) {
  auto [r, y, mean, rstd] =
      forward_entry(K, "gated_residual_rms_norm_modulate", true, residual, h, gate, shift, scale,
                    weight, std::nullopt, eps, out_dtype, nullptr);
  return {r, y, rstd};
}

template <BackwardKernels K>
Bwd6 gated_residual_rms_norm_modulate_backward_op(
    const std::optional<at::Tensor>& dr, const at::Tensor& dy, const at::Tensor& r,
    const at::Tensor& h, const at::Tensor& gate, const at::Tensor& shift, const at::Tensor& scale,
    const std::optional<at::Tensor>& weight, const at::Tensor& rstd, std::array<bool, 6> mask) {
  const std::array<bool, 7> m7{mask[0], mask[1], mask[2], mask[3], mask[4], mask[5], false};
  auto g = backward_entry(K, "_gated_residual_rms_norm_modulate_backward", true, dr, dy, r, h, gate,
                          shift, scale, weight, std::nullopt, at::Tensor(), rstd, m7, nullptr);
  return {std::get<0>(g), std::get<1>(g), std::get<2>(g),
          std::get<3>(g), std::get<4>(g), std::get<5>(g)};
}

}  // namespace adaptiveload
