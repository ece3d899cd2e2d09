// Autograd of adaptiveload::layer_norm_modulate: the forward saves x, the operands, mean and
// rstd on a ModulateBackward<false> node (autograd/nodes.h) when an input requires grad.
#include <torch/library.h>

#include "nodes.h"

namespace adaptiveload {
namespace {

using autograd_detail::make_node;
using autograd_detail::ModulateBackward;
using autograd_detail::or_undefined;
using autograd_detail::refuse_forward_ad;
using torch::autograd::SavedVariable;

Fwd3 layer_norm_modulate_autograd(const at::Tensor& x, const at::Tensor& shift,
                                  const at::Tensor& scale, const std::optional<at::Tensor>& weight,
                                  const std::optional<at::Tensor>& bias, double eps,
                                  std::optional<at::ScalarType> out_dtype) {
  const at::Tensor &w = or_undefined(weight), &b = or_undefined(bias);
  refuse_forward_ad("layer_norm_modulate", x, shift, scale, w, b);
  auto node = make_node<ModulateBackward<false>>(x, shift, scale, weight, bias);
  Fwd3 out = [&] {
    at::AutoDispatchBelowADInplaceOrView below;
    return layer_norm_modulate_handle().call(x, shift, scale, weight, bias, eps, out_dtype);
  }();
  if (node) {
    // y is differentiable; mean and rstd are not (they get no history).
    torch::autograd::set_history(std::get<0>(out), node);
    node->x = SavedVariable(x, false);
    node->shift = SavedVariable(shift, false);
    node->scale = SavedVariable(scale, false);
    node->weight = SavedVariable(w, false);
    node->bias = SavedVariable(b, false);
    node->mean = SavedVariable(std::get<1>(out), false);
    node->rstd = SavedVariable(std::get<2>(out), false);
    node->eps = eps;
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(adaptiveload, Autograd, m) {
  m.impl("layer_norm_modulate", &layer_norm_modulate_autograd);
}

}  // namespace adaptiveload
