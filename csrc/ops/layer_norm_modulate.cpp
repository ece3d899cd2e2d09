// adaptiveload::layer_norm_modulate: LayerNorm followed by the (1 + scale), shift modulation
// (the adaLN of DiT blocks). Schema and CPU registration; the typed handle is
// layer_norm_modulate.h, the autograd autograd/layer_norm_modulate_autograd.cpp, the CPU kernels
// cpu/norm_modulate.cpp (shared by every op), the CUDA registration cuda/dispatch.cu, and the
// host prologue entry_points.h.
#include <torch/library.h>

#include "cpu/norm_modulate.h"
#include "entry_points.h"

namespace adaptiveload {

// The only TORCH_LIBRARY block of the namespace; other ops add theirs with TORCH_LIBRARY_FRAGMENT.
TORCH_LIBRARY(adaptiveload, m) {
  // y = ((x - mean) * rstd * weight + bias) * (1 + scale) + shift over the last dim D; returns
  // y (out_dtype, default x's dtype) and the per-row mean and rstd (fp32; fp64 for fp64 x).
  m.def(
      "layer_norm_modulate(Tensor x, Tensor shift, Tensor scale, Tensor? weight, Tensor? bias, "
      "float eps, ScalarType? out_dtype) -> (Tensor y, Tensor mean, Tensor rstd)");
  // Gradients (dx, dshift, dscale, dweight, dbias); shift is read for its shape and dtype only.
  // An output whose output_mask entry is false comes back as an empty tensor.
  m.def(
      "_layer_norm_modulate_backward(Tensor dy, Tensor x, Tensor shift, Tensor scale, "
      "Tensor? weight, Tensor? bias, Tensor mean, Tensor rstd, bool[5] output_mask) -> "
      "(Tensor dx, Tensor dshift, Tensor dscale, Tensor dweight, Tensor dbias)");
}

TORCH_LIBRARY_IMPL(adaptiveload, CPU, m) {
  m.impl("layer_norm_modulate", &layer_norm_modulate_op<norm_modulate_fwd_cpu>);
  m.impl("_layer_norm_modulate_backward", &layer_norm_modulate_backward_op<norm_modulate_bwd_cpu>);
}

}  // namespace adaptiveload
