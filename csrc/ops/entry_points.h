// The ops' entry points, shared by every backend: validation, outputs, broadcast operands and
// gradient targets (the host prologue), then the backend's kernels. Each backend registers the
// op templates below for every variant of kVariants (variants.h) with its two kernel functions:
//
//   TORCH_LIBRARY_IMPL(adaptiveload, CPU, m) {
//     register_kernels<norm_modulate_fwd_cpu, norm_modulate_bwd_cpu>(m);
//   }
//
// `Config`: the explicit configuration a private *_with_config op passes through (CUDA's
// tuning-table rows), nullptr for the ops themselves.
#pragma once

#include <torch/library.h>

#include <array>
#include <string>
#include <tuple>
#include <utility>

#include "problem.h"
#include "signatures.h"

namespace adaptiveload {

using ForwardKernels = void (*)(const ForwardProblem&, const std::string* config);
using BackwardKernels = void (*)(const BackwardProblem&, const std::string* config);

// Fwd2, Fwd3, Fwd4, Bwd4, Bwd5, Bwd6, Bwd7: the ops' result tuples (problem.h).

// The inputs both entry points take: the gated op's (x, h, gate, ...) when h is given, else
// the plain op's.
inline void check_op_inputs(const char* op, const char* x_name, const at::Tensor& x,
                            const std::optional<at::Tensor>& h,
                            const std::optional<at::Tensor>& gate, const at::Tensor& shift,
                            const at::Tensor& scale, const std::optional<at::Tensor>& weight,
                            const std::optional<at::Tensor>& bias) {
  if (h.has_value()) {
    TORCH_CHECK(gate.has_value(), op, ": the gated op needs gate");
    check_inputs(op, x_name, x, {{"gate", *gate}, {"shift", shift}, {"scale", scale}}, weight,
                 bias);
    check_residual_pair(op, x, *h);
  } else {
    check_inputs(op, x_name, x, {{"shift", shift}, {"scale", scale}}, weight, bias);
  }
}

// The gated op when h is given (then gate is too), else the plain op; RMSNorm when rms (no
// bias). Returns (r, y, mean, rstd), r undefined for the plain op, mean for RMSNorm.
inline Fwd4 forward_entry(ForwardKernels kernels, const char* op, bool rms, const at::Tensor& x,
                          const std::optional<at::Tensor>& h_in,
                          const std::optional<at::Tensor>& gate, const at::Tensor& shift,
                          const at::Tensor& scale, const std::optional<at::Tensor>& weight,
                          const std::optional<at::Tensor>& bias, double eps,
                          std::optional<at::ScalarType> out_dtype, const std::string* config) {
  const bool gated = h_in.has_value();
  const char* x_name = gated ? "residual" : "x";
  check_op_inputs(op, x_name, x, h_in, gate, shift, scale, weight, bias);
  at::Tensor h, r;
  if (gated) {
    h = h_in->contiguous();
    r = at::empty_like(x, at::MemoryFormat::Contiguous);
  }
  auto [y, mean, rstd] = make_forward_outputs(op, x, out_dtype, rms);
  if (x.numel() == 0) return {r, y, mean, rstd};
  const Operand sh = prepare_operand(shift, x), sc = prepare_operand(scale, x);
  const Operand g = gated ? prepare_operand(*gate, x) : Operand{};
  ForwardProblem p{};
  p.rms = rms;
  p.x = &x;
  if (gated) p.h = &h, p.gate = &g, p.r = &r;
  p.shift = &sh;
  p.scale = &sc;
  p.weight = &weight;
  p.bias = &bias;
  p.eps = eps;
  p.y = &y;
  p.mean = &mean;
  p.rstd = &rstd;
  kernels(p, config);
  return {r, y, mean, rstd};
}

// Gradients in output-mask order (dx or dresidual, dh, dgate, dshift, dscale, dweight, dbias);
// masked-off outputs come back empty. The plain op passes no h (then dh and dgate are undefined);
// RMSNorm (rms) passes an undefined mean and no bias.
inline Bwd7 backward_entry(BackwardKernels kernels, const char* op, bool rms,
                           const std::optional<at::Tensor>& dr_in, const at::Tensor& dy_in,
                           const at::Tensor& x, const std::optional<at::Tensor>& h_in,
                           const std::optional<at::Tensor>& gate, const at::Tensor& shift,
                           const at::Tensor& scale, const std::optional<at::Tensor>& weight,
                           const std::optional<at::Tensor>& bias, const at::Tensor& mean,
                           const at::Tensor& rstd, std::array<bool, 7> mask,
                           const std::string* config) {
  const bool gated = h_in.has_value();
  const char* x_name = gated ? "r" : "x";
  check_op_inputs(op, x_name, x, h_in, gate, shift, scale, weight, bias);
  check_grad_input(op, "dy", dy_in, x_name, x);
  TORCH_INTERNAL_ASSERT(rms != mean.defined(), op, ": mean is saved by LayerNorm only");
  check_stats(op, mean, rstd, x);
  const at::Tensor dy = dy_in.contiguous();
  at::Tensor h, dr;
  if (gated) {
    h = h_in->contiguous();
    if (dr_in.has_value() && dr_in->defined()) {
      check_grad_input(op, "dr", *dr_in, x_name, x);
      dr = dr_in->to(x.scalar_type()).contiguous();  // kernels read dr in r's dtype
    }
  }
  const auto acc = stats_dtype(x);
  const auto contiguous = at::MemoryFormat::Contiguous;
  at::Tensor dx = mask[0] ? at::empty_like(x, contiguous) : at::empty({0}, x.options());
  // The plain op has no dh or dgate (left undefined; its entry point drops them).
  at::Tensor dh;
  if (gated) dh = mask[1] ? at::empty_like(h, contiguous) : at::empty({0}, x.options());
  GradTarget dgate = gated ? make_grad_target(*gate, x, mask[2], acc) : GradTarget{};
  GradTarget dshift = make_grad_target(shift, x, mask[3], acc);
  GradTarget dscale = make_grad_target(scale, x, mask[4], acc);
  GradTarget dweight = make_grad_target(weight.value_or(x), x, mask[5] && weight.has_value(), acc);
  GradTarget dbias = make_grad_target(bias.value_or(x), x, mask[6] && bias.has_value(), acc);
  if (x.numel() > 0) {
    const Operand sc = prepare_operand(scale, x);
    const Operand g = gated ? prepare_operand(*gate, x) : Operand{};
    const at::Tensor mean_c = rms ? at::Tensor() : mean.contiguous(), rstd_c = rstd.contiguous();
    BackwardProblem p{};
    p.rms = rms;
    p.dy = &dy;
    p.x = &x;
    if (gated) p.dr = &dr, p.h = &h, p.gate = &g, p.dh = &dh;
    p.scale = &sc;
    p.weight = &weight;
    p.bias = &bias;
    p.mean = &mean_c;
    p.rstd = &rstd_c;
    p.dx = &dx;
    p.targets[kTargetShift] = &dshift;
    p.targets[kTargetScale] = &dscale;
    p.targets[kTargetGate] = &dgate;
    p.targets[kTargetWeight] = &dweight;
    p.targets[kTargetBias] = &dbias;
    kernels(p, config);
    for (GradTarget* t : p.targets) finish_grad(*t);
  } else {
    for (GradTarget* t : {&dgate, &dshift, &dscale, &dweight, &dbias})
      if (t->out.defined() && t->out.numel() > 0) t->out.zero_();
  }
  return {dx, dh, dgate.out, dshift.out, dscale.out, dweight.out, dbias.out};
}

// ---- the ops, for m.impl: variant I of kVariants (variants.h) with a backend's kernels ----

inline const OptTensor& no_tensor() {
  static const OptTensor none;
  return none;
}

inline const at::Tensor& undefined_tensor() {
  static const at::Tensor undefined;
  return undefined;
}

// The variant's results, picked from forward_entry's (r, y, mean, rstd).
template <int I, size_t... K>
ForwardResult<I> forward_results(Fwd4&& all, std::index_sequence<K...>) {
  return ForwardResult<I>(std::move(std::get<forward_outputs(kVariants[I]).at[K]>(all))...);
}

// The variant's gradients, picked from backward_entry's (dx, dh, dgate, ..., dbias).
template <int I, size_t... K>
BackwardResult<I> backward_results(Bwd7&& all, std::index_sequence<K...>) {
  return BackwardResult<I>(
      std::move(std::get<grad_position(grad_inputs(kVariants[I]).at[K])>(all))...);
}

template <int I, ForwardKernels K, typename A = ForwardArgs<I>>
struct ForwardOp;

// The op: forward_entry for the variant's norm, with h and gate when it is gated.
template <int I, ForwardKernels K, Arg... A>
struct ForwardOp<I, K, Args<A...>> {
  static ForwardResult<I> call(ArgT<I, A>... args) {
    constexpr Variant v = kVariants[I];
    OpArgs o;
    (put<A>(o, args), ...);
    OptTensor h, gate;
    if constexpr (v.gated) h = *o.h, gate = *o.gate;
    return forward_results<I>(
        forward_entry(K, v.name, is_rms(v), *o.x, h, gate, *o.shift, *o.scale, *o.weight,
                      o.bias != nullptr ? *o.bias : no_tensor(), o.eps, o.out_dtype, nullptr),
        std::make_index_sequence<forward_outputs(v).size>{});
  }
};

template <int I, BackwardKernels K, typename A = BackwardArgs<I>>
struct BackwardOp;

// The op's backward: backward_entry with the variant's mask spread over the seven gradients.
template <int I, BackwardKernels K, Arg... A>
struct BackwardOp<I, K, Args<A...>> {
  static BackwardResult<I> call(ArgT<I, A>... args) {
    constexpr Variant v = kVariants[I];
    constexpr SmallList<Arg> grads = grad_inputs(v);
    static const std::string name = backward_name(v);
    OpArgs o;
    (put<A>(o, args), ...);
    std::array<bool, 7> mask{};
    for (int k = 0; k < grads.size; ++k) mask[grad_position(grads.at[k])] = o.mask[k];
    OptTensor h, gate;
    if constexpr (v.gated) h = *o.h, gate = *o.gate;
    return backward_results<I>(
        backward_entry(K, name.c_str(), is_rms(v), o.dr != nullptr ? *o.dr : no_tensor(), *o.dy,
                       *o.x, h, gate, *o.shift, *o.scale, *o.weight,
                       o.bias != nullptr ? *o.bias : no_tensor(),
                       o.mean != nullptr ? *o.mean : undefined_tensor(), *o.rstd, mask, nullptr),
        std::make_index_sequence<grads.size>{});
  }
};

template <ForwardKernels F, BackwardKernels B, int... I>
void register_kernels(torch::Library& m, std::integer_sequence<int, I...>) {
  (m.impl(kVariants[I].name, &ForwardOp<I, F>::call), ...);
  (m.impl(backward_name(kVariants[I]).c_str(), &BackwardOp<I, B>::call), ...);
}

// Registers every variant's op and backward with a backend's kernels (in its
// TORCH_LIBRARY_IMPL block).
template <ForwardKernels F, BackwardKernels B>
void register_kernels(torch::Library& m) {
  register_kernels<F, B>(m, std::make_integer_sequence<int, kNumVariants>{});
}

}  // namespace adaptiveload
