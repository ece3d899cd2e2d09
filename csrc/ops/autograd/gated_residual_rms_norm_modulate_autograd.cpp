// Autograd of adaptiveload::gated_residual_rms_norm_modulate: the forward saves r (an output,
// in place of residual), h, gate, the operands and rstd on a GatedModulateBackward<true> node
// (autograd/nodes.h) when an input requires grad.
#include <torch/library.h>

#include "nodes.h"

namespace adaptiveload {
namespace {

using autograd_detail::GatedModulateBackward;
using autograd_detail::make_node;
using autograd_detail::or_undefined;
using autograd_detail::refuse_forward_ad;
using torch::autograd::SavedVariable;

Fwd3 gated_residual_rms_norm_modulate_autograd(const at::Tensor& residual, const at::Tensor& h,
                                               const at::Tensor& gate, const at::Tensor& shift,
                                               const at::Tensor& scale,
                                               const std::optional<at::Tensor>& weight, double eps,
                                               std::optional<at::ScalarType> out_dtype) {
  const at::Tensor& w = or_undefined(weight);
  refuse_forward_ad("gated_residual_rms_norm_modulate", residual, h, gate, shift, scale, w);
  auto node = make_node<GatedModulateBackward<true>>(residual, h, gate, shift, scale, weight);
  Fwd3 out = [&] {
    at::AutoDispatchBelowADInplaceOrView below;
    return gated_residual_rms_norm_modulate_handle().call(residual, h, gate, shift, scale, weight,
                                                          eps, out_dtype);
  }();
  if (node) {
    torch::autograd::set_history(std::get<0>(out), node);  // r: the node's input 0
    torch::autograd::set_history(std::get<1>(out), node);  // y: input 1
    node->r = SavedVariable(std::get<0>(out), true);
    node->h = SavedVariable(h, false);
    node->gate = SavedVariable(gate, false);
    node->shift = SavedVariable(shift, false);
    node->scale = SavedVariable(scale, false);
    node->weight = SavedVariable(w, false);
    node->rstd = SavedVariable(std::get<2>(out), false);
    node->eps = eps;
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(adaptiveload, Autograd, m) {
  m.impl("gated_residual_rms_norm_modulate", &gated_residual_rms_norm_modulate_autograd);
}

}  // namespace adaptiveload
