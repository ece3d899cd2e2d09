// Kernel configurations and the rows of the tuning tables (host side).
//
// A row maps a problem to the configuration that runs it:
//   (compute capability, dtypes, norm kind, D range, modulation kind, plain or gated op,
//    row count range) -> (kernel instantiation, its run-time settings)
// LayerNorm and RMSNorm problems share the tables and the kernel templates: an RMSNorm row names
// a kernel compiled for Norm::kRms (params.cuh).
// The tables are tuned_fwd_<dtype>.cu and tuned_bwd_<dtype>.cu, one line per row; each row's
// kernel is instantiated there and nowhere else, so a kernel is compiled only if a row selects
// it. Dispatch (dispatch.cu) takes the first row that matches, cached per problem key; no
// environment variable is read. Tests and benchmarks/tune_layer_norm_modulate.py run an
// explicit row, with settings overridden, through the private *_with_config ops (an empty
// configuration there: the table's choice).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <limits>

#include "params.cuh"

namespace adaptiveload {

constexpr int64_t kNoLimit = std::numeric_limits<int64_t>::max();

// Which rows a modulation operand pattern may take.
enum class Mod : int {
  kAny = 0,
  kBlock = 1,  // every modulation operand constant over runs of rows (shared, per sample)
  kToken = 2,  // some operand changes from row to row (per token)
};

// The op a forward row serves: -1 either, 0 the plain op, 1 the gated-residual op.
constexpr int kEither = -1;

// ---- forward ----

// Run-time settings of a forward configuration (ignored by kernels that have none).
struct FwdSettings {
  int warps = 8;           // warps per block (warp and ring kernels)
  int stages = 2;          // ring slots per warp (ring kernel)
  bool y_words = false;    // 16-bit y stored as 4-byte words instead of 16-byte vectors
  bool interleave = true;  // rows dealt to blocks in interleaved tiles (see RowChunks)
};

// Launches the kernel for `p`; false (nothing launched) when this GPU cannot hold its shared
// memory. group: rows over which every modulation operand is constant (0: none).
using FwdLaunch = bool (*)(const FwdParams& p, int64_t group, const FwdSettings& s,
                           cudaStream_t stream);

struct FwdKernel {
  const char* name;  // e.g. "warp<bf16,6,2,1>"
  FwdLaunch launch;
  int64_t max_nvec;    // longest row it handles, in 16-byte vectors
  int64_t exact_nvec;  // rows of exactly this many vectors only (0: any up to max_nvec)
  bool vector;         // needs the vector path (D a multiple of the vector, aligned pointers)
  bool needs_group;    // needs modulation constant over runs of rows
  int op;              // kEither, or the one op it is compiled for
  int warps_per_row;   // warp kernels: warps per block must be a multiple (1 otherwise)
  Norm norm;           // the norm it is compiled for
  bool mod16 = false;  // needs every modulation operand of x's own 16-bit type
};

struct FwdRow {
  const char* id;
  int arch_min;  // compute capability x 10 (90: sm_90 and newer), 0: any
  Norm norm;     // must be the kernel's
  int op;        // kEither, 0 plain, 1 gated
  Mod mod;
  bool vector;  // the problem takes the vector path (see dispatch.cu: fwd_problem)
  int64_t d_min, d_max;
  int64_t rows_min, rows_max;
  FwdKernel kernel;
  FwdSettings settings;
};

// ---- backward ----

struct BwdSettings {
  int teams = 0;           // rows in progress per block; 0: the kernel's rule (launch.cuh)
  int stages = 0;          // ring slots per team (1-3); 0: the rule
  bool interleave = true;  // rows dealt to blocks in interleaved tiles
};

// Backward: groups of at most this many rows (rows sharing one row of every grouped gradient)
// get one block each, which writes its sums straight into the fp32 gradients, so that small
// problems, whose time is the host's, launch one kernel instead of two.
constexpr int64_t kDirectMaxRows = 16;

// How a backward launch sizes its grid and gets its fp32 partial buffer: plan(grid, p, target
// blocks, rows per tile) chooses the chunking, allocates the partials, fills p and sets
// grid.blocks (dispatch.cu).
struct BwdGrid {
  void* ctx;
  void (*plan)(struct BwdGrid& grid, BwdParams& p, int64_t target_blocks, int64_t tile);
  int64_t blocks = 0;
};

using BwdLaunch = bool (*)(BwdParams& p, const BwdSettings& s, BwdGrid& grid, cudaStream_t stream);

struct BwdKernel {
  const char* name;
  BwdLaunch launch;
  int64_t max_nvec;
  bool vector;
  bool lean;   // needs the lean kernel's case (see dispatch.cu: bwd_problem)
  int fused;   // kEither, 0, 1
  int affine;  // kEither, 0, 1
  Norm norm;
  bool token = false;  // needs the token case: no gradient summed over rows (dispatch.cu)
};

struct BwdRow {
  const char* id;
  int arch_min;
  Norm norm;   // must be the kernel's
  int dy;      // dy's kind as the kernel reads it: x's own 16-bit kind (bf16 under fp32
               // x), or kF32; -1 either
  int op;      // kEither, 0 plain, 1 gated
  int affine;  // kEither, 0 without weight and bias, 1 with
  bool lean;   // the problem is the lean kernel's case
  bool vector;
  int64_t d_min, d_max;
  BwdKernel kernel;
  BwdSettings settings;
};

template <typename Row>
struct Table {
  const Row* rows;
  int size;
};

// Whether every row's norm column is its kernel's (each table asserts it at compile time).
template <typename Row, int N>
constexpr bool norms_agree(const Row (&rows)[N]) {
  for (int i = 0; i < N; ++i)
    if (rows[i].norm != rows[i].kernel.norm) return false;
  return true;
}

// Rows that LayerNorm and RMSNorm share. A table lists them once, as
//
//   #define SHARED_ROWS(ROW) ROW(id, arch, (columns between norm and kernel), kernel template,
//       (its arguments before the norm), (those after it, each with its comma), "kernel name
//       without its closing >", {settings})
//   constexpr FwdRow kRows[] = {SHARED_ROWS(LAYER_NORM_ROW) SHARED_ROWS(RMS_NORM_ROW)};
//
// and each line becomes two rows: the LayerNorm one, then (after every LayerNorm row) the
// RMSNorm one, whose id gains "rms." after the table's prefix (TABLE_ID, a string the table
// defines), whose kernel name gains ",rms", and whose kernel is compiled for Norm::kRms. A row
// tuned for one norm alone is written out whole, with its Norm, before or after those.
#define ADAPTIVELOAD_UNPACK(...) __VA_ARGS__
#define ADAPTIVELOAD_ROW(norm, rms_id, rms_name, id, arch, columns, kernel, before, after, name, \
                         ...)                                                                    \
  {TABLE_ID rms_id id,                                                                           \
   arch,                                                                                         \
   norm,                                                                                         \
   ADAPTIVELOAD_UNPACK columns,                                                                  \
   kernel<ADAPTIVELOAD_UNPACK before, norm ADAPTIVELOAD_UNPACK after>(name rms_name ">"),        \
   __VA_ARGS__},
#define LAYER_NORM_ROW(...) ADAPTIVELOAD_ROW(Norm::kLayer, "", "", __VA_ARGS__)
#define RMS_NORM_ROW(...) ADAPTIVELOAD_ROW(Norm::kRms, "rms.", ",rms", __VA_ARGS__)

// The tables, by x dtype (tuned_*.cu).
extern const Table<FwdRow> kFwdTableF32, kFwdTableBF16, kFwdTableF16;
extern const Table<BwdRow> kBwdTableF32, kBwdTableBF16, kBwdTableF16;

}  // namespace adaptiveload
