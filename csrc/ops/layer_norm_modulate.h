// adaptiveload::layer_norm_modulate: typed dispatcher handles of the op and of its
// backward, each looked up once, for the C++ code that calls them
// (autograd/layer_norm_modulate_autograd.cpp, module.cpp). Schema and CPU registration:
// layer_norm_modulate.cpp.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <array>
#include <optional>

#include "problem.h"

namespace adaptiveload {

// (y, mean, rstd) = layer_norm_modulate(x, shift, scale, weight, bias, eps, out_dtype)
inline const auto& layer_norm_modulate_handle() {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("adaptiveload::layer_norm_modulate", "")
          .typed<Fwd3(const at::Tensor&, const at::Tensor&, const at::Tensor&, const OptTensor&,
                      const OptTensor&, double, std::optional<at::ScalarType>)>();
  return op;
}

// (dx, dshift, dscale, dweight, dbias) = _layer_norm_modulate_backward(dy, x, shift, scale,
// weight, bias, mean, rstd, mask)
inline const auto& layer_norm_modulate_backward_handle() {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("adaptiveload::_layer_norm_modulate_backward", "")
          .typed<Bwd5(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                      const OptTensor&, const OptTensor&, const at::Tensor&, const at::Tensor&,
                      std::array<bool, 5>)>();
  return op;
}

}  // namespace adaptiveload
