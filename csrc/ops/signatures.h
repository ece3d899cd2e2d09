// What a row of kVariants (variants.h) implies: the arguments of the op and of its backward, in
// schema order, as constexpr lists; the schema text built from them; the C++ types of the
// arguments and results; and the typed dispatcher handles that C++ callers use (autograd, the
// _C direct callers). The schema text and the C++ types come from the same lists, so they agree
// by construction (and torch checks a registered kernel's type against the schema).
//
// Templates take the variant's index I in kVariants; ForwardArgs<I> / BackwardArgs<I> are the
// argument lists as a parameter pack (Args<Arg...>), which the op templates expand into their
// parameter lists (entry_points.h, autograd/autograd.cpp, module.cpp).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <array>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "problem.h"
#include "variants.h"

namespace adaptiveload {

// Every argument an op of the family may take. kX is x (plain ops), residual (gated forward) or
// r (gated backward).
enum class Arg {
  kDr,
  kDy,
  kX,
  kH,
  kGate,
  kShift,
  kScale,
  kWeight,
  kBias,
  kMean,
  kRstd,
  kEps,
  kOutDtype,
  kMask
};

// A short list built at compile time.
template <typename T>
struct SmallList {
  T at[16]{};
  int size = 0;
  constexpr void add(T v) { at[size++] = v; }
};

constexpr bool is_rms(const Variant& v) { return v.norm == NormKind::kRms; }

// The differentiable inputs, in the order of the backward's gradients and of output_mask.
constexpr SmallList<Arg> grad_inputs(const Variant& v) {
  SmallList<Arg> l;
  l.add(Arg::kX);
  if (v.gated) l.add(Arg::kH), l.add(Arg::kGate);
  l.add(Arg::kShift), l.add(Arg::kScale), l.add(Arg::kWeight);
  if (!is_rms(v)) l.add(Arg::kBias);
  return l;
}

// op(inputs..., eps, out_dtype)
constexpr SmallList<Arg> forward_args(const Variant& v) {
  SmallList<Arg> l = grad_inputs(v);
  l.add(Arg::kEps), l.add(Arg::kOutDtype);
  return l;
}

// _op_backward([dr,] dy, inputs..., [mean,] rstd, output_mask)
constexpr SmallList<Arg> backward_args(const Variant& v) {
  SmallList<Arg> l;
  if (v.gated) l.add(Arg::kDr);
  l.add(Arg::kDy);
  const SmallList<Arg> in = grad_inputs(v);
  for (int i = 0; i < in.size; ++i) l.add(in.at[i]);
  if (!is_rms(v)) l.add(Arg::kMean);
  l.add(Arg::kRstd), l.add(Arg::kMask);
  return l;
}

// The forward's results, as positions in (r, y, mean, rstd) (what forward_entry returns):
// [r,] y, [mean,] rstd.
constexpr SmallList<int> forward_outputs(const Variant& v) {
  SmallList<int> l;
  if (v.gated) l.add(0);
  l.add(1);
  if (!is_rms(v)) l.add(2);
  l.add(3);
  return l;
}

// The position of an input's gradient in (dx, dh, dgate, dshift, dscale, dweight, dbias), what
// backward_entry returns and takes as its mask.
constexpr int grad_position(Arg a) {
  switch (a) {
    case Arg::kX:
      return 0;
    case Arg::kH:
      return 1;
    case Arg::kGate:
      return 2;
    case Arg::kShift:
      return 3;
    case Arg::kScale:
      return 4;
    case Arg::kWeight:
      return 5;
    default:
      return 6;  // kBias
  }
}

// ---- the schema text ----

inline const char* arg_name(const Variant& v, bool backward, Arg a) {
  switch (a) {
    case Arg::kDr:
      return "dr";
    case Arg::kDy:
      return "dy";
    case Arg::kX:
      return !v.gated ? "x" : backward ? "r" : "residual";
    case Arg::kH:
      return "h";
    case Arg::kGate:
      return "gate";
    case Arg::kShift:
      return "shift";
    case Arg::kScale:
      return "scale";
    case Arg::kWeight:
      return "weight";
    case Arg::kBias:
      return "bias";
    case Arg::kMean:
      return "mean";
    case Arg::kRstd:
      return "rstd";
    case Arg::kEps:
      return "eps";
    case Arg::kOutDtype:
      return "out_dtype";
    case Arg::kMask:
      return "output_mask";
  }
  return "";
}

inline std::string arg_type(const Variant& v, Arg a) {
  switch (a) {
    case Arg::kDr:
    case Arg::kWeight:
    case Arg::kBias:
      return "Tensor?";
    case Arg::kEps:
      return "float";
    case Arg::kOutDtype:
      return "ScalarType?";
    case Arg::kMask:
      return "bool[" + std::to_string(grad_inputs(v).size) + "]";
    default:
      return "Tensor";
  }
}

inline std::string backward_name(const Variant& v) {
  return "_" + std::string(v.name) + "_backward";
}

inline std::string schema_args(const Variant& v, bool backward) {
  const SmallList<Arg> args = backward ? backward_args(v) : forward_args(v);
  std::string s;
  for (int i = 0; i < args.size; ++i) {
    if (i > 0) s += ", ";
    s += arg_type(v, args.at[i]) + " " + arg_name(v, backward, args.at[i]);
  }
  return s;
}

inline std::string forward_schema(const Variant& v) {
  static const char* const names[4] = {"r", "y", "mean", "rstd"};
  const SmallList<int> outs = forward_outputs(v);
  std::string s = std::string(v.name) + "(" + schema_args(v, false) + ") -> (";
  for (int i = 0; i < outs.size; ++i)
    s += (i > 0 ? ", Tensor " : "Tensor ") + std::string(names[outs.at[i]]);
  return s + ")";
}

// Gradients are named d<input>: dx (dresidual for the gated ops), dh, ..., dbias.
inline std::string backward_schema(const Variant& v) {
  const SmallList<Arg> grads = grad_inputs(v);
  std::string s = backward_name(v) + "(" + schema_args(v, true) + ") -> (";
  for (int i = 0; i < grads.size; ++i)
    s += (i > 0 ? ", Tensor d" : "Tensor d") + std::string(arg_name(v, false, grads.at[i]));
  return s + ")";
}

// ---- the C++ types ----

template <Arg... A>
struct Args {};

template <int I, size_t... K>
constexpr auto forward_pack(std::index_sequence<K...>) {
  return Args<forward_args(kVariants[I]).at[K]...>{};
}
template <int I, size_t... K>
constexpr auto backward_pack(std::index_sequence<K...>) {
  return Args<backward_args(kVariants[I]).at[K]...>{};
}
template <int I>
using ForwardArgs =
    decltype(forward_pack<I>(std::make_index_sequence<forward_args(kVariants[I]).size>{}));
template <int I>
using BackwardArgs =
    decltype(backward_pack<I>(std::make_index_sequence<backward_args(kVariants[I]).size>{}));

// How a kernel takes each argument: tensors by const reference, the rest as the schema says.
template <int I, Arg A>
struct ArgTypeOf {
  using type = const at::Tensor&;
};
template <int I>
struct ArgTypeOf<I, Arg::kDr> {
  using type = const OptTensor&;
};
template <int I>
struct ArgTypeOf<I, Arg::kWeight> {
  using type = const OptTensor&;
};
template <int I>
struct ArgTypeOf<I, Arg::kBias> {
  using type = const OptTensor&;
};
template <int I>
struct ArgTypeOf<I, Arg::kEps> {
  using type = double;
};
template <int I>
struct ArgTypeOf<I, Arg::kOutDtype> {
  using type = std::optional<at::ScalarType>;
};
template <int I>
struct ArgTypeOf<I, Arg::kMask> {
  using type = std::array<bool, grad_inputs(kVariants[I]).size>;
};
template <int I, Arg A>
using ArgT = typename ArgTypeOf<I, A>::type;

// A tuple of N tensors.
template <size_t... K>
std::tuple<std::enable_if_t<(K >= 0), at::Tensor>...> tensor_tuple(std::index_sequence<K...>);
template <size_t N>
using Tensors = decltype(tensor_tuple(std::make_index_sequence<N>{}));

template <int I>
using ForwardResult = Tensors<forward_outputs(kVariants[I]).size>;
template <int I>
using BackwardResult = Tensors<grad_inputs(kVariants[I]).size>;

template <int I, typename A = ForwardArgs<I>>
struct ForwardSignature;
template <int I, Arg... A>
struct ForwardSignature<I, Args<A...>> {
  using type = ForwardResult<I>(ArgT<I, A>...);
};
template <int I, typename A = BackwardArgs<I>>
struct BackwardSignature;
template <int I, Arg... A>
struct BackwardSignature<I, Args<A...>> {
  using type = BackwardResult<I>(ArgT<I, A>...);
};

// ---- the arguments of one call, by role ----

// Pointers to a call's arguments (valid during the call), so that code common to every variant
// can find each by its role; absent ones stay null.
struct OpArgs {
  const OptTensor* dr = nullptr;
  const at::Tensor* dy = nullptr;
  const at::Tensor* x = nullptr;
  const at::Tensor* h = nullptr;
  const at::Tensor* gate = nullptr;
  const at::Tensor* shift = nullptr;
  const at::Tensor* scale = nullptr;
  const OptTensor* weight = nullptr;
  const OptTensor* bias = nullptr;
  const at::Tensor* mean = nullptr;
  const at::Tensor* rstd = nullptr;
  double eps = 0.0;
  std::optional<at::ScalarType> out_dtype;
  const bool* mask = nullptr;  // one entry per grad_inputs(v)
};

template <Arg A, typename T>
void put(OpArgs& o, const T& v) {
  if constexpr (A == Arg::kDr) o.dr = &v;
  if constexpr (A == Arg::kDy) o.dy = &v;
  if constexpr (A == Arg::kX) o.x = &v;
  if constexpr (A == Arg::kH) o.h = &v;
  if constexpr (A == Arg::kGate) o.gate = &v;
  if constexpr (A == Arg::kShift) o.shift = &v;
  if constexpr (A == Arg::kScale) o.scale = &v;
  if constexpr (A == Arg::kWeight) o.weight = &v;
  if constexpr (A == Arg::kBias) o.bias = &v;
  if constexpr (A == Arg::kMean) o.mean = &v;
  if constexpr (A == Arg::kRstd) o.rstd = &v;
  if constexpr (A == Arg::kEps) o.eps = v;
  if constexpr (A == Arg::kOutDtype) o.out_dtype = v;
  if constexpr (A == Arg::kMask) o.mask = v.data();
}

// The arguments of variant I's op or backward, from their roles.
template <int I, Arg A>
ArgT<I, A> get(const OpArgs& o) {
  if constexpr (A == Arg::kDr) {
    return *o.dr;
  } else if constexpr (A == Arg::kDy) {
    return *o.dy;
  } else if constexpr (A == Arg::kX) {
    return *o.x;
  } else if constexpr (A == Arg::kH) {
    return *o.h;
  } else if constexpr (A == Arg::kGate) {
    return *o.gate;
  } else if constexpr (A == Arg::kShift) {
    return *o.shift;
  } else if constexpr (A == Arg::kScale) {
    return *o.scale;
  } else if constexpr (A == Arg::kWeight) {
    return *o.weight;
  } else if constexpr (A == Arg::kBias) {
    return *o.bias;
  } else if constexpr (A == Arg::kMean) {
    return *o.mean;
  } else if constexpr (A == Arg::kRstd) {
    return *o.rstd;
  } else if constexpr (A == Arg::kEps) {
    return o.eps;
  } else if constexpr (A == Arg::kOutDtype) {
    return o.out_dtype;
  } else {  // kMask
    ArgT<I, A> m{};
    for (size_t i = 0; i < m.size(); ++i) m[i] = o.mask[i];
    return m;
  }
}

// ---- typed dispatcher handles, each looked up once ----

template <int I>
const auto& forward_handle() {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow(("adaptiveload::" + std::string(kVariants[I].name)).c_str(), "")
          .typed<typename ForwardSignature<I>::type>();
  return op;
}

template <int I>
const auto& backward_handle() {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow(("adaptiveload::" + backward_name(kVariants[I])).c_str(), "")
          .typed<typename BackwardSignature<I>::type>();
  return op;
}

// Calls variant I's backward with the arguments o holds.
template <int I, Arg... A>
BackwardResult<I> call_backward(const OpArgs& o, Args<A...>) {
  return backward_handle<I>().call(get<I, A>(o)...);
}
template <int I>
BackwardResult<I> call_backward(const OpArgs& o) {
  return call_backward<I>(o, BackwardArgs<I>{});
}

}  // namespace adaptiveload
