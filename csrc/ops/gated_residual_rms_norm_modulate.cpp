// adaptiveload::gated_residual_rms_norm_modulate: the residual update plus the next RMSNorm
// adaLN in one pass, r = residual + gate * h, y = RmsNormModulate(r) (LTX-Video: the FFN's gated
// residual, then the next block's norm1). Schema and CPU registration; the kernels are the
// LayerNorm op's run for the RMS norm kind (cpu/norm_modulate.cpp, cuda/), the autograd
// autograd/gated_residual_rms_norm_modulate_autograd.cpp, the host prologue entry_points.h.
#include <torch/library.h>

#include "cpu/norm_modulate.h"
#include "entry_points.h"

namespace adaptiveload {

TORCH_LIBRARY_FRAGMENT(adaptiveload, m) {
  // r = residual + gate * h (residual's dtype); y = RmsNormModulate(r). Returns (r, y, rstd);
  // gate, shift and scale broadcast to residual like rms_norm_modulate's shift.
  m.def(
      "gated_residual_rms_norm_modulate(Tensor residual, Tensor h, Tensor gate, Tensor shift, "
      "Tensor scale, Tensor? weight, float eps, ScalarType? out_dtype) -> "
      "(Tensor r, Tensor y, Tensor rstd)");
  // dr (gradient of r, may be None) plus RMS-backward(dy) gives dresidual; dh = dresidual * gate,
  // dgate = sum(dresidual * h). Outputs masked off by output_mask come back empty.
  m.def(
      "_gated_residual_rms_norm_modulate_backward(Tensor? dr, Tensor dy, Tensor r, Tensor h, "
      "Tensor gate, Tensor shift, Tensor scale, Tensor? weight, Tensor rstd, bool[6] output_mask) "
      "-> (Tensor dresidual, Tensor dh, Tensor dgate, Tensor dshift, Tensor dscale, "
      "Tensor dweight)");
}

TORCH_LIBRARY_IMPL(adaptiveload, CPU, m) {
  m.impl("gated_residual_rms_norm_modulate",
         &gated_residual_rms_norm_modulate_op<norm_modulate_fwd_cpu>);
  m.impl("_gated_residual_rms_norm_modulate_backward",
         &gated_residual_rms_norm_modulate_backward_op<norm_modulate_bwd_cpu>);
}

}  // namespace adaptiveload
