// adaptiveload._C: importing it loads this shared library, whose static TORCH_LIBRARY
// registrations make the ops available under torch.ops.adaptiveload. It also holds direct
// callers of the two forward ops, which adaptiveload.ops uses outside torch.compile: they call
// the same dispatcher ops (autograd, CUDA graphs and dispatch modes included), but skip the
// boxed argument conversion of torch.ops, a large part of a small call's host time.
#include <torch/extension.h>

#include <optional>
#include <tuple>

namespace {

using Fwd3 = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using Fwd4 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

at::Tensor layer_norm_modulate(const at::Tensor& x, const at::Tensor& shift,
                               const at::Tensor& scale, const std::optional<at::Tensor>& weight,
                               const std::optional<at::Tensor>& bias, double eps,
                               std::optional<at::ScalarType> out_dtype) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("adaptiveload::layer_norm_modulate", "")
          .typed<Fwd3(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                      const std::optional<at::Tensor>&, const std::optional<at::Tensor>&, double,
                      std::optional<at::ScalarType>)>();
  return std::get<0>(op.call(x, shift, scale, weight, bias, eps, out_dtype));
}

std::tuple<at::Tensor, at::Tensor> gated_residual_layer_norm_modulate(
    const at::Tensor& residual, const at::Tensor& h, const at::Tensor& gate,
    const at::Tensor& shift, const at::Tensor& scale, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, double eps, std::optional<at::ScalarType> out_dtype) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("adaptiveload::gated_residual_layer_norm_modulate", "")
          .typed<Fwd4(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                      const at::Tensor&, const std::optional<at::Tensor>&,
                      const std::optional<at::Tensor>&, double, std::optional<at::ScalarType>)>();
  auto [r, y, mean, rstd] = op.call(residual, h, gate, shift, scale, weight, bias, eps, out_dtype);
  return {r, y};
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.def("layer_norm_modulate", &layer_norm_modulate);
  m.def("gated_residual_layer_norm_modulate", &gated_residual_layer_norm_modulate);
}
