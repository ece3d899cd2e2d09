// Kernel parameter blocks (passed by value) and how rows are dealt to blocks: shared by the
// kernels (*_kernels.cuh) and the host code that fills them (launch.cuh, dispatch.cu).
#pragma once

#include "vec.cuh"

namespace adaptiveload {

// The normalization a kernel is compiled for. RMSNorm divides by the root mean square: it
// computes no mean (nor reads or writes one) and its backward has no mean(g) term.
enum class Norm : int { kLayer = 0, kRms = 1 };

struct FwdParams {
  const void* x;  // T: x, or residual for the fused op
  const void* h;  // T, fused only
  void* r;        // T, fused only
  void* y;
  int y_kind;
  // 16-bit y stored as 4-byte words (four stores per 16-byte vector) instead of one 16-byte
  // store per vector: the tuning-table row's y_words setting.
  bool y_words;
  ModArg shift, scale, gate;
  const void* weight;  // may be null
  const void* bias;    // may be null
  int weight_kind, bias_kind;
  float* mean;  // null for RMSNorm
  float* rstd;
  int64_t rows, D;
  float eps;
};

// Rows of one block for the warp kernel, all inside one stretch of `group` rows over which
// every modulation operand is constant (so it can be staged once per block). In order 0 a block
// owns a contiguous chunk of rows; in order 1 (interleaved) the group's blocks take turns in
// tiles of one row per warp, so that at any moment the whole GPU works on one narrow window of
// memory, as a copy does, instead of on as many scattered streams as there are warps.
struct RowChunks {
  int64_t group;      // rows per group
  int64_t per_group;  // blocks per group
  int64_t chunk_rows;
  bool interleave;
};

// Rows `slot` of `nslots` (a warp, or a team) of this block visits: start, start + step, ...
// while < end. start >= end when it has none; block_start >= end when the block has none.
struct RowRange {
  int64_t start, step, end, block_start;
};

__device__ __forceinline__ RowRange block_rows(int64_t group, int64_t per_group, int64_t chunk_rows,
                                               bool interleave, int64_t rows, int slot,
                                               int nslots) {
  const int64_t g = blockIdx.x / per_group, b = blockIdx.x % per_group;
  const int64_t group_end = min((g + 1) * group, rows);
  RowRange r;
  if (interleave) {
    r.block_start = g * group + b * nslots;
    r.step = per_group * nslots;
    r.end = group_end;
  } else {
    r.block_start = min(g * group + b * chunk_rows, group_end);
    r.step = nslots;
    r.end = min(r.block_start + chunk_rows, group_end);
  }
  r.start = r.block_start + slot;
  return r;
}

// Gradient slots, in partial-buffer order.
enum Slot : int { kShift = 0, kScale = 1, kGate = 2, kWeight = 3, kBias = 4, kNumSlots = 5 };

struct GradArg {
  int mode = 0;         // GradMode
  int slot = -1;        // kGrouped: its slot in a block's partials (the shared buffer's layout)
  void* buf = nullptr;  // kElementwise: per-element output
  int kind = kF32;
};

struct BwdParams {
  const void* dy;
  int dy_kind;
  const void* x;   // T: x, or r for the fused op
  const void* dr;  // T, fused only, may be null
  const void* h;   // T, fused only
  void* dx;        // T: dx, or dresidual for the fused op; may be null
  void* dh;        // T, fused only, may be null
  ModArg scale, gate;
  const void* weight;
  const void* bias;
  int weight_kind, bias_kind;
  const float* mean;  // null for RMSNorm
  const float* rstd;
  GradArg grad[kNumSlots];
  // kGrouped gradient q: block b's D partial sums at part[q] + b * part_stride. Either rows of
  // one fp32 buffer [gridDim.x][num_slots][D] that reduce_partials sums (part_stride =
  // num_slots * D), or, when every block is the only one of its output row and the gradient is
  // fp32, the gradient itself (part_stride = D; no second stage).
  float* part[kNumSlots];
  int64_t part_stride;
  float* partials;  // the shared buffer, or null when the kernel writes the gradients
  int num_slots;
  int64_t rows, D;
  int64_t group;      // rows per chunk group; chunks never straddle a group
  int64_t per_group;  // chunks (= blocks) per group
  int64_t chunk_rows;
  bool stage;  // dynamic shared memory holds (1 + scale) [and weight] for the chunk
  // Vector kernels only: threads per team (one row each), ring depth, and where the ring starts
  // in dynamic shared memory (dy's element size is the kernels' DYK).
  int team_threads;
  int stages;
  int64_t ring_offset;
  bool interleave;  // vector kernels: rows dealt in interleaved tiles (see RowChunks)
};

__device__ __forceinline__ void chunk_range(const BwdParams& p, int64_t& first, int64_t& last) {
  const int64_t g = blockIdx.x / p.per_group;
  const int64_t group_end = (g + 1) * p.group;
  first = min(g * p.group + (blockIdx.x % p.per_group) * p.chunk_rows, group_end);
  last = min(first + p.chunk_rows, group_end);
}

// Index of float4 quad q of vector c in a row of nvec vectors staged in shared memory, in the
// order [vector][quad] (QUADS false) or [quad][vector] (QUADS true; see stage_modulation).
template <int VEC, bool QUADS>
__device__ __forceinline__ int quad_index(int nvec, int c, int q) {
  return QUADS ? q * nvec + c : c * (VEC / 4) + q;
}

// Bytes of one ring slot (an x row and a dy row), rounded up to 16 so that every slot, and the
// x row at its start, is 16-byte aligned (fp32 x with bf16 dy and D % 8 == 4 would not be).
__host__ __device__ constexpr int64_t ring_slot_bytes(int64_t D, int64_t x_bytes,
                                                      int64_t dy_bytes) {
  return (D * (x_bytes + dy_bytes) + 15) / 16 * 16;
}

struct ReduceParams {
  const float* partials;
  int num_slots;
  int64_t D;
  int num_outputs;      // grouped gradients
  int slot[kNumSlots];  // their partial slots
  void* out[kNumSlots];
  int kind[kNumSlots];
  int64_t blocks_per_out[kNumSlots];  // partial blocks summed into one output row
  int64_t out_rows[kNumSlots];
};

}  // namespace adaptiveload
