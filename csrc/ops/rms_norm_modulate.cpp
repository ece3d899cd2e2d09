// adaptiveload::rms_norm_modulate: RMSNorm followed by the (1 + scale), shift modulation (the
// adaLN of LTX-Video's blocks). Schema and CPU registration. The kernels are the LayerNorm op's
// (cpu/norm_modulate.cpp, cuda/), run for the RMS norm kind: no mean, and no mean(g) term in
// the backward; the autograd is autograd/rms_norm_modulate_autograd.cpp, the host prologue
// entry_points.h.
#include <torch/library.h>

#include "cpu/norm_modulate.h"
#include "entry_points.h"

namespace adaptiveload {

TORCH_LIBRARY_FRAGMENT(adaptiveload, m) {
  // y = x * rstd * weight * (1 + scale) + shift over the last dim D, rstd = 1 / sqrt(mean(x^2) +
  // eps); returns y (out_dtype, default x's dtype) and the per-row rstd (fp32; fp64 for fp64 x).
  m.def(
      "rms_norm_modulate(Tensor x, Tensor shift, Tensor scale, Tensor? weight, float eps, "
      "ScalarType? out_dtype) -> (Tensor y, Tensor rstd)");
  // Gradients (dx, dshift, dscale, dweight); shift is read for its shape and dtype only.
  // An output whose output_mask entry is false comes back as an empty tensor.
  m.def(
      "_rms_norm_modulate_backward(Tensor dy, Tensor x, Tensor shift, Tensor scale, "
      "Tensor? weight, Tensor rstd, bool[4] output_mask) -> "
      "(Tensor dx, Tensor dshift, Tensor dscale, Tensor dweight)");
}

TORCH_LIBRARY_IMPL(adaptiveload, CPU, m) {
  m.impl("rms_norm_modulate", &rms_norm_modulate_op<norm_modulate_fwd_cpu>);
  m.impl("_rms_norm_modulate_backward", &rms_norm_modulate_backward_op<norm_modulate_bwd_cpu>);
}

}  // namespace adaptiveload
