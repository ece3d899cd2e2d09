// Typed dispatcher handles of the registered ops, for the C++ code that calls them (autograd.cpp,
// module.cpp's direct callers), and the tuples they return. Each handle is looked up once.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <array>
#include <optional>
#include <tuple>

namespace adaptiveload {

using Fwd2 = std::tuple<at::Tensor, at::Tensor>;
using Fwd3 = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using Fwd4 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using Bwd4 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using Bwd5 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using Bwd6 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using Bwd7 =
    std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

using OptTensor = std::optional<at::Tensor>;

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

// (r, y, mean, rstd) = gated_residual_layer_norm_modulate(residual, h, gate, shift, scale,
// weight, bias, eps, out_dtype)
inline const auto& gated_residual_layer_norm_modulate_handle() {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("adaptiveload::gated_residual_layer_norm_modulate", "")
          .typed<Fwd4(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                      const at::Tensor&, const OptTensor&, const OptTensor&, double,
                      std::optional<at::ScalarType>)>();
  return op;
}

// (dresidual, dh, dgate, dshift, dscale, dweight, dbias) =
// _gated_residual_layer_norm_modulate_backward(dr, dy, r, h, gate, shift, scale, weight, bias,
// mean, rstd, mask)
inline const auto& gated_residual_layer_norm_modulate_backward_handle() {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("adaptiveload::_gated_residual_layer_norm_modulate_backward", "")
          .typed<Bwd7(const OptTensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                      const at::Tensor&, const at::Tensor&, const at::Tensor&, const OptTensor&,
                      const OptTensor&, const at::Tensor&, const at::Tensor&,
                      std::array<bool, 7>)>();
  return op;
}

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
