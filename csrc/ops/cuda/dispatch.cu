// CUDA dispatch of the norm-modulate ops (LayerNorm and RMSNorm, plain and gated): fills the
// kernel parameters from a validated problem (entry_points.h), describes the problem by its
// tuning-table key, takes the first matching row of the table (tuned_*.cu; cached per key) and
// runs it; registers the CUDA kernels and the private ops that run an explicit row (tests, the
// tuning sweep) and describe the tables.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <atomic>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "../entry_points.h"
#include "../tuning_table.h"
#include "configs.h"
#include "device.cuh"
#include "reduce_partials.cuh"

namespace adaptiveload {
namespace {

// ---- problem keys ----

int kind_of(at::ScalarType st) {
  switch (st) {
    case at::kFloat:
      return kF32;
    case at::kBFloat16:
      return kBF16;
    case at::kHalf:
      return kF16;
    default:
      TORCH_CHECK(false, "layer_norm_modulate: unsupported dtype ", st, " on CUDA");
  }
}

DeviceRowMap to_device(const RowMap& m) { return {m.inner, m.outer_stride, m.inner_stride}; }

constexpr int64_t kMaxFwdVectors = 4096;  // vector path: 8 vectors per thread x 512 threads
constexpr int64_t kMaxBwdVectors = 2048;  // 4 vectors per thread x 512 threads

int arch_of_current_device() {
  const cudaDeviceProp& props = device_props();
  return props.major * 10 + props.minor;
}

bool aligned(const void* p, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0;
}

// Whether every access of the vector path is a whole aligned vector of `vec` elements.
bool vector_ok(int64_t vec, std::initializer_list<const at::Tensor*> streams,
               std::initializer_list<const Operand*> operands) {
  for (const auto* t : streams) {
    if (t != nullptr && t->defined() && t->numel() > 0 &&
        !aligned(t->data_ptr(), vec * t->element_size())) {
      return false;
    }
  }
  for (const auto* o : operands) {
    if (o == nullptr) continue;
    if (!aligned(o->tensor.data_ptr(), vec * o->tensor.element_size()) ||
        o->map.outer_stride % vec != 0 || o->map.inner_stride % vec != 0) {
      return false;
    }
  }
  return true;
}

ModArg mod_arg(const Operand& o) {
  return {o.tensor.data_ptr(), kind_of(o.tensor.scalar_type()), to_device(o.map)};
}

// How many rows every operand stays constant over: 0 if some operand changes from row to row.
int64_t staging_group(std::initializer_list<const Operand*> operands, int64_t rows) {
  int64_t group = rows;
  for (const Operand* o : operands) {
    if (o == nullptr) continue;
    if (o->map.inner_stride != 0) return 0;
    if (o->map.outer_stride != 0) group = std::min(group, o->map.inner);
  }
  for (const Operand* o : operands) {
    if (o == nullptr) continue;
    if (o->map.outer_stride != 0 && o->map.inner % group != 0) return 0;
  }
  return group;
}

struct FwdKey {
  Norm norm;
  int arch, x, op;
  Mod mod;
  bool mod16, vector;
  int64_t D;
  bool operator==(const FwdKey& o) const {
    return norm == o.norm && arch == o.arch && x == o.x && op == o.op && mod == o.mod &&
           mod16 == o.mod16 && vector == o.vector && D == o.D;
  }
  uint64_t hash() const {
    return (static_cast<uint64_t>(D) << 16) ^ (static_cast<uint64_t>(norm) << 15) ^
           (static_cast<uint64_t>(arch) << 6) ^ (static_cast<uint64_t>(x) << 4) ^
           (static_cast<uint64_t>(op) << 3) ^ (static_cast<uint64_t>(mod) << 1) ^
           (static_cast<uint64_t>(mod16) << 14) ^ static_cast<uint64_t>(vector);
  }
};

struct BwdKey {
  Norm norm;
  int arch, x, dy, op, affine;
  bool lean, token, vector;
  int64_t D;
  bool operator==(const BwdKey& o) const {
    return norm == o.norm && arch == o.arch && x == o.x && dy == o.dy && op == o.op &&
           affine == o.affine && lean == o.lean && token == o.token && vector == o.vector &&
           D == o.D;
  }
  uint64_t hash() const {
    return (static_cast<uint64_t>(D) << 16) ^ (static_cast<uint64_t>(norm) << 15) ^
           (static_cast<uint64_t>(arch) << 8) ^ (static_cast<uint64_t>(x) << 6) ^
           (static_cast<uint64_t>(dy) << 4) ^ (static_cast<uint64_t>(op) << 3) ^
           (static_cast<uint64_t>(affine) << 2) ^ (static_cast<uint64_t>(lean) << 1) ^
           (static_cast<uint64_t>(token) << 14) ^ static_cast<uint64_t>(vector);
  }
};

const Table<FwdRow>& fwd_table(int x) {
  return x == kF32 ? kFwdTableF32 : x == kBF16 ? kFwdTableBF16 : kFwdTableF16;
}

const Table<BwdRow>& bwd_table(int x) {
  return x == kF32 ? kBwdTableF32 : x == kBF16 ? kBwdTableBF16 : kBwdTableF16;
}

bool matches(const FwdRow& r, const FwdKey& k) {
  return r.norm == k.norm && k.arch >= r.arch_min && (r.op == kEither || r.op == k.op) &&
         (r.mod == Mod::kAny || r.mod == k.mod) && (!r.kernel.mod16 || k.mod16) &&
         r.vector == k.vector && k.D >= r.d_min && k.D <= r.d_max;
}

bool matches(const BwdRow& r, const BwdKey& k) {
  return r.norm == k.norm && k.arch >= r.arch_min && (r.dy == -1 || r.dy == k.dy) &&
         (r.op == kEither || r.op == k.op) && (r.affine == kEither || r.affine == k.affine) &&
         (!r.lean || k.lean) && (!r.kernel.token || k.token) && r.vector == k.vector &&
         k.D >= r.d_min && k.D <= r.d_max;
}

// The rows that match a key, in table order, looked up once per key and thread.
template <typename Row, typename Key>
const std::vector<const Row*>& candidates(const Table<Row>& table, const Key& key) {
  thread_local std::unordered_map<uint64_t, std::pair<Key, std::vector<const Row*>>> cache;
  const uint64_t h = key.hash();
  auto it = cache.find(h);
  if (it != cache.end() && it->second.first == key) {
    return it->second.second;
  }
  std::vector<const Row*> rows;
  for (int i = 0; i < table.size; ++i)
    if (matches(table.rows[i], key)) rows.push_back(&table.rows[i]);
  auto& slot = cache[h];
  slot = {key, std::move(rows)};
  return slot.second;
}

// The rows run last, by any thread (the private _last_configs op reports them; a backward
// runs on autograd's device thread, not the caller's).
std::atomic<const char*> last_fwd_row{""};
std::atomic<const char*> last_bwd_row{""};

// ---- explicit configurations: "<row id>[;name=value...]" ----

const char* norm_name(Norm n) { return n == Norm::kRms ? "rms" : "layer"; }

template <typename Row>
const Row& find_row(const Table<Row>& table, const std::string& id) {
  for (int i = 0; i < table.size; ++i)
    if (id == table.rows[i].id) return table.rows[i];
  TORCH_CHECK(false, "layer_norm_modulate: no tuning-table row '", id,
              "' for this dtype (adaptiveload.ops._tuning_table() lists them)");
}

// Splits a configuration into its row id and name=value settings.
std::string parse_config(const std::string& config, std::vector<std::pair<std::string, int>>& kv) {
  std::stringstream ss(config);
  std::string id, item;
  std::getline(ss, id, ';');
  while (std::getline(ss, item, ';')) {
    const auto eq = item.find('=');
    TORCH_CHECK(eq != std::string::npos, "layer_norm_modulate: bad setting '", item,
                "' in configuration '", config, "' (name=value expected)");
    kv.emplace_back(item.substr(0, eq), std::stoi(item.substr(eq + 1)));
  }
  return id;
}

FwdSettings override_settings(FwdSettings s, const std::vector<std::pair<std::string, int>>& kv) {
  for (const auto& [name, v] : kv) {
    if (name == "warps") {
      s.warps = v;
    } else if (name == "stages") {
      s.stages = v;
    } else if (name == "y_words") {
      s.y_words = v != 0;
    } else if (name == "interleave") {
      s.interleave = v != 0;
    } else {
      TORCH_CHECK(false, "layer_norm_modulate: unknown forward setting '", name,
                  "' (warps, stages, y_words, interleave)");
    }
  }
  return s;
}

BwdSettings override_settings(BwdSettings s, const std::vector<std::pair<std::string, int>>& kv) {
  for (const auto& [name, v] : kv) {
    if (name == "teams") {
      s.teams = v;
    } else if (name == "stages") {
      s.stages = v;
    } else if (name == "interleave") {
      s.interleave = v != 0;
    } else {
      TORCH_CHECK(false, "layer_norm_modulate backward: unknown setting '", name,
                  "' (teams, stages, interleave)");
    }
  }
  return s;
}

// ---- forward ----

void fwd_cuda(const ForwardProblem& prob, const std::string* config) {
  const at::Tensor& x = *prob.x;
  const c10::cuda::CUDAGuard guard(x.device());
  const bool gated = prob.h != nullptr;
  const int64_t D = x.size(-1);
  FwdParams p{};
  p.x = x.data_ptr();
  p.y = prob.y->data_ptr();
  p.y_kind = kind_of(prob.y->scalar_type());
  p.shift = mod_arg(*prob.shift);
  p.scale = mod_arg(*prob.scale);
  const at::Tensor w = prob.weight->has_value() ? (*prob.weight)->contiguous() : at::Tensor();
  const at::Tensor b = prob.bias->has_value() ? (*prob.bias)->contiguous() : at::Tensor();
  p.weight = w.defined() ? w.data_ptr() : nullptr;
  p.bias = b.defined() ? b.data_ptr() : nullptr;
  p.weight_kind = w.defined() ? kind_of(w.scalar_type()) : kF32;
  p.bias_kind = b.defined() ? kind_of(b.scalar_type()) : kF32;
  p.mean = prob.rms ? nullptr : prob.mean->data_ptr<float>();
  p.rstd = prob.rstd->data_ptr<float>();
  p.rows = x.numel() / D;
  p.D = D;
  p.eps = static_cast<float>(prob.eps);
  if (gated) {
    p.h = prob.h->data_ptr();
    p.r = prob.r->data_ptr();
    p.gate = mod_arg(*prob.gate);
  }
  const int64_t vec = 16 / x.element_size();
  const int64_t nvec = D / vec;
  FwdKey key{};
  key.norm = prob.rms ? Norm::kRms : Norm::kLayer;
  key.arch = arch_of_current_device();
  key.x = kind_of(x.scalar_type());
  key.op = gated ? 1 : 0;
  key.vector =
      D % vec == 0 && nvec <= kMaxFwdVectors &&
      vector_ok(vec, {&x, prob.y, prob.h, prob.r, &w, &b}, {prob.shift, prob.scale, prob.gate});
  const int64_t group = staging_group({prob.shift, prob.scale, prob.gate}, p.rows);
  key.mod = group > 0 ? Mod::kBlock : Mod::kToken;
  // Every modulation operand of x's own 16-bit type: the rows that keep it as raw words.
  key.mod16 = x.element_size() == 2 && p.shift.kind == key.x && p.scale.kind == key.x &&
              (!gated || p.gate.kind == key.x);
  key.D = D;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();

  if (config != nullptr && !config->empty()) {
    std::vector<std::pair<std::string, int>> kv;
    const FwdRow& row = find_row(fwd_table(key.x), parse_config(*config, kv));
    const FwdKernel& k = row.kernel;
    TORCH_CHECK(k.norm == key.norm, "layer_norm_modulate: row '", row.id, "' (", k.name,
                ") is compiled for ", norm_name(k.norm), ", not ", norm_name(key.norm));
    TORCH_CHECK((!k.vector || key.vector) && nvec <= k.max_nvec &&
                    (k.exact_nvec == 0 || nvec == k.exact_nvec) && (!k.needs_group || group > 0) &&
                    (k.op == kEither || k.op == key.op) && (!k.mod16 || key.mod16),
                "layer_norm_modulate: row '", row.id, "' (", k.name, ") cannot run D = ", D,
                gated ? " (gated op)" : "", key.vector ? "" : " without the vector path",
                group > 0 ? "" : " with per-token modulation",
                key.mod16 ? "" : " with modulation of another type than x");
    TORCH_CHECK(k.launch(p, group, override_settings(row.settings, kv), stream), "row '", row.id,
                "': its shared memory does not fit this GPU");
    last_fwd_row = row.id;
    return;
  }
  for (const FwdRow* row : candidates(fwd_table(key.x), key)) {
    if (p.rows < row->rows_min || p.rows > row->rows_max) continue;
    if (row->kernel.launch(p, group, row->settings, stream)) {
      last_fwd_row = row->id;
      return;
    }
  }
  TORCH_CHECK(false, "layer_norm_modulate: no tuning-table row for D = ", D, " (a table bug)");
}

// ---- backward ----

void reduce_partials(const BwdParams& p, GradTarget* const (&targets)[kNumSlots],
                     cudaStream_t stream);

struct GridPlan {
  const BackwardProblem* prob;
  int64_t gmin;
  at::Tensor partials;
};

// Whether block b's partial sums can go straight into row b of every grouped gradient when
// each group of `gmin` rows has one block: each gradient's rows are that group and it is fp32
// (the second stage would add one partial to zero and round: the same value). Sets `grouped`.
bool direct_ok(const BackwardProblem& prob, int64_t gmin, bool& grouped) {
  grouped = false;
  for (const GradTarget* t : prob.targets) {
    if (t->mode != GradMode::kGrouped) continue;
    grouped = true;
    if (t->group != gmin || t->out.scalar_type() != at::kFloat) return false;
  }
  return true;
}

// Chooses the chunking for `target_blocks` blocks, points p at where blocks write their partial
// sums (a shared buffer that reduce_partials sums, allocated here, or the gradients themselves)
// and fills p. Chunks never straddle a group of `gmin` rows (see min_group); a block takes at
// least `tile` rows of a group (its teams' rows at a time when they are interleaved). Groups of
// at most kDirectMaxRows rows get one block each when that spares the second stage.
void plan_chunks(BwdGrid& grid, BwdParams& p, int64_t target_blocks, int64_t tile) {
  auto* g = static_cast<GridPlan*>(grid.ctx);
  const BackwardProblem& prob = *g->prob;
  const int64_t gmin = g->gmin;
  const int64_t groups = p.rows / gmin;
  bool grouped = false;
  const bool can_direct = direct_ok(prob, gmin, grouped);
  int64_t per_group = 1;
  if (!(can_direct && grouped && gmin <= kDirectMaxRows)) {
    per_group = std::max<int64_t>(1, (target_blocks + groups - 1) / groups);
    per_group = std::min(per_group, (gmin + tile - 1) / tile);
  }
  const int64_t chunk = (gmin + per_group - 1) / per_group;
  per_group = (gmin + chunk - 1) / chunk;  // no empty chunks
  const int64_t blocks = groups * per_group;
  TORCH_CHECK(blocks < (int64_t{1} << 31), "layer_norm_modulate backward: too many row groups (",
              groups, ")");
  grid.blocks = blocks;
  p.group = gmin;
  p.per_group = per_group;
  p.chunk_rows = chunk;
  if (can_direct && (!grouped || per_group == 1)) {
    p.partials = nullptr;
    p.part_stride = p.D;
    for (int q = 0; q < kNumSlots; ++q) {
      const GradTarget& t = *prob.targets[q];
      p.part[q] = t.mode == GradMode::kGrouped ? t.out.data_ptr<float>() : nullptr;
    }
    return;
  }
  g->partials = at::empty({blocks * p.num_slots * p.D}, prob.x->options().dtype(at::kFloat));
  p.partials = g->partials.data_ptr<float>();
  p.part_stride = p.num_slots * p.D;
  for (int q = 0; q < kNumSlots; ++q) {
    p.part[q] =
        prob.targets[q]->mode == GradMode::kGrouped ? p.partials + p.grad[q].slot * p.D : nullptr;
  }
}

void bwd_cuda(const BackwardProblem& prob, const std::string* config) {
  const at::Tensor& x = *prob.x;
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t D = x.size(-1);
  const bool gated = prob.h != nullptr;
  // The vector kernels read dy as x's own 16-bit type, as bf16 under fp32 x, or as fp32; any
  // other 16-bit dy is widened to fp32 first (exact).
  const auto dst = prob.dy->scalar_type(), xst = x.scalar_type();
  const bool dy_ok = dst == xst || dst == at::kFloat || (xst == at::kFloat && dst == at::kBFloat16);
  const at::Tensor dyv = dy_ok ? *prob.dy : prob.dy->to(at::kFloat);
  BwdParams p{};
  p.dy = dyv.data_ptr();
  p.dy_kind = kind_of(dyv.scalar_type());
  p.x = x.data_ptr();
  p.dx = prob.dx->numel() > 0 ? prob.dx->data_ptr() : nullptr;
  p.scale = mod_arg(*prob.scale);
  const at::Tensor w = prob.weight->has_value() ? (*prob.weight)->contiguous() : at::Tensor();
  const at::Tensor b = prob.bias->has_value() ? (*prob.bias)->contiguous() : at::Tensor();
  p.weight = w.defined() ? w.data_ptr() : nullptr;
  p.bias = b.defined() ? b.data_ptr() : nullptr;
  p.weight_kind = w.defined() ? kind_of(w.scalar_type()) : kF32;
  p.bias_kind = b.defined() ? kind_of(b.scalar_type()) : kF32;
  p.mean = prob.rms ? nullptr : prob.mean->data_ptr<float>();
  p.rstd = prob.rstd->data_ptr<float>();
  p.rows = x.numel() / D;
  p.D = D;
  if (gated) {
    p.h = prob.h->data_ptr();
    p.dr = prob.dr->defined() ? prob.dr->data_ptr() : nullptr;
    p.dh = prob.dh->numel() > 0 ? prob.dh->data_ptr() : nullptr;
    p.gate = mod_arg(*prob.gate);
  }
  const at::Tensor* bufs[kNumSlots];
  for (int q = 0; q < kNumSlots; ++q) {
    const GradTarget& t = *prob.targets[q];
    p.grad[q].mode = static_cast<int>(t.mode);
    if (t.mode == GradMode::kGrouped) p.grad[q].slot = p.num_slots++;
    if (t.mode == GradMode::kElementwise) {
      p.grad[q].buf = t.buf.data_ptr();
      p.grad[q].kind = kind_of(t.buf.scalar_type());
    }
    bufs[q] = t.mode == GradMode::kElementwise ? &t.buf : nullptr;
  }
  const bool affine = w.defined() || b.defined();
  const int64_t vec = 16 / x.element_size();
  const int64_t nvec = D / vec;
  BwdKey key{};
  key.norm = prob.rms ? Norm::kRms : Norm::kLayer;
  key.arch = arch_of_current_device();
  key.x = kind_of(xst);
  key.dy = p.dy_kind;
  key.op = gated ? 1 : 0;
  key.affine = affine ? 1 : 0;
  key.D = D;
  key.vector = D % vec == 0 && nvec <= kMaxBwdVectors &&
               vector_ok(vec,
                         {&x, &dyv, prob.dx, &w, &b, prob.h, gated ? prob.dr : nullptr, prob.dh,
                          bufs[0], bufs[1], bufs[2], bufs[3], bufs[4]},
                         {prob.scale, prob.gate});
  // Rows per chunk group: every grouped gradient's groups are whole numbers of them, and for
  // the lean kernel so are the stretches of rows that share one scale row.
  const Operand& scale = *prob.scale;
  int64_t gmin = min_group(
      {prob.targets[0], prob.targets[1], prob.targets[2], prob.targets[3], prob.targets[4]},
      p.rows);
  const int64_t gmin_general = gmin;
  bool lean = key.vector && !gated && !affine && scale.map.inner_stride == 0 &&
              prob.targets[kTargetShift]->mode != GradMode::kElementwise &&
              prob.targets[kTargetScale]->mode != GradMode::kElementwise;
  int64_t gmin_lean = gmin;
  if (lean && scale.map.outer_stride != 0) {
    const int64_t per_scale = scale.map.inner;
    const int64_t lo = std::min(gmin, per_scale), hi = std::max(gmin, per_scale);
    lean = hi % lo == 0 && p.rows % lo == 0;
    if (lean) gmin_lean = lo;
  }
  key.lean = lean;
  // The token case: no gradient summed over rows, and not the lean kernel's (per-token scale).
  key.token = key.vector && !lean && !gated && !affine &&
              prob.targets[kTargetShift]->mode != GradMode::kGrouped &&
              prob.targets[kTargetScale]->mode != GradMode::kGrouped;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  GridPlan plan{&prob, gmin, at::Tensor()};
  BwdGrid grid{&plan, &plan_chunks, 0};
  auto run = [&](const BwdRow& row, const BwdSettings& s) {
    plan.gmin = row.kernel.lean ? gmin_lean : gmin_general;
    return row.kernel.launch(p, s, grid, stream);
  };

  bool launched = false;
  if (config != nullptr && !config->empty()) {
    std::vector<std::pair<std::string, int>> kv;
    const BwdRow& row = find_row(bwd_table(key.x), parse_config(*config, kv));
    const BwdKernel& k = row.kernel;
    TORCH_CHECK(k.norm == key.norm, "layer_norm_modulate backward: row '", row.id, "' (", k.name,
                ") is compiled for ", norm_name(k.norm), ", not ", norm_name(key.norm));
    TORCH_CHECK(
        (!k.vector || key.vector) && nvec <= k.max_nvec && (!k.lean || key.lean) &&
            (!k.token || key.token) && (k.fused == kEither || k.fused == key.op) &&
            (k.affine == kEither || k.affine == key.affine) && (row.dy == -1 || row.dy == key.dy),
        "layer_norm_modulate backward: row '", row.id, "' (", k.name,
        ") cannot run this problem (D = ", D, gated ? ", gated op" : "", affine ? ", affine" : "",
        key.lean ? "" : ", not the lean case", key.token ? "" : ", not the token case", ")");
    TORCH_CHECK(run(row, override_settings(row.settings, kv)), "row '", row.id,
                "': its shared memory does not fit this GPU");
    last_bwd_row = row.id;
    launched = true;
  } else {
    for (const BwdRow* row : candidates(bwd_table(key.x), key)) {
      if (run(*row, row->settings)) {
        last_bwd_row = row->id;
        launched = true;
        break;
      }
    }
    if (!launched) {  // a vector row that did not fit: the table's loop row
      BwdKey any = key;
      any.vector = false;
      any.lean = false;
      any.token = false;
      for (const BwdRow* row : candidates(bwd_table(key.x), any)) {
        if (run(*row, row->settings)) {
          last_bwd_row = row->id;
          launched = true;
          break;
        }
      }
    }
  }
  TORCH_CHECK(launched, "layer_norm_modulate backward: no tuning-table row for D = ", D);
  if (p.partials != nullptr) reduce_partials(p, prob.targets, stream);
}

void reduce_partials(const BwdParams& p, GradTarget* const (&targets)[kNumSlots],
                     cudaStream_t stream) {
  ReduceParams r{};
  r.partials = p.partials;
  r.num_slots = p.num_slots;
  r.D = p.D;
  for (int q = 0; q < kNumSlots; ++q) {
    const GradTarget& t = *targets[q];
    if (t.mode != GradMode::kGrouped) continue;
    const int o = r.num_outputs++;
    r.slot[o] = p.grad[q].slot;
    r.out[o] = t.out.data_ptr();
    r.kind[o] = kind_of(t.out.scalar_type());
    r.blocks_per_out[o] = (t.group / p.group) * p.per_group;
    r.out_rows[o] = p.rows / t.group;
  }
  if (r.num_outputs == 0) return;
  int64_t total = 0;
  for (int o = 0; o < r.num_outputs; ++o) total += r.out_rows[o];
  const dim3 grid((p.D + 31) / 32, std::min<int64_t>(total, 65535));
  reduce_partials_kernel<<<grid, dim3(32, 32), 0, stream>>>(r);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// ---- private ops: explicit configurations and the tables ----

Fwd4 forward_with_config(const at::Tensor& x, const std::optional<at::Tensor>& h,
                         const std::optional<at::Tensor>& gate, const at::Tensor& shift,
                         const at::Tensor& scale, const std::optional<at::Tensor>& weight,
                         const std::optional<at::Tensor>& bias, double eps,
                         std::optional<at::ScalarType> out_dtype, c10::string_view config) {
  const std::string c(config);
  auto out = forward_entry(&fwd_cuda, "_layer_norm_modulate_with_config", false, x, h, gate, shift,
                           scale, weight, bias, eps, out_dtype, &c);
  if (!std::get<0>(out).defined()) std::get<0>(out) = at::empty({0}, x.options());  // plain op
  return out;
}

Bwd7 backward_with_config(const std::optional<at::Tensor>& dr, const at::Tensor& dy,
                          const at::Tensor& x, const std::optional<at::Tensor>& h,
                          const std::optional<at::Tensor>& gate, const at::Tensor& shift,
                          const at::Tensor& scale, const std::optional<at::Tensor>& weight,
                          const std::optional<at::Tensor>& bias, const at::Tensor& mean,
                          const at::Tensor& rstd, std::array<bool, 7> mask,
                          c10::string_view config) {
  const std::string c(config);
  auto g = backward_entry(&bwd_cuda, "_layer_norm_modulate_backward_with_config", false, dr, dy, x,
                          h, gate, shift, scale, weight, bias, mean, rstd, mask, &c);
  for (at::Tensor* t : {&std::get<1>(g), &std::get<2>(g)})  // the plain op's dh and dgate
    if (!t->defined()) *t = at::empty({0}, x.options());
  return g;
}

Fwd3 rms_forward_with_config(const at::Tensor& x, const std::optional<at::Tensor>& h,
                             const std::optional<at::Tensor>& gate, const at::Tensor& shift,
                             const at::Tensor& scale, const std::optional<at::Tensor>& weight,
                             double eps, std::optional<at::ScalarType> out_dtype,
                             c10::string_view config) {
  const std::string c(config);
  auto [r, y, mean, rstd] =
      forward_entry(&fwd_cuda, "_rms_norm_modulate_with_config", true, x, h, gate, shift, scale,
                    weight, std::nullopt, eps, out_dtype, &c);
  if (!r.defined()) r = at::empty({0}, x.options());  // plain op
  return {r, y, rstd};
}

Bwd6 rms_backward_with_config(const std::optional<at::Tensor>& dr, const at::Tensor& dy,
                              const at::Tensor& x, const std::optional<at::Tensor>& h,
                              const std::optional<at::Tensor>& gate, const at::Tensor& shift,
                              const at::Tensor& scale, const std::optional<at::Tensor>& weight,
                              const at::Tensor& rstd, std::array<bool, 6> mask,
                              c10::string_view config) {
  const std::string c(config);
  const std::array<bool, 7> m7{mask[0], mask[1], mask[2], mask[3], mask[4], mask[5], false};
  auto g = backward_entry(&bwd_cuda, "_rms_norm_modulate_backward_with_config", true, dr, dy, x, h,
                          gate, shift, scale, weight, std::nullopt, at::Tensor(), rstd, m7, &c);
  for (at::Tensor* t : {&std::get<1>(g), &std::get<2>(g)})  // the plain op's dh and dgate
    if (!t->defined()) *t = at::empty({0}, x.options());
  return {std::get<0>(g), std::get<1>(g), std::get<2>(g),
          std::get<3>(g), std::get<4>(g), std::get<5>(g)};
}

const char* op_name(int op) { return op == kEither ? "any" : op == 1 ? "gated" : "plain"; }
const char* mod_name(Mod m) {
  return m == Mod::kBlock ? "block" : m == Mod::kToken ? "token" : "any";
}
int64_t limit_of(int64_t v) { return v == kNoLimit ? -1 : v; }

}  // namespace

// Every row of every table as named fields (-1 for "no limit" or "either").
std::vector<TableRow> tuning_table_rows() {
  std::vector<TableRow> rows;
  const char* dtypes[3] = {"f32", "bf16", "f16"};
  auto text = [](const char* name, const char* v) { return TableField{name, 0, v}; };
  auto num = [](const char* name, int64_t v) { return TableField{name, v, nullptr}; };
  for (int x = 0; x < 3; ++x) {
    const Table<FwdRow>& ft = fwd_table(x);
    for (int i = 0; i < ft.size; ++i) {
      const FwdRow& r = ft.rows[i];
      rows.push_back({text("id", r.id),
                      text("direction", "forward"),
                      text("x", dtypes[x]),
                      text("norm", norm_name(r.norm)),
                      num("arch_min", r.arch_min),
                      text("op", op_name(r.op)),
                      text("mod", mod_name(r.mod)),
                      num("mod16", r.kernel.mod16),
                      num("vector", r.vector),
                      num("d_min", r.d_min),
                      num("d_max", limit_of(r.d_max)),
                      num("rows_min", r.rows_min),
                      num("rows_max", limit_of(r.rows_max)),
                      text("kernel", r.kernel.name),
                      num("max_nvec", limit_of(r.kernel.max_nvec)),
                      num("exact_nvec", r.kernel.exact_nvec),
                      num("warps", r.settings.warps),
                      num("stages", r.settings.stages),
                      num("y_words", r.settings.y_words),
                      num("interleave", r.settings.interleave)});
    }
    const Table<BwdRow>& bt = bwd_table(x);
    for (int i = 0; i < bt.size; ++i) {
      const BwdRow& r = bt.rows[i];
      rows.push_back({text("id", r.id), text("direction", "backward"), text("x", dtypes[x]),
                      text("norm", norm_name(r.norm)), num("arch_min", r.arch_min),
                      text("dy", r.dy == -1 ? "any" : dtypes[r.dy]), text("op", op_name(r.op)),
                      num("affine", r.affine), num("lean", r.lean), num("token", r.kernel.token),
                      num("vector", r.vector), num("d_min", r.d_min),
                      num("d_max", limit_of(r.d_max)), text("kernel", r.kernel.name),
                      num("max_nvec", limit_of(r.kernel.max_nvec)), num("teams", r.settings.teams),
                      num("stages", r.settings.stages), num("interleave", r.settings.interleave)});
    }
  }
  return rows;
}

namespace {

std::string last_configs() { return std::string(last_fwd_row.load()) + " " + last_bwd_row.load(); }

}  // namespace

TORCH_LIBRARY_FRAGMENT(adaptiveload, m) {
  // Private, CUDA only: run one tuning-table row (id[;name=value...] with settings overridden)
  // instead of the table's choice; the plain op when h is None. Tests and the tuning sweep.
  m.def(
      "_layer_norm_modulate_with_config(Tensor x, Tensor? h, Tensor? gate, Tensor shift, "
      "Tensor scale, Tensor? weight, Tensor? bias, float eps, ScalarType? out_dtype, str config) "
      "-> (Tensor r, Tensor y, Tensor mean, Tensor rstd)");
  m.def(
      "_layer_norm_modulate_backward_with_config(Tensor? dr, Tensor dy, Tensor x, Tensor? h, "
      "Tensor? gate, Tensor shift, Tensor scale, Tensor? weight, Tensor? bias, Tensor mean, "
      "Tensor rstd, bool[7] output_mask, str config) -> (Tensor dx, Tensor dh, Tensor dgate, "
      "Tensor dshift, Tensor dscale, Tensor dweight, Tensor dbias)");
  // The same for the RMSNorm ops (an RMSNorm row, "<dtype>.rms." ids).
  m.def(
      "_rms_norm_modulate_with_config(Tensor x, Tensor? h, Tensor? gate, Tensor shift, "
      "Tensor scale, Tensor? weight, float eps, ScalarType? out_dtype, str config) "
      "-> (Tensor r, Tensor y, Tensor rstd)");
  m.def(
      "_rms_norm_modulate_backward_with_config(Tensor? dr, Tensor dy, Tensor x, Tensor? h, "
      "Tensor? gate, Tensor shift, Tensor scale, Tensor? weight, Tensor rstd, "
      "bool[6] output_mask, str config) -> (Tensor dx, Tensor dh, Tensor dgate, "
      "Tensor dshift, Tensor dscale, Tensor dweight)");
  // The rows this thread ran last (the tables themselves: adaptiveload._C._tuning_table).
  m.def("_last_configs() -> str", &last_configs);
}

TORCH_LIBRARY_IMPL(adaptiveload, CUDA, m) {
  // Every op of kVariants (variants.h) and its backward.
  register_kernels<fwd_cuda, bwd_cuda>(m);
  m.impl("_layer_norm_modulate_with_config", &forward_with_config);
  m.impl("_layer_norm_modulate_backward_with_config", &backward_with_config);
  m.impl("_rms_norm_modulate_with_config", &rms_forward_with_config);
  m.impl("_rms_norm_modulate_backward_with_config", &rms_backward_with_config);
}

}  // namespace adaptiveload
