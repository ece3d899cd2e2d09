// Autograd of every op of kVariants (variants.h): the forward creates the variant's graph node
// (autograd/nodes.h: ModulateBackward for the plain ops, GatedModulateBackward for the gated)
// when an input requires grad, runs the op below autograd, and saves what the backward reads.
// The plain ops save x; the gated ops save r (an output) in place of residual, and h and gate;
// both save the operands and the per-row statistics (mean for LayerNorm only, rstd).
#include <torch/library.h>

#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

#include "nodes.h"

namespace adaptiveload {
namespace {

using autograd_detail::GatedModulateBackward;
using autograd_detail::make_node;
using autograd_detail::ModulateBackward;
using autograd_detail::NodePtr;
using autograd_detail::or_undefined;
using autograd_detail::refuse_forward_ad;
using torch::autograd::SavedVariable;

const at::Tensor& as_tensor(const at::Tensor& t) { return t; }
const at::Tensor& as_tensor(const OptTensor& t) { return or_undefined(t); }

template <int I, typename A = ForwardArgs<I>>
struct AutogradOp;

template <int I, Arg... A>
struct AutogradOp<I, Args<A...>> {
  static constexpr Variant kV = kVariants[I];
  static constexpr SmallList<Arg> kGrads = grad_inputs(kV);
  using NodeType = std::conditional_t<kV.gated, GatedModulateBackward<I>, ModulateBackward<I>>;

  // Refuses forward-mode AD; the node (null unless an input requires grad), its next edges the
  // differentiable inputs in gradient order.
  template <size_t... K>
  static NodePtr<NodeType> make(const OpArgs& o, std::index_sequence<K...>) {
    refuse_forward_ad(kV.name, as_tensor(get<I, kGrads.at[K]>(o))...);
    return make_node<NodeType>(get<I, kGrads.at[K]>(o)...);
  }

  static ForwardResult<I> call(ArgT<I, A>... args) {
    OpArgs o;
    (put<A>(o, args), ...);
    auto node = make(o, std::make_index_sequence<kGrads.size>{});
    ForwardResult<I> out = [&] {
      at::AutoDispatchBelowADInplaceOrView below;
      return forward_handle<I>().call(args...);
    }();
    if (node) save(node, o, out);
    return out;
  }

  static void save(const NodePtr<NodeType>& node, const OpArgs& o, const ForwardResult<I>& out) {
    constexpr int n = std::tuple_size_v<ForwardResult<I>>;  // ..., [mean,] rstd
    if constexpr (kV.gated) {
      torch::autograd::set_history(std::get<0>(out), node);  // r: the node's input 0
      torch::autograd::set_history(std::get<1>(out), node);  // y: input 1
      node->r = SavedVariable(std::get<0>(out), true);
      node->h = SavedVariable(*o.h, false);
      node->gate = SavedVariable(*o.gate, false);
    } else {
      // y is differentiable; mean and rstd are not (they get no history).
      torch::autograd::set_history(std::get<0>(out), node);
      node->x = SavedVariable(*o.x, false);
    }
    node->shift = SavedVariable(*o.shift, false);
    node->scale = SavedVariable(*o.scale, false);
    node->weight = SavedVariable(or_undefined(*o.weight), false);
    if constexpr (!is_rms(kV)) {
      node->bias = SavedVariable(or_undefined(*o.bias), false);
      node->mean = SavedVariable(std::get<n - 2>(out), false);
    }
    node->rstd = SavedVariable(std::get<n - 1>(out), false);
    node->eps = o.eps;
  }
};

template <int... I>
void register_autograd(torch::Library& m, std::integer_sequence<int, I...>) {
  (m.impl(kVariants[I].name, &AutogradOp<I>::call), ...);
}

}  // namespace

TORCH_LIBRARY_IMPL(adaptiveload, Autograd, m) {
  register_autograd(m, std::make_integer_sequence<int, kNumVariants>{});
}

}  // namespace adaptiveload
