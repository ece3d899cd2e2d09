// The forward kernels: block per row (any modulation), warp teams with rows in registers and
// the ring of shared-memory row slots (modulation constant over a block's rows), and the scalar
// loop kernel (any D, any alignment). Each is compiled for a norm kind N (params.cuh): RMSNorm
// skips the mean's reduction and writes no mean. Which one runs for which shape is the tuning
// table's (tuned_fwd_*.cu); docs/ops.md describes them.
#pragma once

#include "params.cuh"
#include "reduce.cuh"

namespace adaptiveload {
namespace {

// registers of fp32 for 16-bit x): thread t owns vectors t, t + blockDim.x, ..., at most VPT.
// Note: the register cap (64 for VPT <= 2, 85 for VPT 4) keeps 4+ blocks, i.e. rows in flight, per
// SM; left alone the compiler spends registers on hoisting every modulation load.
// HOIST: where shift and scale are loaded. 0: after the row's reductions. 1 and 2: with x, before
// them, so that a row costs one round trip to memory instead of two (per-token modulation, where
// they are as large as x): 1 as floats of any kind, 2 as raw 16-bit words of x's own type (the
// token16 rows), which takes a third of the registers, so more rows are in flight per SM. At
// VPT 2 the floats spilled under the cap of 64, hence 3 blocks (85 registers) there.
// Note: HOIST 2 is the fastest of the three at per-token modulation: the fewest registers,
// so the most rows in flight (benchmarks/RESULTS.md, "Kernel tuning notes").
template <typename T, int VPT, bool FUSED, Norm N, int HOIST>
__global__ void __launch_bounds__(VPT <= 4 ? 256 : 512, HOIST == 2 && VPT == 1   ? 8
                                                        : HOIST == 1 && VPT == 2 ? 3
                                                        : VPT <= 2               ? 4
                                                        : VPT == 4               ? 3
                                                                                 : 1)
    layer_norm_modulate_fwd_kernel(const FwdParams p) {
  constexpr int VEC = 16 / sizeof(T);
  constexpr int XK = KindOf<T>::value;
  const int64_t nvec = p.D / VEC;
  const float inv_d = 1.f / static_cast<float>(p.D);
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const int64_t base = row * p.D;
    Raw<VEC, sizeof(T)> xr[VPT];
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int64_t c = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
#pragma unroll
      for (int k = 0; k < Raw<VEC, sizeof(T)>::kWords; ++k) xr[i].w[k] = 0u;
      if (c < nvec) load_raw(xr[i], p.x, XK, base + c * VEC);
    }
    float hsh[HOIST == 1 ? VPT : 1][VEC], hsc[HOIST == 1 ? VPT : 1][VEC];
    Raw<VEC, sizeof(T)> rsh[HOIST == 2 ? VPT : 1], rsc[HOIST == 2 ? VPT : 1];
    if constexpr (HOIST != 0) {
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        const int64_t c = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
        if (c < nvec) {
          if constexpr (HOIST == 1) {
            load_vec(hsh[i], p.shift.ptr, p.shift.kind, p.shift.map(row) + c * VEC);
            load_vec(hsc[i], p.scale.ptr, p.scale.kind, p.scale.map(row) + c * VEC);
          } else {
            load_raw(rsh[i], p.shift.ptr, XK, p.shift.map(row) + c * VEC);
            load_raw(rsc[i], p.scale.ptr, XK, p.scale.map(row) + c * VEC);
          }
        }
      }
    }
    if constexpr (FUSED) {
      // r = residual + gate * h, rounded to T: the rounded r is what gets normalized, returned
      // and saved for backward.
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        const int64_t c = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
        if (c < nvec) {
          float v[VEC], hv[VEC], g[VEC];
          unpack(xr[i], XK, v);
          load_vec(hv, p.h, XK, base + c * VEC);
          load_vec(g, p.gate.ptr, p.gate.kind, p.gate.map(row) + c * VEC);
#pragma unroll
          for (int k = 0; k < VEC; ++k) v[k] = fmaf(g[k], hv[k], v[k]);
          store_vec(p.r, XK, base + c * VEC, v);
          pack(xr[i], XK, v);
        }
      }
    }
    float mean = 0.f;  // RMSNorm: nothing to subtract
    if constexpr (N == Norm::kLayer) {
      float sum = 0.f;
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        float v[VEC];
        unpack(xr[i], XK, v);  // padding vectors are zero
#pragma unroll
        for (int k = 0; k < VEC; ++k) sum += v[k];
      }
      mean = block_sum(sum) * inv_d;
    }
    float sq = 0.f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int64_t c = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
      if (c < nvec) {
        float v[VEC];
        unpack(xr[i], XK, v);
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const float d = v[k] - mean;
          sq = fmaf(d, d, sq);
        }
      }
    }
    const float rstd = rsqrtf(block_sum(sq) * inv_d + p.eps);
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int64_t c = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
      if (c < nvec) {
        float v[VEC], sh[VEC], sc[VEC];
        unpack(xr[i], XK, v);
        if constexpr (HOIST == 1) {
#pragma unroll
          for (int k = 0; k < VEC; ++k) sh[k] = hsh[i][k], sc[k] = hsc[i][k];
        } else if constexpr (HOIST == 2) {
          unpack(rsh[i], XK, sh);
          unpack(rsc[i], XK, sc);
        } else {
          load_vec(sh, p.shift.ptr, p.shift.kind, p.shift.map(row) + c * VEC);
          load_vec(sc, p.scale.ptr, p.scale.kind, p.scale.map(row) + c * VEC);
        }
#pragma unroll
        for (int k = 0; k < VEC; ++k) v[k] = (v[k] - mean) * rstd;
        if (p.weight != nullptr) {
          float w[VEC];
          load_vec(w, p.weight, p.weight_kind, c * VEC);
#pragma unroll
          for (int k = 0; k < VEC; ++k) v[k] *= w[k];
        }
        if (p.bias != nullptr) {
          float b[VEC];
          load_vec(b, p.bias, p.bias_kind, c * VEC);
#pragma unroll
          for (int k = 0; k < VEC; ++k) v[k] += b[k];
        }
#pragma unroll
        for (int k = 0; k < VEC; ++k) v[k] = fmaf(v[k], 1.f + sc[k], sh[k]);
        store_vec(p.y, p.y_kind, base + c * VEC, v);
      }
    }
    if (threadIdx.x == 0) {
      if constexpr (N == Norm::kLayer) p.mean[row] = mean;
      p.rstd[row] = rstd;
    }
  }
}

// Stages the modulation of the block's rows (constant over them) in shared memory, folded as
//   a = weight * (1 + scale),  b = bias * (1 + scale) + shift   (and the gate, FUSED)
// so that y = xhat * a + b costs no modulation traffic per row. a and b are float4 quads, in
// the order [vector][quad] (QUADS false), or [quad][vector] (QUADS true), where lanes reading
// quad q of their vectors c, c + 1, ... read neighbouring 16 bytes, free of bank conflicts (for
// 16-bit x [vector][quad] puts them 32 bytes apart: two wavefronts per quarter warp).
// Note: [quad][vector] lifted the ring kernel by 5 points (bf16, D = 1536) but cost the
// register kernel 2-4 points at the same shapes (its loads take an extra address each); each
// keeps the order it measured faster with.
template <int VEC, bool FUSED, bool QUADS>
__device__ __forceinline__ void stage_modulation(const FwdParams& p, int64_t first, int nvec,
                                                 float4* sa, float4* sb, float* sg) {
  const int64_t sh_row = p.shift.map(first), sc_row = p.scale.map(first);
  const int64_t g_row = FUSED ? p.gate.map(first) : 0;
  for (int c = threadIdx.x; c < nvec; c += blockDim.x) {
    float sc[VEC], sh[VEC], w[VEC], b[VEC];
    load_vec(sc, p.scale.ptr, p.scale.kind, sc_row + int64_t{c} * VEC);
    load_vec(sh, p.shift.ptr, p.shift.kind, sh_row + int64_t{c} * VEC);
#pragma unroll
    for (int k = 0; k < VEC; ++k) w[k] = 1.f, b[k] = 0.f;
    if (p.weight != nullptr) load_vec(w, p.weight, p.weight_kind, int64_t{c} * VEC);
    if (p.bias != nullptr) load_vec(b, p.bias, p.bias_kind, int64_t{c} * VEC);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      b[k] = fmaf(b[k], 1.f + sc[k], sh[k]);
      w[k] = w[k] * (1.f + sc[k]);
    }
#pragma unroll
    for (int q = 0; q < VEC / 4; ++q) {
      const int j = quad_index<VEC, QUADS>(nvec, c, q);
      sa[j] = make_float4(w[4 * q], w[4 * q + 1], w[4 * q + 2], w[4 * q + 3]);
      sb[j] = make_float4(b[4 * q], b[4 * q + 1], b[4 * q + 2], b[4 * q + 3]);
    }
    if constexpr (FUSED) {
      float g[VEC];
      load_vec(g, p.gate.ptr, p.gate.kind, g_row + int64_t{c} * VEC);
#pragma unroll
      for (int k = 0; k < VEC; ++k) sg[c * VEC + k] = g[k];
    }
  }
  __syncthreads();
}

// a and b of vector c as staged by stage_modulation.
template <int VEC, bool QUADS>
struct ModVec {
  float4 a[VEC / 4], b[VEC / 4];
  __device__ __forceinline__ ModVec(const float4* sa, const float4* sb, int nvec, int c) {
#pragma unroll
    for (int q = 0; q < VEC / 4; ++q) {
      const int j = quad_index<VEC, QUADS>(nvec, c, q);
      a[q] = sa[j], b[q] = sb[j];
    }
  }
  // v = (v - mean) * rstd * a + b
  __device__ __forceinline__ void apply(float (&v)[VEC], float mean, float rstd) const {
#pragma unroll
    for (int q = 0; q < VEC / 4; ++q) {
      v[4 * q] = fmaf((v[4 * q] - mean) * rstd, a[q].x, b[q].x);
      v[4 * q + 1] = fmaf((v[4 * q + 1] - mean) * rstd, a[q].y, b[q].y);
      v[4 * q + 2] = fmaf((v[4 * q + 2] - mean) * rstd, a[q].z, b[q].z);
      v[4 * q + 3] = fmaf((v[4 * q + 3] - mean) * rstd, a[q].w, b[q].w);
    }
  }
};

// Rows in registers, a team of WPR warps per row (the row split into WPR contiguous parts of
// 32 x VPW vectors), R rows per team at a time (R > 1 only for one-warp teams), 8 warps per
// block. The block's rows share one modulation row (shared or per-sample modulation), which the
// kernel stages once per block (stage_modulation).
// Note: reading per-sample modulation from L2 for every row moved 2-3x more bytes through L2
// than x itself and held the block-per-row kernel near half the copy bandwidth.
// Note: the bandwidth follows the row bytes a warp holds, until its registers spill: hence
// two rows per warp at D = 1536 and two warps per row at D = 5120, 32-48 data registers per
// lane (benchmarks/RESULTS.md, "Kernel tuning notes").
// The rest of the forward for R rows a team of WPR warps holds packed in registers (xr, zero
// where a lane has no vector; live[r]: row r exists, at row index rows[r]), given each lane's
// sum of its elements of each row in `mean` (LayerNorm; RMSNorm ignores it): the mean, then the
// sum of squared deviations (a second pass over the registers; both reduced with team_sum), and
// y = xhat * a + b with a and b as staged by stage_modulation (order QUADS). `writer`: the one
// lane of the team that stores mean and rstd. `parity`: the caller's row-iteration count mod 2
// (see below). Shared by the warp and ring kernels; with R = 1 the callers' row exists.
// FULL: every lane has all VPW vectors
// (nvec = 32 x VPW x WPR), so no vector needs a bounds test. CHAINS: independent partial sums
// per lane for the squared deviations (1, or 4 to cut the 4-cycle dependency between
// consecutive fmas of one long chain).
// Note: the lane sums are the callers' so that the ring kernel can add each vector as it reads
// it from shared memory; a separate pass here took its default (bf16 D = 1536) from 72 to 78
// registers, 21 warps per SM instead of 28.
template <typename T, int VPW, int R, int WPR, bool QUADS, bool FULL, int CHAINS, Norm N>
__device__ __forceinline__ void normalize_rows(const FwdParams& p,
                                               const Raw<16 / sizeof(T), sizeof(T)> (&xr)[R][VPW],
                                               const bool (&live)[R], const int64_t (&rows)[R],
                                               float (&mean)[R], int col0, int nvec,
                                               const float4* sa, const float4* sb, float* red,
                                               bool writer, int parity) {
  constexpr int VEC = 16 / sizeof(T);
  constexpr int XK = KindOf<T>::value;
  const float inv_d = 1.f / static_cast<float>(p.D);
  float rstd[R];
  if constexpr (N == Norm::kLayer) team_sum<R, WPR>(mean, red, 0);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    // RMSNorm: a constant zero, which the compiler folds out of every subtraction below.
    mean[r] = N == Norm::kLayer ? mean[r] * inv_d : 0.f;
    float part[CHAINS];
#pragma unroll
    for (int j = 0; j < CHAINS; ++j) part[j] = 0.f;
#pragma unroll
    for (int i = 0; i < VPW; ++i) {
      if (FULL || col0 + 32 * i < nvec) {
        float v[VEC];
        unpack_pass<1>(xr[r][i], XK, v);
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const float d = v[k] - mean[r];
          part[k % CHAINS] = fmaf(d, d, part[k % CHAINS]);
        }
      }
    }
    rstd[r] = part[0];
#pragma unroll
    for (int j = 1; j < CHAINS; ++j) rstd[r] += part[j];
  }
  // LayerNorm's two sums of a row use the two halves of `red`; RMSNorm's one sum alternates
  // between them from row to row, for the same reason (see team_sum).
  team_sum<R, WPR>(rstd, red, N == Norm::kLayer ? 1 : parity);
#pragma unroll
  for (int r = 0; r < R; ++r) rstd[r] = rsqrtf(rstd[r] * inv_d + p.eps);
  // y's dtype is decided once per row, outside the vector loop: a run-time kind inside it
  // made the compiler keep every branch's values live and spill (D = 3072).
  auto finish = [&](auto yk_c, auto words_c) {
    constexpr int YK = decltype(yk_c)::value;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      void* ybase = p.y;
      int64_t base = rows[r] * p.D;
#pragma unroll
      for (int i = 0; i < VPW; ++i) {
        const int c = col0 + 32 * i;
        if ((R == 1 || live[r]) && (FULL || c < nvec)) {
          float v[VEC];
          unpack_pass<2>(xr[r][i], XK, v);
          ModVec<VEC, QUADS>(sa, sb, nvec, c).apply(v, mean[r], rstd[r]);
          if constexpr (decltype(words_c)::value) {
            store_vec_words(ybase, YK, base + c * VEC, v);
          } else {
            store_vec(ybase, YK, base + c * VEC, v);
          }
        }
      }
    }
  };
  using Words = std::true_type;
  using Whole = std::false_type;
  if (p.y_kind == kF32) {
    finish(std::integral_constant<int, kF32>{}, Whole{});
  } else if (p.y_kind == kBF16) {
    p.y_words ? finish(std::integral_constant<int, kBF16>{}, Words{})
              : finish(std::integral_constant<int, kBF16>{}, Whole{});
  } else {
    p.y_words ? finish(std::integral_constant<int, kF16>{}, Words{})
              : finish(std::integral_constant<int, kF16>{}, Whole{});
  }
  if (writer) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (live[r]) {
        if constexpr (N == Norm::kLayer) p.mean[rows[r]] = mean[r];
        p.rstd[rows[r]] = rstd[r];
      }
    }
  }
}

template <int VPW, int R>
constexpr int fwd_warp_min_blocks() {
  // Note: two rows of D = 1536 capped at 85 registers (three blocks, 24 warps per SM) spilled
  // and ran slower than two blocks at 108 registers (benchmarks/RESULTS.md, "Kernel tuning
  // notes").
  return R * VPW * 4 <= 24 ? 3 : 2;  // registers per thread: <= 85 or <= 128 at 256 threads
}

template <typename T, int VPW, int R, int WPR, bool FUSED, Norm N>
__global__ void __launch_bounds__(256, fwd_warp_min_blocks<VPW, R>())
    layer_norm_modulate_fwd_warp_kernel(const FwdParams p, const RowChunks chunks) {
  static_assert(R == 1 || WPR == 1, "several rows per team only for one-warp teams");
  constexpr int VEC = 16 / sizeof(T);
  constexpr int XK = KindOf<T>::value;
  using XRaw = Raw<VEC, sizeof(T)>;
  extern __shared__ float4 smem4[];
  __shared__ float red[2 * 8 * R];
  const float4* sa = smem4;
  const float4* sb = smem4 + p.D / 4;
  float* sg = reinterpret_cast<float*>(smem4 + p.D / 2);  // FUSED only
  const int nvec = static_cast<int>(p.D / VEC);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int teams = blockDim.x / 32 / WPR;
  const RowRange rr = block_rows(chunks.group, chunks.per_group, chunks.chunk_rows,
                                 chunks.interleave, p.rows, warp / WPR, teams);
  if (rr.block_start >= rr.end) return;  // uniform over the block

  // Vector i of this lane: column col0 + 32 * i of the row.
  const int col0 = (warp % WPR) * 32 * VPW + lane;
  XRaw xr[R][VPW];
  bool live[R];
  int64_t rows[R];
  auto load_rows = [&](int64_t row0) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      rows[r] = row0 + r * rr.step;
      live[r] = rows[r] < rr.end;
#pragma unroll
      for (int i = 0; i < VPW; ++i) {
        const int c = col0 + 32 * i;
#pragma unroll
        for (int k = 0; k < XRaw::kWords; ++k) xr[r][i].w[k] = 0u;
        if (live[r] && c < nvec) load_raw(xr[r][i], p.x, XK, rows[r] * p.D + c * VEC);
      }
    }
  };
  stage_modulation<VEC, FUSED, false>(p, rr.block_start, nvec, smem4, smem4 + p.D / 4, sg);

  // Note: issuing the first rows' loads before the staging (so that memory is busy during it)
  // measured slower (benchmarks/RESULTS.md, "Kernel tuning notes").
  int parity = 0;
  for (int64_t row0 = rr.start; row0 < rr.end; row0 += R * rr.step, parity ^= 1) {
    load_rows(row0);
    if constexpr (FUSED) {
      // r = residual + gate * h, rounded to T: the rounded r is what gets normalized, returned
      // and saved for backward.
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int64_t base = rows[r] * p.D;
#pragma unroll
        for (int i = 0; i < VPW; ++i) {
          const int c = col0 + 32 * i;
          if (live[r] && c < nvec) {
            float v[VEC], hv[VEC];
            unpack(xr[r][i], XK, v);
            load_vec(hv, p.h, XK, base + c * VEC);
#pragma unroll
            for (int k = 0; k < VEC; ++k) v[k] = fmaf(sg[c * VEC + k], hv[k], v[k]);
            pack(xr[r][i], XK, v);
            store_raw_vec(p.r, xr[r][i], base + c * VEC);
          }
        }
      }
    }
    float mean[R];  // this lane's row sums (LayerNorm)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      mean[r] = 0.f;
      if constexpr (N == Norm::kLayer) {
#pragma unroll
        for (int i = 0; i < VPW; ++i) {
          float v[VEC];
          unpack(xr[r][i], XK, v);  // padding vectors are zero
#pragma unroll
          for (int k = 0; k < VEC; ++k) mean[r] += v[k];
        }
      }
    }
    normalize_rows<T, VPW, R, WPR, false, false, 1, N>(p, xr, live, rows, mean, col0, nvec, sa, sb,
                                                       red, lane == 0 && warp % WPR == 0, parity);
  }
}

// One warp per row, R rows per warp at a time, the rows streamed through a ring of `stages`
// shared-memory slots per warp (R rows each): each lane copies its own vectors of the next rows
// with cp.async while the warp normalizes the current ones, so a warp always has loads in
// flight and the kernel's start and end (the first loads, the last stores) overlap with work.
// Non-fused rows of up to 32 x VPW vectors whose modulation is constant over the block's rows,
// as in the warp kernel. Row sums of 16-bit rows go through the tensor cores (mma_sum16).
// FULL: every lane has all VPW vectors (no bounds tests).
// Note: the register kernel above loads its rows, waits for them, normalizes and stores them,
// so each launch pays about one round of rows of fill and drain; this ring has none (see
// docs/ops.md for the measured rates and the row count where the table switches).
template <int VPW, int R>
constexpr int fwd_ring_max_registers() {
  // 72 at one row of 6 vectors per lane: 4 blocks of 7 warps per SM (65,536 registers).
  return R * VPW <= 6 ? 72 : 128;
}

template <typename T, int VPW, int R, bool FULL, Norm N>
__global__ void __maxnreg__((fwd_ring_max_registers<VPW, R>()))
    layer_norm_modulate_fwd_ring_kernel(const FwdParams p, const RowChunks chunks, int stages) {
  constexpr int VEC = 16 / sizeof(T);
  constexpr int XK = KindOf<T>::value;
  using XRaw = Raw<VEC, sizeof(T)>;
  extern __shared__ float4 smem4[];
  const float4* sa = smem4;
  const float4* sb = smem4 + p.D / 4;
  const int row_bytes = static_cast<int>(p.D * static_cast<int64_t>(sizeof(T)));
  const int nvec = static_cast<int>(p.D / VEC);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const RowRange rr = block_rows(chunks.group, chunks.per_group, chunks.chunk_rows,
                                 chunks.interleave, p.rows, warp, blockDim.x / 32);
  if (rr.block_start >= rr.end) return;  // uniform over the block
  const int64_t my_rows = rr.start < rr.end ? (rr.end - rr.start + rr.step - 1) / rr.step : 0;
  const int64_t iters = (my_rows + R - 1) / R;

  char* my_ring = reinterpret_cast<char*>(smem4 + p.D / 2) + warp * stages * R * row_bytes;
  int fill_slot = 0, read_slot = 0;
  auto row_of = [&](int64_t k) { return rr.start + k * rr.step; };  // the warp's k-th row
  auto issue = [&](int64_t it) {
    const int slot = fill_slot;
    if (++fill_slot == stages) fill_slot = 0;
    char* s = my_ring + slot * R * row_bytes;
    const char* x = static_cast<const char*>(p.x);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (it * R + r < my_rows) {
        const char* g = x + row_of(it * R + r) * row_bytes;
#pragma unroll
        for (int i = 0; i < VPW; ++i) {
          const int c = lane + 32 * i;
          if (FULL || c < nvec) copy_async(s + r * row_bytes + c * 16, g + c * 16, 16);
        }
      }
    }
    copy_commit();  // possibly empty, so that group counts stay in step
  };
  // The first rows' loads go out before the staging, which they overlap.
  for (int k = 0; k + 1 < stages; ++k) issue(k);
  stage_modulation<VEC, false, true>(p, rr.block_start, nvec, smem4, smem4 + p.D / 4, nullptr);

  for (int64_t it = 0; it < iters; ++it) {
    issue(it + stages - 1);
    copy_wait(stages - 1);
    const char* s = my_ring + read_slot * R * row_bytes;
    if (++read_slot == stages) read_slot = 0;
    XRaw xr[R][VPW];
    bool live[R];
    int64_t rows[R];
    float mean[R];  // this lane's row sums, added as the vectors are read (LayerNorm)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      live[r] = it * R + r < my_rows;
      rows[r] = row_of(it * R + r);
      float part[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int i = 0; i < VPW; ++i) {
        const int c = lane + 32 * i;
#pragma unroll
        for (int k = 0; k < XRaw::kWords; ++k) xr[r][i].w[k] = 0u;
        if ((R == 1 || live[r]) && (FULL || c < nvec)) {
          load_raw(xr[r][i], s + r * row_bytes + c * 16, XK, 0);
        }
        if constexpr (N == Norm::kRms) {
          // no row sum
        } else if constexpr (sizeof(T) == 2) {
          mma_sum16<XK>(part, xr[r][i]);  // padding vectors are zero
        } else {
          float v[VEC];
          unpack(xr[r][i], XK, v);  // padding vectors are zero
#pragma unroll
          for (int k = 0; k < VEC; ++k) part[k % 4] += v[k];
        }
      }
      // mma_sum16: rows g and g + 8 of the warp's sums are in part 0 and 2 of the 4 lanes of
      // group g (the same in each), so a quarter of them adds up to the row over the warp.
      mean[r] =
          sizeof(T) == 2 ? (part[0] + part[2]) * 0.25f : (part[0] + part[1]) + (part[2] + part[3]);
    }
    normalize_rows<T, VPW, R, 1, true, FULL, 4, N>(p, xr, live, rows, mean, lane, nvec, sa, sb,
                                                   nullptr, lane == 0, 0);
  }
  copy_wait(0);
}

// Any D, any alignment: scalar loads, the row re-read from L1/L2 for each pass. RMSNorm sums
// the squares in the first pass and needs no second.
template <typename T, Norm N>
__global__ void __launch_bounds__(256) layer_norm_modulate_fwd_loop_kernel(const FwdParams p) {
  constexpr int XK = KindOf<T>::value;
  const bool fused = p.h != nullptr;
  const float inv_d = 1.f / static_cast<float>(p.D);
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const int64_t base = row * p.D;
    const void* src = fused ? p.r : p.x;
    float sum = 0.f, sq = 0.f;
    for (int64_t d = threadIdx.x; d < p.D; d += blockDim.x) {
      float v = load1(p.x, XK, base + d);
      if (fused) {
        v = round_to_kind(
            fmaf(load1(p.gate.ptr, p.gate.kind, p.gate.map(row) + d), load1(p.h, XK, base + d), v),
            XK);
        store1(p.r, XK, base + d, v);  // re-read below by this same thread
      }
      if constexpr (N == Norm::kLayer) {
        sum += v;
      } else {
        sq = fmaf(v, v, sq);
      }
    }
    float mean = 0.f;
    if constexpr (N == Norm::kLayer) {
      mean = block_sum(sum) * inv_d;
      for (int64_t d = threadIdx.x; d < p.D; d += blockDim.x) {
        const float dv = load1(src, XK, base + d) - mean;
        sq = fmaf(dv, dv, sq);
      }
    }
    const float rstd = rsqrtf(block_sum(sq) * inv_d + p.eps);
    for (int64_t d = threadIdx.x; d < p.D; d += blockDim.x) {
      const float w = p.weight != nullptr ? load1(p.weight, p.weight_kind, d) : 1.f;
      const float b = p.bias != nullptr ? load1(p.bias, p.bias_kind, d) : 0.f;
      const float xn = fmaf((load1(src, XK, base + d) - mean) * rstd, w, b);
      const float sc = load1(p.scale.ptr, p.scale.kind, p.scale.map(row) + d);
      const float sh = load1(p.shift.ptr, p.shift.kind, p.shift.map(row) + d);
      store1(p.y, p.y_kind, base + d, fmaf(xn, 1.f + sc, sh));
    }
    if (threadIdx.x == 0) {
      if constexpr (N == Norm::kLayer) p.mean[row] = mean;
      p.rstd[row] = rstd;
    }
  }
}

}  // namespace
}  // namespace adaptiveload
