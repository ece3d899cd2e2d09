// adaptiveload::gated_residual_rms_norm_modulate: typed dispatcher handles of the op and of its
// backward, each looked up once, for the C++ code that calls them
// (autograd/gated_residual_rms_norm_modulate_autograd.cpp, module.cpp). Schema and CPU
// registration: gated_residual_rms_norm_modulate.cpp.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <array>
#include <optional>

#include "problem.h"

namespace adaptiveload {

// (r, y, rstd) = gated_residual_rms_norm_modulate(residual, h, gate, shift, scale, weight, eps,
// out_dtype)
inline const auto& gated_residual_rms_norm_modulate_handle() {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("adaptiveload::gated_residual_rms_norm_modulate", "")
          .typed<Fwd3(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                      const at::Tensor&, const OptTensor&, double,
                      std::optional<at::ScalarType>)>();
  return op;
}

// (dresidual, dh, dgate, dshift, dscale, dweight) =
// _gated_residual_rms_norm_modulate_backward(dr, dy, r, h, gate, shift, scale, weight, rstd, mask)
inline const auto& gated_residual_rms_norm_modulate_backward_handle() {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("adaptiveload::_gated_residual_rms_norm_modulate_backward", "")
          .typed<Bwd6(const OptTensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                      const at::Tensor&, const at::Tensor&, const at::Tensor&, const OptTensor&,
                      const at::Tensor&, std::array<bool, 6>)>();
  return op;
}

}  // namespace adaptiveload
