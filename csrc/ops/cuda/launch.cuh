// Launchers: host code that sizes and launches one kernel instantiation with a row's settings.
// A table row (tuned_*.cu) points at one of these, instantiated for its kernel. GPU queries
// (function attributes, occupancy, the shared-memory opt-in) are made once per kernel, device
// and launch shape, then cached.
#pragma once

#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <tuple>
#include <unordered_map>

#include "bwd_kernels.cuh"
#include "configs.h"
#include "device.cuh"
#include "fwd_kernels.cuh"

namespace adaptiveload {
namespace {

struct LaunchKey {
  const void* kernel;
  int device, threads, smem;
  bool operator==(const LaunchKey& o) const {
    return kernel == o.kernel && device == o.device && threads == o.threads && smem == o.smem;
  }
};

struct LaunchKeyHash {
  size_t operator()(const LaunchKey& k) const {
    return std::hash<const void*>()(k.kernel) ^ (static_cast<size_t>(k.device) << 48) ^
           (static_cast<size_t>(k.threads) << 32) ^ static_cast<size_t>(k.smem);
  }
};

// cudaFuncGetAttributes of `kernel` on the current device, queried once.
inline const cudaFuncAttributes& attributes_of(const void* kernel) {
  static std::mutex mu;
  static std::unordered_map<LaunchKey, cudaFuncAttributes, LaunchKeyHash> cache;
  const LaunchKey key{kernel, current_device(), 0, 0};
  const std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it == cache.end()) {
    cudaFuncAttributes attr{};
    C10_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
    it = cache.emplace(key, attr).first;
  }
  return it->second;
}

// Grid for a kernel sized by occupancy: allows it `smem` bytes of dynamic shared memory (above
// the default 48 KB when needed) and returns how many blocks of `threads` an SM then holds times
// the SM count (at least one block per SM). Computed once per kernel, device and shape. The
// allowance only ever grows (it is the kernel's, not the launch's): lowering it for a smaller
// launch made a later, larger, cached one fail with "invalid argument".
// Note: the 48 KB default bounds static plus dynamic shared memory: the fp32-stream backward at
// D = 3072 asks for exactly 48 KB of dynamic memory beside its static 512 bytes, and failed to
// launch ("invalid argument") while the opt-in was keyed on the dynamic bytes alone.
inline int64_t resident_grid(const void* kernel, int threads, int smem) {
  static std::mutex mu;
  static std::unordered_map<LaunchKey, int64_t, LaunchKeyHash> cache;
  static std::unordered_map<LaunchKey, int, LaunchKeyHash> allowed;  // per kernel and device
  const LaunchKey key{kernel, current_device(), threads, smem};
  const std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  const cudaFuncAttributes& attr = attributes_of(kernel);
  int& allow = allowed[LaunchKey{kernel, key.device, 0, 0}];
  if (smem + static_cast<int64_t>(attr.sharedSizeBytes) > 48 * 1024 && smem > allow) {
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    allow = smem;
  }
  int per_sm = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  const int64_t blocks =
      static_cast<int64_t>(std::max(per_sm, 1)) * device_props().multiProcessorCount;
  cache.emplace(key, blocks);
  return blocks;
}

template <typename Kernel>
const void* as_ptr(Kernel kernel) {
  return reinterpret_cast<const void*>(kernel);
}

int64_t grid_for_rows(int64_t rows) { return std::min<int64_t>(rows, int64_t{1} << 30); }

int64_t threads_for(int64_t nvec, int vpt) {
  return std::max<int64_t>(32, ((nvec + vpt - 1) / vpt + 31) / 32 * 32);
}

// ---- forward ----

// How the rows of the warp and ring kernels are dealt to blocks of `teams` row slots: at least
// one row per slot and block, and enough blocks to fill the GPU once (`target` resident blocks).
// group: rows over which every modulation operand is constant (> 0).
RowChunks fwd_row_chunks(int64_t rows, int64_t group, int64_t target, int64_t teams,
                         bool interleave, int64_t& blocks) {
  RowChunks c{};
  c.group = group;
  c.interleave = interleave;
  const int64_t groups = (rows + c.group - 1) / c.group;
  c.per_group =
      std::max<int64_t>(1, std::min((target + groups - 1) / groups, (c.group + teams - 1) / teams));
  c.chunk_rows = (c.group + c.per_group - 1) / c.per_group;
  if (!c.interleave) c.per_group = (c.group + c.chunk_rows - 1) / c.chunk_rows;
  blocks = groups * c.per_group;
  TORCH_CHECK(blocks < (int64_t{1} << 31), "layer_norm_modulate: too many rows for one launch");
  return c;
}

// Block per row (grid-stride), any modulation; VPT vectors per thread.
template <typename T, int VPT, bool FUSED, Norm N, int HOIST>
bool launch_fwd_block(const FwdParams& p, int64_t, const FwdSettings&, cudaStream_t stream) {
  const int64_t nvec = p.D / (16 / sizeof(T));
  layer_norm_modulate_fwd_kernel<T, VPT, FUSED, N, HOIST>
      <<<grid_for_rows(p.rows), threads_for(nvec, VPT), 0, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return true;
}

template <typename T, int VPW, int R, int WPR, bool FUSED, Norm N>
bool launch_fwd_warp(const FwdParams& params, int64_t group, const FwdSettings& s,
                     cudaStream_t stream) {
  TORCH_CHECK(s.warps >= 1 && s.warps <= 8 && s.warps % WPR == 0,
              "layer_norm_modulate: warps per block must be in [1, 8] and a multiple of ", WPR,
              " (warps per row) for this kernel, got ", s.warps);
  FwdParams p = params;
  p.y_words = s.y_words;
  auto kernel = layer_norm_modulate_fwd_warp_kernel<T, VPW, R, WPR, FUSED, N>;
  const int smem = static_cast<int>((FUSED ? 3 : 2) * p.D * static_cast<int64_t>(sizeof(float)));
  const int64_t target = resident_grid(as_ptr(kernel), 32 * s.warps, smem);
  int64_t blocks = 0;
  const RowChunks c = fwd_row_chunks(p.rows, group, target, s.warps / WPR, s.interleave, blocks);
  kernel<<<blocks, 32 * s.warps, smem, stream>>>(p, c);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return true;
}

template <typename T, int VPW, int R, bool FULL, Norm N>
bool launch_fwd_ring(const FwdParams& params, int64_t group, const FwdSettings& s,
                     cudaStream_t stream) {
  TORCH_CHECK(s.warps >= 1 && s.warps <= 8, "layer_norm_modulate: warps must be in [1, 8], got ",
              s.warps);
  TORCH_CHECK(s.stages >= 1 && s.stages <= 3, "layer_norm_modulate: stages must be in [1, 3], got ",
              s.stages);
  FwdParams p = params;
  p.y_words = s.y_words;
  auto kernel = layer_norm_modulate_fwd_ring_kernel<T, VPW, R, FULL, N>;
  const int64_t smem = 2 * p.D * static_cast<int64_t>(sizeof(float)) +
                       int64_t{s.warps} * s.stages * R * p.D * static_cast<int64_t>(sizeof(T));
  const auto& attr = attributes_of(as_ptr(kernel));
  if (smem + static_cast<int64_t>(attr.sharedSizeBytes) >
      static_cast<int64_t>(device_props().sharedMemPerBlockOptin)) {
    return false;
  }
  const int64_t target = resident_grid(as_ptr(kernel), 32 * s.warps, static_cast<int>(smem));
  int64_t blocks = 0;
  const RowChunks c = fwd_row_chunks(p.rows, group, target, s.warps, s.interleave, blocks);
  kernel<<<blocks, 32 * s.warps, static_cast<int>(smem), stream>>>(p, c, s.stages);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return true;
}

template <typename T, Norm N>
bool launch_fwd_loop(const FwdParams& p, int64_t, const FwdSettings&, cudaStream_t stream) {
  layer_norm_modulate_fwd_loop_kernel<T, N><<<grid_for_rows(p.rows), 256, 0, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return true;
}

// Kernel descriptions for the table rows (one instantiation each).
template <typename T>
constexpr int64_t vec_of() {
  return 16 / sizeof(T);
}

// HOIST: where the modulation is loaded (see the kernel); 2 needs it of x's 16-bit type.
template <typename T, int VPT, bool FUSED, Norm N, int HOIST = 0>
constexpr FwdKernel fwd_block(const char* name) {
  // At most 256 threads for VPT <= 4 (the kernel's launch bounds), 512 for VPT 8.
  return {name,
          &launch_fwd_block<T, VPT, FUSED, N, HOIST>,
          int64_t{VPT} * (VPT <= 4 ? 256 : 512),
          0,
          true,
          false,
          FUSED ? 1 : 0,
          1,
          N,
          HOIST == 2};
}

template <typename T, int VPW, int R, int WPR, bool FUSED, Norm N>
constexpr FwdKernel fwd_warp(const char* name) {
  return {name,
          &launch_fwd_warp<T, VPW, R, WPR, FUSED, N>,
          int64_t{32} * VPW * WPR,
          0,
          true,
          true,
          FUSED ? 1 : 0,
          WPR,
          N};
}

template <typename T, int VPW, int R, bool FULL, Norm N>
constexpr FwdKernel fwd_ring(const char* name) {
  return {name,
          &launch_fwd_ring<T, VPW, R, FULL, N>,
          int64_t{32} * VPW,
          FULL ? int64_t{32} * VPW : 0,
          true,
          true,
          0,
          1,
          N};
}

template <typename T, Norm N>
constexpr FwdKernel fwd_loop(const char* name) {
  return {name, &launch_fwd_loop<T, N>, kNoLimit, 0, false, false, kEither, 1, N};
}

// ---- backward ----

// Chooses teams and ring depth and launches a vector backward kernel; false (nothing launched)
// when even one team with one ring slot needs more shared memory than a block gets, so that
// the caller takes another kernel.
template <typename T, int VPT, int DYK, bool LEAN, bool FUSED, bool AFFINE, Norm N>
bool launch_bwd_vector(BwdParams& p, const BwdSettings& s, BwdGrid& grid, cudaStream_t stream) {
  auto kernel = [] {
    if constexpr (LEAN) {
      return layer_norm_modulate_bwd_lean_kernel<T, VPT, DYK, N>;
    } else {
      return layer_norm_modulate_bwd_kernel<T, VPT, DYK, FUSED, AFFINE, N>;
    }
  }();
  const int64_t nvec = p.D / (16 / sizeof(T));
  const cudaDeviceProp* props = &device_props();
  const int tt = static_cast<int>(threads_for(nvec, VPT));
  const cudaFuncAttributes& attr = attributes_of(as_ptr(kernel));
  // Teams (rows in progress per block), by default: as many (up to 4) as keep three blocks'
  // registers on an SM, so that one block's barrier does not leave the SM idle; the lean
  // kernel up to 3 teams and 640 threads, even at one block per SM.
  // Note: both caps were chosen by measurement; more teams than that starve the SM of
  // registers (benchmarks/RESULTS.md, "Kernel tuning notes").
  const int max_teams = std::max(1, attr.maxThreadsPerBlock / tt);
  const int three_blocks = props->regsPerMultiprocessor / (3 * std::max(1, attr.numRegs));
  const int rule = LEAN ? std::max(1, std::min(3, 640 / tt))
                        : std::max(1, std::min({4, 512 / tt, three_blocks / tt}));
  TORCH_CHECK(s.teams >= 0 && s.teams <= 8,
              "layer_norm_modulate backward: teams must be in [0, 8]");
  TORCH_CHECK(s.stages >= 0 && s.stages <= 3,
              "layer_norm_modulate backward: stages must be in [0, 3]");
  int teams = std::min(max_teams, s.teams > 0 ? s.teams : rule);
  p.team_threads = tt;
  p.stage = p.scale.map.inner_stride == 0;
  p.ring_offset = p.stage ? (AFFINE ? 2 : 1) * p.D * static_cast<int64_t>(sizeof(float)) : 0;
  const int64_t slot_bytes = ring_slot_bytes(p.D, sizeof(T), DYK == kF32 ? 4 : 2);
  auto smem_for = [&](int stages, int teams) {
    return p.ring_offset + stages * teams * slot_bytes;
  };
  const int64_t per_block = static_cast<int64_t>(props->sharedMemPerBlockOptin) -
                            static_cast<int64_t>(attr.sharedSizeBytes);
  if (smem_for(1, 1) > per_block && p.stage && !LEAN) {  // give up staging 1 + scale first
    p.stage = false;
    p.ring_offset = 0;
  }
  if (smem_for(1, 1) > per_block) return false;
  // Ring depth: two rows (one in flight while one is reduced) when two blocks still fit on an
  // SM, else one; the lean kernel two whenever they fit one block. Settings that do not fit
  // one block are lowered, stages first.
  // Note: a third row in flight measured no faster for 16-bit rows and slower for fp32 rows,
  // its larger ring halving the blocks per SM; the lean kernel keeps two rows where the
  // two-block rule would give it one (benchmarks/RESULTS.md, "Kernel tuning notes").
  const int64_t per_sm = static_cast<int64_t>(props->sharedMemPerMultiprocessor) - 4096;
  int stages = 2;
  while (!LEAN && stages > 1 && smem_for(stages, teams) * 2 > per_sm) --stages;
  if (s.stages > 0) stages = s.stages;
  while (stages > 1 && smem_for(stages, teams) > per_block) --stages;
  while (teams > 1 && smem_for(stages, teams) > per_block) --teams;
  p.stages = stages;
  p.interleave = s.interleave;
  const int threads = teams * tt;
  const int smem = static_cast<int>(smem_for(stages, teams));
  grid.plan(grid, p, resident_grid(as_ptr(kernel), threads, smem), p.interleave ? teams : 1);
  kernel<<<grid.blocks, threads, smem, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return true;
}

// The token kernel: blocks enough to fill the GPU once, each taking rows in turn.
// Note: a block per row ran slower: its launch and reduction cost is paid per row, not per
// block (benchmarks/RESULTS.md, "Kernel tuning notes").
template <typename T, int VPT, int DYK, Norm N>
bool launch_bwd_token(BwdParams& p, const BwdSettings&, BwdGrid&, cudaStream_t stream) {
  auto kernel = layer_norm_modulate_bwd_token_kernel<T, VPT, DYK, N>;
  const int64_t nvec = p.D / (16 / sizeof(T));
  const int threads = static_cast<int>(threads_for(nvec, VPT));
  const int64_t blocks = std::min(p.rows, resident_grid(as_ptr(kernel), threads, 0));
  kernel<<<std::max<int64_t>(1, blocks), threads, 0, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return true;
}

template <typename T, Norm N>
bool launch_bwd_loop(BwdParams& p, const BwdSettings&, BwdGrid& grid, cudaStream_t stream) {
  const int sms = device_props().multiProcessorCount;
  grid.plan(grid, p, static_cast<int64_t>(sms) * 4, 1);
  layer_norm_modulate_bwd_loop_kernel<T, N><<<grid.blocks, 256, 0, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return true;
}

template <typename T, int VPT, int DYK, bool FUSED, bool AFFINE, Norm N>
constexpr BwdKernel bwd_general(const char* name) {
  return {name,
          &launch_bwd_vector<T, VPT, DYK, false, FUSED, AFFINE, N>,
          int64_t{VPT} * 512,
          true,
          false,
          FUSED ? 1 : 0,
          AFFINE ? 1 : 0,
          N};
}

template <typename T, int VPT, int DYK, Norm N>
constexpr BwdKernel bwd_lean(const char* name) {
  return {name,
          &launch_bwd_vector<T, VPT, DYK, true, false, false, N>,
          int64_t{VPT} * 512,
          true,
          true,
          0,
          0,
          N};
}

template <typename T, Norm N>
constexpr BwdKernel bwd_loop(const char* name) {
  return {name, &launch_bwd_loop<T, N>, kNoLimit, false, false, kEither, kEither, N};
}

// Rows of the token case only (see dispatch.cu: bwd_problem): the plain op without weight or
// bias, with no gradient summed over rows.
template <typename T, int VPT, int DYK, Norm N>
constexpr BwdKernel bwd_token(const char* name) {
  return {name, &launch_bwd_token<T, VPT, DYK, N>, int64_t{VPT} * 256, true, false, 0, 0, N, true};
}

}  // namespace
}  // namespace adaptiveload
