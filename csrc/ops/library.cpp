// The schemas of every op of kVariants (variants.h) and of its backward, and their CPU kernels
// (cpu/norm_modulate.cpp, behind the host prologue of entry_points.h). The schema text is built
// from the variant's row (signatures.h) and pinned in tests/python/test_ops_schemas.py.
//
// The forward ops: y = Norm(x) * (1 + scale) + shift over the last dim D, Norm being LayerNorm
// ((x - mean) * rstd * weight + bias) or RMSNorm (x * rstd * weight, rstd = 1 / sqrt(mean(x^2) +
// eps)); y in out_dtype (default x's dtype), the per-row mean (LayerNorm only) and rstd in fp32
// (fp64 for fp64 x). The gated ops first form r = residual + gate * h (residual's dtype) and
// normalize r; gate, shift and scale broadcast to x (or residual) alike.
//
// The backward ops: one gradient per differentiable input, in output_mask order (dx, dshift,
// dscale, dweight[, dbias]; the gated ops' dresidual, dh, dgate first); an output whose
// output_mask entry is false comes back as an empty tensor. shift is read for its shape and dtype
// only. In the gated backward, dr (the gradient of r, may be None) plus the norm's backward of dy
// gives dresidual; dh = dresidual * gate, dgate = sum(dresidual * h).
#include <torch/library.h>

#include "cpu/norm_modulate.h"
#include "entry_points.h"

namespace adaptiveload {

// The only TORCH_LIBRARY block of the namespace; cuda/dispatch.cu adds its private ops with
// TORCH_LIBRARY_FRAGMENT.
TORCH_LIBRARY(adaptiveload, m) {
  for (const Variant& v : kVariants) {
    m.def(forward_schema(v).c_str());
    m.def(backward_schema(v).c_str());
  }
}

TORCH_LIBRARY_IMPL(adaptiveload, CPU, m) {
  register_kernels<norm_modulate_fwd_cpu, norm_modulate_bwd_cpu>(m);
}

}  // namespace adaptiveload
