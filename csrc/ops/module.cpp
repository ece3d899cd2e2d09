// adaptiveload._C: importing it loads this shared library, whose static TORCH_LIBRARY
// registrations make the ops available under torch.ops.adaptiveload. It also holds direct
// callers of the forward ops (one per variant of kVariants, variants.h), which adaptiveload.ops
// uses outside torch.compile: they call the same dispatcher ops (autograd, CUDA graphs and
// dispatch modes included), but skip the boxed argument conversion of torch.ops, a large part of
// a small call's host time. It lists the variants for Python (_variants), and CUDA builds expose
// the tuning tables as structured rows (_tuning_table).
#include <torch/extension.h>

#include <tuple>
#include <utility>

#include "signatures.h"
#ifdef ADAPTIVELOAD_WITH_CUDA
#include "tuning_table.h"
#endif

namespace {

using adaptiveload::Arg;
using adaptiveload::Args;
using adaptiveload::ArgT;
using adaptiveload::ForwardArgs;
using adaptiveload::kVariants;

template <int I, typename A = ForwardArgs<I>>
struct DirectCaller;

// _C.<op>(the op's arguments): y for a plain op, (r, y) for a gated one.
template <int I, Arg... A>
struct DirectCaller<I, Args<A...>> {
  static auto call(ArgT<I, A>... args) {
    auto out = adaptiveload::forward_handle<I>().call(args...);
    if constexpr (kVariants[I].gated) {
      return std::make_tuple(std::move(std::get<0>(out)), std::move(std::get<1>(out)));
    } else {
      return std::move(std::get<0>(out));
    }
  }
};

template <int... I>
void def_direct_callers(pybind11::module_& m, std::integer_sequence<int, I...>) {
  (m.def(kVariants[I].name, &DirectCaller<I>::call), ...);
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  def_direct_callers(m, std::make_integer_sequence<int, adaptiveload::kNumVariants>{});
  // Private: the rows of kVariants as (name, norm, gated), norm "layer" or "rms", for the fake
  // kernels of adaptiveload.ops.
  m.def("_variants", [] {
    pybind11::list rows;
    for (const adaptiveload::Variant& v : kVariants) {
      const char* norm = adaptiveload::is_rms(v) ? "rms" : "layer";
      rows.append(pybind11::make_tuple(v.name, norm, v.gated));
    }
    return rows;
  });
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
