// Autograd of adaptiveload::rms_norm_modulate: the forward saves x, the operands and rstd on a
// ModulateBackward<true> node (autograd/nodes.h) when an input requires grad.
#include <torch/library.h>

#include "nodes.h"

namespace adaptiveload {
namespace {

using autograd_detail::make_node;
using autograd_detail::ModulateBackward;
using autograd_detail::or_undefined;
using autograd_detail::refuse_forward_ad;
using torch::autograd::SavedVariable;

Fwd2 rms_norm_modulate_autograd(const at::Tensor& x, const at::Tensor& shift,
                                const at::Tensor& scale, const std::optional<at::Tensor>& weight,
                                double eps, std::optional<at::ScalarType> out_dtype) {
  const at::Tensor& w = or_undefined(weight);
  refuse_forward_ad("rms_norm_modulate", x, shift, scale, w);
  auto node = make_node<ModulateBackward<true>>(x, shift, scale, weight);
  Fwd2 out = [&] {
    at::AutoDispatchBelowADInplaceOrView below;
    return rms_norm_modulate_handle().call(x, shift, scale, weight, eps, out_dtype);
  }();
  if (node) {
    torch::autograd::set_history(std::get<0>(out), node);  // y; rstd gets no history
    node->x = SavedVariable(x, false);
    node->shift = SavedVariable(shift, false);
    node->scale = SavedVariable(scale, false);
    node->weight = SavedVariable(w, false);
    node->rstd = SavedVariable(std::get<1>(out), false);
    node->eps = eps;
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(adaptiveload, Autograd, m) {
  m.impl("rms_norm_modulate", &rms_norm_modulate_autograd);
}

}  // namespace adaptiveload
