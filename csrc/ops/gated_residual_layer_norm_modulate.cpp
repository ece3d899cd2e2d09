// adaptiveload::gated_residual_layer_norm_modulate: the residual update plus the next adaLN
// norm of a DiT block in one pass, r = residual + gate * h, y = LayerNormModulate(r).
// Schema and CPU kernels; the CPU work is shared with layer_norm_modulate.cpp.
#include "layer_norm_modulate.h"

#include <torch/library.h>

namespace adaptiveload {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> gated_residual_layer_norm_modulate_cpu(
    const at::Tensor& residual, const at::Tensor& h_in, const at::Tensor& gate,
    const at::Tensor& shift, const at::Tensor& scale, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, double eps, std::optional<at::ScalarType> out_dtype) {
  constexpr const char* op = "gated_residual_layer_norm_modulate";
  check_inputs(op, "residual", residual, {{"gate", gate}, {"shift", shift}, {"scale", scale}},
               weight, bias);
  check_residual_pair(op, residual, h_in);
  const at::Tensor h = h_in.contiguous();
  auto r = at::empty_like(residual, at::MemoryFormat::Contiguous);
  auto [y, mean, rstd] = make_forward_outputs(op, residual, out_dtype);
  if (residual.numel() == 0) return {r, y, mean, rstd};
  const Operand g = prepare_operand(gate, residual);
  const Operand sh = prepare_operand(shift, residual), sc = prepare_operand(scale, residual);
  FusedResidual fused{residual, h, g, r};
  layer_norm_modulate_fwd_cpu_impl(r, &fused, sh, sc, weight, bias, eps, y, mean, rstd);
  return {r, y, mean, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
gated_residual_layer_norm_modulate_backward_cpu(const std::optional<at::Tensor>& dr_in,
                                                const at::Tensor& dy_in, const at::Tensor& r,
                                                const at::Tensor& h_in, const at::Tensor& gate,
                                                const at::Tensor& shift, const at::Tensor& scale,
                                                const std::optional<at::Tensor>& weight,
                                                const std::optional<at::Tensor>& bias,
                                                const at::Tensor& mean, const at::Tensor& rstd,
                                                std::array<bool, 7> mask) {
  constexpr const char* op = "_gated_residual_layer_norm_modulate_backward";
  check_inputs(op, "r", r, {{"gate", gate}, {"shift", shift}, {"scale", scale}}, weight, bias);
  check_residual_pair(op, r, h_in);
  check_grad_input(op, "dy", dy_in, "r", r);
  const at::Tensor h = h_in.contiguous();
  const at::Tensor dy = dy_in.contiguous();
  at::Tensor dr;
  if (dr_in.has_value() && dr_in->defined()) {
    check_grad_input(op, "dr", *dr_in, "r", r);
    dr = dr_in->contiguous();
  }
  const auto acc = stats_dtype(r);
  const auto contiguous = at::MemoryFormat::Contiguous;
  at::Tensor dres = mask[0] ? at::empty_like(r, contiguous) : at::empty({0}, r.options());
  at::Tensor dh = mask[1] ? at::empty_like(h, contiguous) : at::empty({0}, h.options());
  GradTarget dgate = make_grad_target(gate, r, mask[2], acc);
  GradTarget dshift = make_grad_target(shift, r, mask[3], acc);
  GradTarget dscale = make_grad_target(scale, r, mask[4], acc);
  GradTarget dweight = make_grad_target(weight.value_or(r), r, mask[5] && weight.has_value(), acc);
  GradTarget dbias = make_grad_target(bias.value_or(r), r, mask[6] && bias.has_value(), acc);
  if (r.numel() > 0) {
    const Operand g = prepare_operand(gate, r), sc = prepare_operand(scale, r);
    FusedResidualGrad fused{&dr, h, g, dh, dgate};
    layer_norm_modulate_bwd_cpu_impl(dy, r, &fused, sc, weight, bias, mean.contiguous(),
                                     rstd.contiguous(), dres, dshift, dscale, dweight, dbias);
  } else {
    for (auto* g : {&dgate, &dshift, &dscale, &dweight, &dbias}) g->out.zero_();
  }
  return {dres, dh, dgate.out, dshift.out, dscale.out, dweight.out, dbias.out};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(adaptiveload, m) {
  // r = residual + gate * h (residual's dtype); y = LayerNormModulate(r). Returns (r, y, mean,
  // rstd); gate, shift and scale broadcast to residual like layer_norm_modulate's shift.
  m.def(
      "gated_residual_layer_norm_modulate(Tensor residual, Tensor h, Tensor gate, Tensor shift, "
      "Tensor scale, Tensor? weight, Tensor? bias, float eps, ScalarType? out_dtype) -> "
      "(Tensor r, Tensor y, Tensor mean, Tensor rstd)");
  // dr (gradient of r, may be None) plus LN-backward(dy) gives dresidual; dh = dresidual * gate,
  // dgate = sum(dresidual * h). Outputs masked off by output_mask come back empty.
  m.def(
      "_gated_residual_layer_norm_modulate_backward(Tensor? dr, Tensor dy, Tensor r, Tensor h, "
      "Tensor gate, Tensor shift, Tensor scale, Tensor? weight, Tensor? bias, Tensor mean, "
      "Tensor rstd, bool[7] output_mask) -> (Tensor dresidual, Tensor dh, Tensor dgate, "
      "Tensor dshift, Tensor dscale, Tensor dweight, Tensor dbias)");
}

TORCH_LIBRARY_IMPL(adaptiveload, CPU, m) {
  m.impl("gated_residual_layer_norm_modulate", &gated_residual_layer_norm_modulate_cpu);
  m.impl("_gated_residual_layer_norm_modulate_backward",
         &gated_residual_layer_norm_modulate_backward_cpu);
}

}  // namespace adaptiveload
