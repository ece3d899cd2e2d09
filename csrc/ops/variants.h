// The norm-modulate ops, declared once: every row of kVariants below is one public op
// (torch.ops.adaptiveload.<name>) and its private backward (_<name>_backward). Everything else
// about a variant follows from its row (signatures.h): its two schemas, the typed C++ signatures
// and dispatcher handles, the CPU and CUDA kernels registered for it (entry_points.h, through
// the host prologue), its autograd (autograd/autograd.cpp, autograd/nodes.h) and the _C direct
// caller of its forward (module.cpp). Python reads the rows from _C._variants() and registers
// each one's fake kernels (python/adaptiveload/ops.py); what is written per op is its public
// function (ops.py, with its docstring), its export (adaptiveload/__init__.py) and, if it has
// one, its nn module (nn.py). Adding a row for another norm means kernels for it too (problem.h's
// ForwardProblem::rms, cpu/norm_modulate.cpp, cuda/).
//
// A row is {name, norm, gated}:
//   name   the op's name; its backward is _<name>_backward.
//   norm   NormKind::kLayer: LayerNorm, with optional weight and bias; saves mean and rstd.
//          NormKind::kRms: RMSNorm, optional weight, no bias; saves rstd.
//   gated  false: y = Norm(x) * (1 + scale) + shift.
//          true: r = residual + gate * h first, then y of r; returns r as well.
//
// The row {"rms_norm_modulate", NormKind::kRms, false}, for example, defines
//   rms_norm_modulate(Tensor x, Tensor shift, Tensor scale, Tensor? weight, float eps,
//       ScalarType? out_dtype) -> (Tensor y, Tensor rstd)
//   _rms_norm_modulate_backward(Tensor dy, Tensor x, Tensor shift, Tensor scale,
//       Tensor? weight, Tensor rstd, bool[4] output_mask)
//       -> (Tensor dx, Tensor dshift, Tensor dscale, Tensor dweight)
// and the gated rows add (Tensor residual, Tensor h, Tensor gate) in place of x, the output r
// and, in the backward, Tensor? dr first and the gradients dresidual, dh and dgate. The schemas
// of all eight ops are pinned in tests/python/test_ops_schemas.py.
//
// What runs for op X (row I): under autograd AutogradOp<I>::call (autograd/autograd.cpp), then
// on a device ForwardOp<I, kernels>::call (entry_points.h), which runs forward_entry, the host
// prologue, and then the backend's kernels: norm_modulate_fwd_cpu (cpu/norm_modulate.cpp) or
// fwd_cuda (cuda/dispatch.cu, which picks a row of the tuning tables). The backward likewise:
// the node's apply (autograd/nodes.h), BackwardOp<I, kernels>::call, backward_entry.
#pragma once

namespace adaptiveload {

enum class NormKind { kLayer, kRms };

struct Variant {
  const char* name;
  NormKind norm;
  bool gated;
};

inline constexpr Variant kVariants[] = {
    {"layer_norm_modulate", NormKind::kLayer, false},
    {"gated_residual_layer_norm_modulate", NormKind::kLayer, true},
    {"rms_norm_modulate", NormKind::kRms, false},
    {"gated_residual_rms_norm_modulate", NormKind::kRms, true},
};

inline constexpr int kNumVariants = sizeof(kVariants) / sizeof(kVariants[0]);

}  // namespace adaptiveload
