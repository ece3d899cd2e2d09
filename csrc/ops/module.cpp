// adaptiveload._C: importing it loads this shared library, whose static TORCH_LIBRARY
// registrations make the ops available under torch.ops.adaptiveload. It also holds direct
// callers of the four forward ops, which adaptiveload.ops uses outside torch.compile: they call
// the same dispatcher ops (autograd, CUDA graphs and dispatch modes included), but skip the
// boxed argument conversion of torch.ops, a large part of a small call's host time. CUDA builds
// also expose the tuning tables as structured rows (_tuning_table).
#include <torch/extension.h>

#include <optional>
#include <tuple>

#include "gated_residual_layer_norm_modulate.h"
#include "gated_residual_rms_norm_modulate.h"
#include "layer_norm_modulate.h"
#include "rms_norm_modulate.h"
#ifdef ADAPTIVELOAD_WITH_CUDA
#include "tuning_table.h"
#endif

namespace {

using adaptiveload::OptTensor;

at::Tensor layer_norm_modulate(const at::Tensor& x, const at::Tensor& shift,
                               const at::Tensor& scale, const OptTensor& weight,
                               const OptTensor& bias, double eps,
                               std::optional<at::ScalarType> out_dtype) {
  const auto& op = adaptiveload::layer_norm_modulate_handle();
  return std::get<0>(op.call(x, shift, scale, weight, bias, eps, out_dtype));
}

std::tuple<at::Tensor, at::Tensor> gated_residual_layer_norm_modulate(
    const at::Tensor& residual, const at::Tensor& h, const at::Tensor& gate,
    const at::Tensor& shift, const at::Tensor& scale, const OptTensor& weight,
    const OptTensor& bias, double eps, std::optional<at::ScalarType> out_dtype) {
  const auto& op = adaptiveload::gated_residual_layer_norm_modulate_handle();
  auto [r, y, mean, rstd] = op.call(residual, h, gate, shift, scale, weight, bias, eps, out_dtype);
  return {r, y};
}

at::Tensor rms_norm_modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale,
                             const OptTensor& weight, double eps,
                             std::optional<at::ScalarType> out_dtype) {
  const auto& op = adaptiveload::rms_norm_modulate_handle();
  return std::get<0>(op.call(x, shift, scale, weight, eps, out_dtype));
}

std::tuple<at::Tensor, at::Tensor> gated_residual_rms_norm_modulate(
    const at::Tensor& residual, const at::Tensor& h, const at::Tensor& gate,
    const at::Tensor& shift, const at::Tensor& scale, const OptTensor& weight, double eps,
    std::optional<at::ScalarType> out_dtype) {
  const auto& op = adaptiveload::gated_residual_rms_norm_modulate_handle();
  auto [r, y, rstd] = op.call(residual, h, gate, shift, scale, weight, eps, out_dtype);
  return {r, y};
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.def("layer_norm_modulate", &layer_norm_modulate);
  m.def("gated_residual_layer_norm_modulate", &gated_residual_layer_norm_modulate);
  m.def("rms_norm_modulate", &rms_norm_modulate);
  m.def("gated_residual_rms_norm_modulate", &gated_residual_rms_norm_modulate);
#ifdef ADAPTIVELOAD_WITH_CUDA
  // Private: the CUDA tuning tables, one dict of named fields per row, in table order.
  m.def("_tuning_table", [] {
    pybind11::list rows;
    for (const auto& row : adaptiveload::tuning_table_rows()) {
      pybind11::dict d;
      for (const auto& f : row) {
        if (f.text != nullptr) {
          d[f.name] = pybind11::str(f.text);
        } else {
          d[f.name] = pybind11::int_(f.number);
        }
      }
      rows.append(d);
    }
    return rows;
  });
#endif
}
