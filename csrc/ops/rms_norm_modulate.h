// adaptiveload::rms_norm_modulate: typed dispatcher handles of the op and of its
// backward, each looked up once, for the C++ code that calls them
// (autograd/rms_norm_modulate_autograd.cpp, module.cpp). Schema and CPU registration:
// rms_norm_modulate.cpp.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <array>
#include <optional>

#include "problem.h"

namespace adaptiveload {

// (y, rstd) = rms_norm_modulate(x, shift, scale, weight, eps, out_dtype)
inline const auto& rms_norm_modulate_handle() {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("adaptiveload::rms_norm_modulate", "")
          .typed<Fwd2(const at::Tensor&, const at::Tensor&, const at::Tensor&, const OptTensor&,
                      double, std::optional<at::ScalarType>)>();
  return op;
}

// (dx, dshift, dscale, dweight) = _rms_norm_modulate_backward(dy, x, shift, scale, weight, rstd,
// mask)
inline const auto& rms_norm_modulate_backward_handle() {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("adaptiveload::_rms_norm_modulate_backward", "")
          .typed<Bwd4(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                      const OptTensor&, const at::Tensor&, std::array<bool, 4>)>();
  return op;
}

}  // namespace adaptiveload
