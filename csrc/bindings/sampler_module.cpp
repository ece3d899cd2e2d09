// pybind11 binding of the sampler core: converts numpy arrays to and from the core's pointers
// and vectors, and checks what those pointers need (1-D shapes, lengths, indices and ranks in
// range), so that a bad argument raises instead of reading out of bounds. Nothing else: the
// planning is the core's.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "sampler/cost_model.h"
#include "sampler/memory_model.h"
#include "sampler/planner.h"
#include "sampler/stream.h"

namespace py = pybind11;
using adaptiveload::CostModel;
using adaptiveload::EpochPlan;
using adaptiveload::MemoryModel;
using adaptiveload::MemoryPolicy;
using adaptiveload::PlanOptions;
using adaptiveload::SampleTable;

namespace {

using Int64Array = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;
using DoubleArray = py::array_t<double, py::array::c_style | py::array::forcecast>;
using UInt8Array = py::array_t<uint8_t, py::array::c_style | py::array::forcecast>;

// Hands a vector to numpy without copying it.
template <typename T>
py::array_t<T> to_numpy(std::vector<T>&& v) {
  auto* owned = new std::vector<T>(std::move(v));
  py::capsule free_when_done(owned, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  return py::array_t<T>({static_cast<py::ssize_t>(owned->size())}, owned->data(), free_when_done);
}

const int64_t* checked_1d(const Int64Array& a, const char* name, py::ssize_t n) {
  if (a.ndim() != 1) throw py::value_error(std::string(name) + " must be 1-D");
  if (n >= 0 && a.shape(0) != n)
    throw py::value_error(std::string(name) + " has " + std::to_string(a.shape(0)) +
                          " entries, expected " + std::to_string(n));
  return a.data();
}

// A plan's layout (plan_layout.h) for Python's Plan, over its own copy of the rank offsets.
struct BoundLayout {
  int64_t num_replicas, micro_batches_per_step, num_steps;
  std::vector<int64_t> rank_offsets;  // empty: K each

  adaptiveload::PlanLayout get() const {
    return {num_replicas, micro_batches_per_step, num_steps,
            rank_offsets.empty() ? nullptr : rank_offsets.data()};
  }
  void check_rank(int64_t rank) const {
    if (rank < 0 || rank >= num_replicas)
      throw py::index_error("rank " + std::to_string(rank) + " out of range (" +
                            std::to_string(num_replicas) + " ranks)");
  }
  void check(int64_t step, int64_t rank) const {
    check_rank(rank);
    if (step < 0 || step >= num_steps)
      throw py::index_error("step " + std::to_string(step) + " out of range (" +
                            std::to_string(num_steps) + " steps)");
  }
  template <typename T>
  py::array_t<T> rank_sums(const py::array_t<T, py::array::c_style>& values) const {
    const int64_t ids = get().step_begin(num_steps);
    if (values.ndim() != 1 || values.shape(0) != ids)
      throw py::value_error("rank_sums takes one value per micro-batch (" + std::to_string(ids) +
                            ")");
    py::array_t<T> out(
        {static_cast<py::ssize_t>(num_steps), static_cast<py::ssize_t>(num_replicas)});
    get().rank_sums(values.data(), out.mutable_data());
    return out;
  }
};

// An EpochPlan as the dict adaptiveload.sampler.Plan is made from; arrays handed over uncopied.
py::dict plan_dict(EpochPlan&& plan, const PlanOptions& o, bool memory_policy) {
  py::dict out;
  out["num_replicas"] = plan.num_replicas;
  out["micro_batches_per_step"] = plan.micro_batches_per_step;
  out["num_steps"] = plan.num_steps;
  out["num_padded_samples"] = plan.num_padded_samples;
  out["num_dropped_samples"] = plan.num_dropped_samples;
  out["num_split_micro_batches"] = plan.num_split_micro_batches;
  out["samples"] = to_numpy(std::move(plan.samples));
  out["offsets"] = to_numpy(std::move(plan.offsets));
  out["costs"] = to_numpy(std::move(plan.costs));
  out["tokens"] = to_numpy(std::move(plan.tokens));
  out["padding"] = to_numpy(std::move(plan.padding));
  out["skipped"] = to_numpy(std::move(plan.skipped));
  if (memory_policy) out["checkpointed"] = to_numpy(std::move(plan.checkpointed));
  if (o.uneven_counts) out["rank_offsets"] = to_numpy(std::move(plan.rank_offsets));
  if (o.balance) out["window_strata"] = to_numpy(std::move(plan.window_strata));
  if (o.sequence_parallel.enabled()) {
    out["degrees"] = to_numpy(std::move(plan.degrees));
    out["members"] = to_numpy(std::move(plan.members));
  }
  return out;
}

// CostModel: the fitted form, its floor and measured kinds (cost_model.h).
void bind_cost_model(py::module_& m) {
  py::class_<CostModel>(m, "CostModel")
      .def_static("power", &CostModel::power, py::arg("p"), py::arg("coef") = 1.0)
      .def_static("polynomial", &CostModel::polynomial, py::arg("c0"), py::arg("c1"), py::arg("c2"),
                  py::arg("cs") = 0.0)
      .def("sample_cost", &CostModel::sample_cost, py::arg("seq_len"))
      .def("with_floor", &CostModel::with_floor, py::arg("h0"), py::arg("hs"))
      .def("with_split_kept", &CostModel::with_split_kept, py::arg("k0"), py::arg("k1"))
      .def(
          "with_measured",
          [](const CostModel& c,
             const std::vector<std::tuple<int64_t, int64_t, double, int64_t>>& kinds) {
            std::vector<adaptiveload::MeasuredKind> v;
            v.reserve(kinds.size());
            for (const auto& [s, b, cost, d] : kinds) v.push_back({s, b, cost, d});
            return c.with_measured(v);
          },
          py::arg("kinds"),
          "A copy whose measured kinds are [(seq_len, batch, cost, degree), ...] (degree 1: a "
          "whole micro-batch; d > 1: one rank's share of it split d ways).")
      .def("measured",
           [](const CostModel& c) {
             std::vector<std::tuple<int64_t, int64_t, double, int64_t>> out;
             for (const auto& k : c.measured())
               out.emplace_back(k.seq_len, k.batch, k.cost, k.degree);
             return out;
           })
      .def_property_readonly("num_measured", &CostModel::num_measured)
      .def(
          "batch_costs",
          [](const CostModel& c, const Int64Array& seq_lens, const Int64Array& offsets,
             bool fitted_only) {
            const int64_t* lens = checked_1d(seq_lens, "seq_lens", -1);
            const int64_t* off = checked_1d(offsets, "offsets", -1);
            const py::ssize_t m = offsets.shape(0) - 1;
            if (m < 0) throw py::value_error("offsets must hold at least one entry");
            std::vector<double> out(m);
            for (py::ssize_t i = 0; i < m; ++i) {
              if (off[i] < 0 || off[i] > off[i + 1] || off[i + 1] > seq_lens.shape(0))
                throw py::value_error("offsets must be non-decreasing and within seq_lens");
              adaptiveload::BatchStats b;
              for (int64_t j = off[i]; j < off[i + 1]; ++j) {
                if (lens[j] < 1) throw py::value_error("sequence lengths must be >= 1 token");
                b.add(lens[j], c.sample_cost(lens[j]));
              }
              out[i] = fitted_only ? c.fitted_cost(b) : c.batch_cost(b);
            }
            return to_numpy(std::move(out));
          },
          py::arg("seq_lens"), py::arg("offsets"), py::arg("fitted_only") = false,
          "Cost of each micro-batch seq_lens[offsets[i]:offsets[i+1]].")
      .def_property_readonly("is_power",
                             [](const CostModel& c) { return c.kind == CostModel::Kind::kPower; })
      .def_readonly("p", &CostModel::p)
      .def_readonly("coef", &CostModel::coef)
      .def_readonly("c0", &CostModel::c0)
      .def_readonly("c1", &CostModel::c1)
      .def_readonly("c2", &CostModel::c2)
      .def_readonly("cs", &CostModel::cs)
      .def_readonly("h0", &CostModel::h0)
      .def_readonly("hs", &CostModel::hs)
      .def_readonly("k0", &CostModel::k0)
      .def_readonly("k1", &CostModel::k1)
      .def("__repr__", &CostModel::describe);
}

// MemoryModel: peak memory and the checkpointing policy (memory_model.h).
void bind_memory_model(py::module_& m) {
  py::class_<MemoryModel>(m, "MemoryModel")
      .def(py::init([](int64_t num_blocks, double m0, double mb, double mbk, double mt, double ma,
                       double mc, double mr, double margin, double recompute_share) {
             MemoryModel mm;
             mm.num_blocks = num_blocks;
             mm.m0 = m0;
             mm.mb = mb;
             mm.mbk = mbk;
             mm.mt = mt;
             mm.ma = ma;
             mm.mc = mc;
             mm.mr = mr;
             mm.margin = margin;
             mm.recompute_share = recompute_share;
             mm.validate();
             return mm;
           }),
           py::arg("num_blocks"), py::arg("m0"), py::arg("mb"), py::arg("mbk"), py::arg("mt"),
           py::arg("ma"), py::arg("mc"), py::arg("mr"), py::arg("margin"),
           py::arg("recompute_share"))
      .def("peak", &MemoryModel::peak, py::arg("count"), py::arg("tokens"), py::arg("checkpointed"),
           py::arg("held") = 0.0)
      .def("checkpointed_blocks", &MemoryModel::checkpointed_blocks, py::arg("count"),
           py::arg("tokens"), py::arg("budget"), py::arg("held") = 0.0)
      .def("time_factor", &MemoryModel::time_factor, py::arg("checkpointed"))
      .def_readonly("num_blocks", &MemoryModel::num_blocks)
      .def_readonly("m0", &MemoryModel::m0)
      .def_readonly("mb", &MemoryModel::mb)
      .def_readonly("mbk", &MemoryModel::mbk)
      .def_readonly("mt", &MemoryModel::mt)
      .def_readonly("ma", &MemoryModel::ma)
      .def_readonly("mc", &MemoryModel::mc)
      .def_readonly("mr", &MemoryModel::mr)
      .def_readonly("margin", &MemoryModel::margin)
      .def_readonly("recompute_share", &MemoryModel::recompute_share)
      .def("__repr__", &MemoryModel::describe);
}

// SampleTable: the lengths, groups and costs the planner reads (planner.h).
void bind_sample_table(py::module_& m) {
  py::class_<SampleTable>(m, "SampleTable")
      .def(py::init([](const Int64Array& seq_lens, std::optional<Int64Array> group_ids,
                       const CostModel& cost, std::optional<MemoryModel> memory_model,
                       double memory_budget, std::vector<double> memory_held) {
             const int64_t* lens = checked_1d(seq_lens, "seq_lens", -1);
             const int64_t* ids =
                 group_ids ? checked_1d(*group_ids, "group_ids", seq_lens.shape(0)) : nullptr;
             if (!memory_model)
               return std::make_unique<SampleTable>(lens, seq_lens.shape(0), ids, cost);
             const MemoryPolicy policy{*memory_model, memory_budget, std::move(memory_held)};
             policy.validate();
             return std::make_unique<SampleTable>(lens, seq_lens.shape(0), ids, cost, &policy);
           }),
           py::arg("seq_lens"), py::arg("group_ids"), py::arg("cost_model"),
           py::arg("memory_model") = py::none(), py::arg("memory_budget") = 0.0,
           py::arg("memory_held") = std::vector<double>{})
      .def("__len__", &SampleTable::size)
      .def_property_readonly("num_groups", &SampleTable::num_groups)
      .def("default_max_cost", &SampleTable::default_max_cost, py::arg("max_tokens"),
           py::arg("max_batch_size") = 0)
      .def(
          "oversize_samples",
          [](const SampleTable& t, int64_t max_tokens, double max_cost, int64_t max_degree) {
            if (max_degree < 1) throw py::value_error("max_degree must be >= 1");
            return to_numpy(t.oversize_samples(max_tokens, max_cost, max_degree));
          },
          py::arg("max_tokens"), py::arg("max_cost"), py::arg("max_degree") = 1)
      .def(
          "batch_cost",
          [](const SampleTable& t, const Int64Array& idx) {
            const int64_t* p = checked_1d(idx, "indices", -1);
            for (py::ssize_t j = 0; j < idx.shape(0); ++j)
              if (p[j] < 0 || p[j] >= t.size()) throw py::index_error("sample index out of range");
            return t.batch_cost(p, idx.shape(0));
          },
          py::arg("indices"))
      .def(
          "checkpointed_blocks",
          [](const SampleTable& t, const Int64Array& idx) {
            const int64_t* p = checked_1d(idx, "indices", -1);
            adaptiveload::BatchStats stats;
            for (py::ssize_t j = 0; j < idx.shape(0); ++j) {
              if (p[j] < 0 || p[j] >= t.size()) throw py::index_error("sample index out of range");
              stats.add(t.seq_len(p[j]), t.sample_cost(p[j]));
            }
            return t.checkpointed_blocks(stats);
          },
          py::arg("indices"))
      .def_property_readonly("has_memory_policy", &SampleTable::has_memory_policy);

  // The planner's options as one object; Python sets them by name.
}

// PlanOptions and plan_epoch: one epoch planned (planner.h).
void bind_planning(py::module_& m) {
  py::class_<PlanOptions>(m, "PlanOptions")
      .def(py::init<>())
      .def_readwrite("max_tokens", &PlanOptions::max_tokens)
      .def_readwrite("max_batch_size", &PlanOptions::max_batch_size)
      .def_readwrite("max_cost", &PlanOptions::max_cost)
      .def_readwrite("num_replicas", &PlanOptions::num_replicas)
      .def_readwrite("micro_batches_per_step", &PlanOptions::micro_batches_per_step)
      .def_readwrite("shuffle", &PlanOptions::shuffle)
      .def_readwrite("seed", &PlanOptions::seed)
      .def_readwrite("epoch", &PlanOptions::epoch)
      .def_readwrite("drop_last", &PlanOptions::drop_last)
      .def_readwrite("balance", &PlanOptions::balance)
      .def_readwrite("lookahead_steps", &PlanOptions::lookahead_steps)
      .def_readwrite("uneven_counts", &PlanOptions::uneven_counts)
      .def_readwrite("mix_tolerance", &PlanOptions::mix_tolerance)
      .def_readwrite("representative", &PlanOptions::representative)
      .def_property(
          "sequence_parallel", [](const PlanOptions& o) { return o.sequence_parallel.max_degree; },
          [](PlanOptions& o, int64_t d) { o.sequence_parallel.max_degree = d; })
      .def_property(
          "sequence_parallel_comm_per_token",
          [](const PlanOptions& o) { return o.sequence_parallel.comm_per_token; },
          [](PlanOptions& o, double c) { o.sequence_parallel.comm_per_token = c; })
      .def_property(
          "sequence_parallel_comm_fraction",
          [](const PlanOptions& o) { return o.sequence_parallel.comm_fraction; },
          [](PlanOptions& o, double c) { o.sequence_parallel.comm_fraction = c; })
      .def_property(
          "sequence_parallel_comm_scale",
          [](const PlanOptions& o) { return o.sequence_parallel.comm_scale; },
          [](PlanOptions& o, std::vector<double> g) {
            o.sequence_parallel.comm_scale = std::move(g);
          })
      .def_property(
          "skip_oversize",
          [](const PlanOptions& o) { return o.oversize == adaptiveload::OversizePolicy::kSkip; },
          [](PlanOptions& o, bool skip) {
            o.oversize =
                skip ? adaptiveload::OversizePolicy::kSkip : adaptiveload::OversizePolicy::kError;
          });

  m.def(
      "plan_epoch",
      [](const SampleTable& table, const PlanOptions& o, std::optional<UInt8Array> exclude) {
        const uint8_t* ex = nullptr;
        if (exclude) {
          if (exclude->ndim() != 1 || exclude->shape(0) != table.size())
            throw py::value_error("exclude must be 1-D with one flag per sample");
          ex = exclude->data();
        }
        EpochPlan plan;
        {
          py::gil_scoped_release release;
          plan = adaptiveload::plan_epoch(table, o, ex);
        }
        return plan_dict(std::move(plan), o, table.has_memory_policy());
      },
      py::arg("table"), py::arg("options"), py::arg("exclude") = py::none());

  // The plan's index arithmetic (plan_layout.h), for adaptiveload.sampler.Plan.
}

// PlanLayout: a plan read by step and rank (plan_layout.h).
void bind_plan_layout(py::module_& m) {
  py::class_<BoundLayout>(m, "PlanLayout")
      .def(py::init([](int64_t w, int64_t k, int64_t steps, std::optional<Int64Array> offsets) {
             if (w < 1 || k < 1 || steps < 0)
               throw py::value_error(
                   "PlanLayout needs num_replicas >= 1, "
                   "micro_batches_per_step >= 1 and num_steps >= 0");
             BoundLayout b{w, k, steps, {}};
             if (offsets) {
               const int64_t* p = checked_1d(*offsets, "rank_offsets", steps * w + 1);
               b.rank_offsets.assign(p, p + steps * w + 1);
             }
             return b;
           }),
           py::arg("num_replicas"), py::arg("micro_batches_per_step"), py::arg("num_steps"),
           py::arg("rank_offsets") = py::none())
      .def(
          "micro_batches_in_step",
          [](const BoundLayout& b, int64_t step, int64_t rank) {
            b.check(step, rank);
            return b.get().micro_batches_in_step(step, rank);
          },
          py::arg("step"), py::arg("rank"))
      .def(
          "micro_batch_id",
          [](const BoundLayout& b, int64_t step, int64_t rank, int64_t k) {
            b.check(step, rank);
            if (k < 0 || k >= b.get().micro_batches_in_step(step, rank))
              throw py::index_error("micro-batch " + std::to_string(k) + " out of range");
            return b.get().micro_batch_id(step, rank, k);
          },
          py::arg("step"), py::arg("rank"), py::arg("k"))
      .def(
          "rank_step_starts",
          [](const BoundLayout& b, int64_t rank) {
            b.check_rank(rank);
            return to_numpy(b.get().rank_step_starts(rank));
          },
          py::arg("rank"))
      .def(
          "step_begin",
          [](const BoundLayout& b, int64_t step) {
            if (step < 0 || step > b.num_steps)
              throw py::index_error("step " + std::to_string(step) + " out of range");
            return b.get().step_begin(step);
          },
          py::arg("step"))
      .def("rank_sums", &BoundLayout::rank_sums<int64_t>, py::arg("values").noconvert())
      .def("rank_sums", &BoundLayout::rank_sums<double>, py::arg("values"))
      .def(
          "first_of_every_rank",
          [](const BoundLayout& b, int64_t done) {
            if (done > b.num_steps * b.micro_batches_per_step || !b.rank_offsets.empty())
              throw py::value_error(
                  "first_of_every_rank: K-each layouts, at most all micro-batches");
            return to_numpy(b.get().first_of_every_rank(done));
          },
          py::arg("done"));
}

// One step's degrees and groups (sequence_parallel.h), for tests and the replay.
void bind_sequence_parallel(py::module_& m) {
  m.def(
      "assign_with_degrees",
      [](DoubleArray costs, DoubleArray fixed, DoubleArray floor, Int64Array tokens,
         Int64Array min_degree, int64_t num_replicas, int64_t max_degree, double comm_per_token,
         double comm_fraction, std::vector<double> comm_scale) {
        const py::ssize_t n = costs.shape(0);
        if (costs.ndim() != 1 || fixed.shape(0) != n || floor.shape(0) != n)
          throw py::value_error("assign_with_degrees: costs, fixed and floor: one per item");
        const int64_t* tok = checked_1d(tokens, "tokens", n);
        const int64_t* dmin = checked_1d(min_degree, "min_degree", n);
        adaptiveload::SequenceParallel sp{max_degree, comm_per_token, comm_fraction,
                                          std::move(comm_scale)};
        adaptiveload::validate_sequence_parallel(sp, num_replicas);
        std::vector<adaptiveload::SpItem> items(n);
        for (py::ssize_t i = 0; i < n; ++i)
          items[i] = {costs.data()[i], fixed.data()[i], floor.data()[i], tok[i], dmin[i], {}};
        const adaptiveload::SpStep st = adaptiveload::assign_with_degrees(items, num_replicas, sp);
        std::vector<int64_t> offsets{0}, order;
        for (const auto& r : st.rank_items) {
          order.insert(order.end(), r.begin(), r.end());
          offsets.push_back(static_cast<int64_t>(order.size()));
        }
        py::dict out;
        out["degree"] = to_numpy(std::vector<int64_t>(st.degree));
        out["first_rank"] = to_numpy(std::vector<int64_t>(st.first_rank));
        out["rank_offsets"] = to_numpy(std::move(offsets));
        out["rank_items"] = to_numpy(std::move(order));
        out["makespan"] = st.makespan;
        out["busy"] = st.busy;
        out["reference"] = st.reference;
        return out;
      },
      py::arg("costs"), py::arg("fixed"), py::arg("floor"), py::arg("tokens"),
      py::arg("min_degree"), py::arg("num_replicas"), py::arg("max_degree"),
      py::arg("comm_per_token") = 0.0, py::arg("comm_fraction") = 0.0,
      py::arg("comm_scale") = std::vector<double>{});
}

// mark_samples: which samples a set of micro-batches holds (resume).
void bind_mark_samples(py::module_& m) {
  m.def(
      "mark_samples",
      [](Int64Array ids, Int64Array offsets, Int64Array samples, UInt8Array padding, int64_t n) {
        checked_1d(offsets, "offsets", -1);
        const int64_t m = offsets.shape(0) - 1;
        if (m < 0 || padding.ndim() != 1 || padding.shape(0) != m)
          throw py::value_error("mark_samples: one padding flag per micro-batch expected");
        const int64_t* id = checked_1d(ids, "ids", -1);
        const int64_t* s = checked_1d(samples, "samples", offsets.data()[m]);
        for (py::ssize_t j = 0; j < ids.shape(0); ++j)
          if (id[j] < 0 || id[j] >= m) throw py::index_error("micro-batch id out of range");
        for (int64_t i = 0; i < offsets.data()[m]; ++i)
          if (s[i] < 0 || s[i] >= n) throw py::index_error("sample index out of range");
        py::array_t<bool> out(static_cast<py::ssize_t>(n));
        std::fill(out.mutable_data(), out.mutable_data() + n, false);
        adaptiveload::mark_samples(id, ids.shape(0), offsets.data(), s, padding.data(),
                                   reinterpret_cast<uint8_t*>(out.mutable_data()));
        return out;
      },
      py::arg("ids"), py::arg("offsets"), py::arg("samples"), py::arg("padding"), py::arg("n"));
}

// StreamTable, next_segment and plan_samples: plans that stream (stream.h). The table borrows
// the arrays (a memory-mapped file stays mapped, not copied) and keeps them alive.
struct BoundStreamTable {
  py::array seq_lens, group_ids;  // group_ids: empty without ids
  std::unique_ptr<adaptiveload::StreamTable> table;
};

// A native int32 or int64 1-D C-contiguous array as it is, or refused with what it is.
py::array integer_column(const py::array& a, const char* name) {
  if (a.ndim() != 1) throw py::value_error(std::string(name) + " must be 1-D");
  if (!py::isinstance<py::array_t<int32_t>>(a) && !py::isinstance<py::array_t<int64_t>>(a))
    throw py::value_error(std::string(name) + " must be int32 or int64 in this machine's byte " +
                          "order, got " + std::string(py::str(a.dtype())));
  if (!(a.flags() & py::array::c_style))
    throw py::value_error(std::string(name) + " must be contiguous");
  return a;
}

// A segment cut by cut_segment, planned once by plan_cut.
struct CutSegment {
  adaptiveload::Segment segment;
  bool planned = false;
};

void bind_stream(py::module_& m) {
  py::class_<BoundStreamTable>(m, "StreamTable")
      .def(py::init([](const py::array& seq_lens, std::optional<py::array> group_ids,
                       const CostModel& cost) {
             auto out = std::make_unique<BoundStreamTable>();
             out->seq_lens = integer_column(seq_lens, "seq_lens");
             const void* ids = nullptr;
             int ids_width = 0;
             if (group_ids) {
               out->group_ids = integer_column(*group_ids, "group_ids");
               if (out->group_ids.shape(0) != seq_lens.shape(0))
                 throw py::value_error("group_ids must have one id per sample");
               ids = out->group_ids.data();
               ids_width = static_cast<int>(out->group_ids.itemsize());
             }
             const void* lens = out->seq_lens.data();
             const int width = static_cast<int>(out->seq_lens.itemsize());
             const int64_t n = seq_lens.shape(0);
             py::gil_scoped_release release;
             out->table =
                 std::make_unique<adaptiveload::StreamTable>(lens, width, n, ids, ids_width, cost);
             return out;
           }),
           py::arg("seq_lens"), py::arg("group_ids"), py::arg("cost_model"))
      .def("__len__", [](const BoundStreamTable& b) { return b.table->size(); })
      .def_property_readonly("num_groups",
                             [](const BoundStreamTable& b) { return b.table->num_groups(); })
      .def_property_readonly("digest", [](const BoundStreamTable& b) { return b.table->digest(); })
      .def(
          "default_max_cost",
          [](const BoundStreamTable& b, int64_t max_tokens, int64_t max_batch_size) {
            return b.table->default_max_cost(max_tokens, max_batch_size);
          },
          py::arg("max_tokens"), py::arg("max_batch_size") = 0)
      .def(
          "oversize",
          [](const BoundStreamTable& b, int64_t max_tokens, double max_cost, int64_t max_degree) {
            if (max_degree < 1) throw py::value_error("max_degree must be >= 1");
            py::gil_scoped_release release;
            return b.table->oversize(max_tokens, max_cost, max_degree);
          },
          py::arg("max_tokens"), py::arg("max_cost"), py::arg("max_degree") = 1);

  m.def(
      "next_segment",
      [](const BoundStreamTable& b, const PlanOptions& o, int64_t begin, int64_t min_samples) {
        adaptiveload::Segment seg;
        {
          py::gil_scoped_release release;
          const adaptiveload::Permutation perm(b.table->size(), o.seed, o.epoch, o.shuffle);
          seg = adaptiveload::next_segment(*b.table, o, perm, begin, min_samples);
        }
        return py::make_tuple(seg.end, to_numpy(std::move(seg.samples)),
                              to_numpy(std::move(seg.skipped)));
      },
      py::arg("table"), py::arg("options"), py::arg("begin"), py::arg("min_samples"));

  // A segment cut and not yet planned, held by Python between cut_segment and plan_cut (the
  // report path cuts on one thread and plans on others, without reading the samples again).
  py::class_<CutSegment>(m, "CutSegment")
      .def_property_readonly("begin", [](const CutSegment& c) { return c.segment.begin; })
      .def_property_readonly("end", [](const CutSegment& c) { return c.segment.end; });

  m.def(
      "cut_segment",
      [](const BoundStreamTable& b, const PlanOptions& o, int64_t begin, int64_t min_samples) {
        auto cut = std::make_unique<CutSegment>();
        {
          py::gil_scoped_release release;
          const adaptiveload::Permutation perm(b.table->size(), o.seed, o.epoch, o.shuffle);
          cut->segment = adaptiveload::next_segment(*b.table, o, perm, begin, min_samples);
        }
        return cut;
      },
      py::arg("table"), py::arg("options"), py::arg("begin"), py::arg("min_samples"));

  m.def(
      "plan_cut",
      [](const BoundStreamTable& b, const PlanOptions& o, CutSegment& cut, uint64_t key) {
        if (cut.planned) throw py::value_error("plan_cut: this segment was planned already");
        cut.planned = true;  // its samples move into the plan
        EpochPlan plan;
        {
          py::gil_scoped_release release;
          plan = adaptiveload::plan_segment(*b.table, o, std::move(cut.segment), key);
        }
        return plan_dict(std::move(plan), o, false);
      },
      py::arg("table"), py::arg("options"), py::arg("segment"), py::arg("key"));

  m.def(
      "plan_segment",
      [](const BoundStreamTable& b, const PlanOptions& o, int64_t begin, int64_t min_samples,
         uint64_t key, std::optional<Int64Array> prefix) {
        EpochPlan plan;
        int64_t end = 0;
        const int64_t* first = prefix ? checked_1d(*prefix, "prefix", -1) : nullptr;
        const int64_t count = prefix ? prefix->shape(0) : 0;
        {
          py::gil_scoped_release release;
          const adaptiveload::Permutation perm(b.table->size(), o.seed, o.epoch, o.shuffle);
          adaptiveload::Segment seg =
              adaptiveload::next_segment(*b.table, o, perm, begin, min_samples, first, count);
          end = seg.end;
          plan = adaptiveload::plan_segment(*b.table, o, std::move(seg), key);
        }
        return py::make_tuple(end, plan_dict(std::move(plan), o, false));
      },
      py::arg("table"), py::arg("options"), py::arg("begin"), py::arg("min_samples"),
      py::arg("key"), py::arg("prefix") = py::none());

  m.def(
      "plan_samples",
      [](const BoundStreamTable& b, const PlanOptions& o, const Int64Array& samples, uint64_t key) {
        const int64_t* p = checked_1d(samples, "samples", -1);
        EpochPlan plan;
        {
          py::gil_scoped_release release;
          plan = adaptiveload::plan_samples(*b.table, o, p, samples.shape(0), key);
        }
        return plan_dict(std::move(plan), o, false);
      },
      py::arg("table"), py::arg("options"), py::arg("samples"), py::arg("key"));
}

}  // namespace

PYBIND11_MODULE(_sampler, m) {
  m.doc() = "AdaptiveLoad sampler core (C++): cost model, epoch planning, rank balancing.";
  bind_cost_model(m);
  bind_memory_model(m);
  bind_sample_table(m);
  bind_planning(m);
  bind_plan_layout(m);
  bind_sequence_parallel(m);
  bind_mark_samples(m);
  bind_stream(m);
}
