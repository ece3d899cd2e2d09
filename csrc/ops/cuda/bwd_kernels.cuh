// The backward kernels: the general vector kernel, the lean one for the common case and the
// scalar loop kernel. Each block writes fp32 partial sums of the broadcast operands' gradients;
// reduce_partials.cuh sums them in a fixed order (no float atomics: results are bitwise
// reproducible). Each is compiled for a norm kind N (params.cuh): RMSNorm reads no mean and
// drops the mean(g) term of dx, so a row needs one reduction instead of two. Which kernel runs
// is the tuning table's (tuned_bwd_*.cu); docs/ops.md describes them.
#pragma once

#include "params.cuh"
#include "reduce.cuh"

namespace adaptiveload {
namespace {

// Writes a block's partial sums of gradient q: teams 1.. hand their sums to team 0 through the
// (idle) ring, which adds them in team order; team 0 writes the block's partials.
// Every thread of the block calls it (it has barriers); the ring's copies must be complete.
template <int VEC, int VPT>
__device__ __forceinline__ void write_partials(const BwdParams& p, float (&acc)[VPT][VEC], int q,
                                               char* ring, int teams, int team, int tid) {
  const int tt = p.team_threads;
  const int64_t nvec = p.D / VEC;
  float* hand = reinterpret_cast<float*>(ring);  // (teams - 1) x D floats
  if (teams > 1) {
    __syncthreads();
    if (team > 0) {
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        const int64_t c = tid + static_cast<int64_t>(i) * tt;
        if (c < nvec) store_vec(hand + (team - 1) * p.D, kF32, c * VEC, acc[i]);
      }
    }
    __syncthreads();
    if (team == 0) {
      for (int j = 1; j < teams; ++j) {
#pragma unroll
        for (int i = 0; i < VPT; ++i) {
          const int64_t c = tid + static_cast<int64_t>(i) * tt;
          if (c < nvec) {
            float v[VEC];
            load_vec(v, hand + (j - 1) * p.D, kF32, c * VEC);
#pragma unroll
            for (int k = 0; k < VEC; ++k) acc[i][k] += v[k];
          }
        }
      }
    }
  }
  if (team == 0) {
    float* out = p.part[q] + static_cast<int64_t>(blockIdx.x) * p.part_stride;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int64_t c = tid + static_cast<int64_t>(i) * tt;
      if (c < nvec) store_vec(out, kF32, c * VEC, acc[i]);
    }
  }
}

// One block per chunk of rows, split into teams of p.team_threads threads; each team works on
// its own row, so a block has `teams` rows in progress (more rows per block means fewer
// blocks, hence fewer fp32 partials to write and sum for small D). Thread t of a team owns the
// same VPT vectors of every row, so the gradients of broadcast operands accumulate in its
// registers. x and dy rows travel through a ring of p.stages shared-memory buffers per team,
// filled with cp.async p.stages - 1 rows ahead, so the next rows' loads are in flight while one
// is reduced, without holding them in registers. DYK: dy's element kind, fixed at compile time
// so that unpacking dy costs no per-element branch.
// Note: the register caps keep two blocks of up to 384 (VPT 1) or 320 (VPT 2) threads on an SM;
// the fused and affine variants need more to avoid spilling.
// The kernel stays one function of about 240 lines, on purpose: its phases (stage the
// modulation, fill the ring, the row's two reductions, the gradients) share the ring's slots,
// the team's accumulators acc[][] and the staged flags, which the register caps above are set
// for. Helpers that take them by reference (load_g, write_partials) are inlined into it; a split
// that passed them through memory, or that the compiler did not inline, would spill.
template <int VPT, bool WIDE>
constexpr int bwd_max_registers() {
  return WIDE ? 128 : VPT == 1 ? 80 : 96;
}

template <typename T, int VPT, int DYK, bool FUSED, bool AFFINE, Norm N>
__global__ void __maxnreg__((bwd_max_registers<VPT, FUSED || AFFINE>()))
    layer_norm_modulate_bwd_kernel(const BwdParams p) {
  constexpr int VEC = 16 / sizeof(T);
  constexpr int XK = KindOf<T>::value;
  constexpr int DYB = DYK == kF32 ? 4 : 2;  // bytes per dy element
  using XRaw = Raw<VEC, sizeof(T)>;
  using DyRaw = Raw<VEC, DYB>;
  const int64_t nvec = p.D / VEC;
  const float inv_d = 1.f / static_cast<float>(p.D);
  const int tt = p.team_threads;
  const int teams = blockDim.x / tt;
  const int team = threadIdx.x / tt;
  const int tid = threadIdx.x % tt;
  const RowRange rr =
      block_rows(p.group, p.per_group, p.chunk_rows, p.interleave, p.rows, team, teams);

  // Only the slots this variant can use: shift and scale, plus gate (FUSED), weight and bias
  // (AFFINE). Unused slots would still cost registers, as their use is decided at run time.
  constexpr int NS = AFFINE ? kNumSlots : FUSED ? 3 : 2;
  float acc[NS][VPT][VEC];
#pragma unroll
  for (int q = 0; q < NS; ++q)
#pragma unroll
    for (int i = 0; i < VPT; ++i)
#pragma unroll
      for (int k = 0; k < VEC; ++k) acc[q][i][k] = 0.f;
  const bool grouped[kNumSlots] = {p.grad[0].mode == 1, p.grad[1].mode == 1,
                                   FUSED && p.grad[2].mode == 1, AFFINE && p.grad[3].mode == 1,
                                   AFFINE && p.grad[4].mode == 1};

  // The chunk's rows usually share one scale row (per-sample modulation): fold 1 + scale, and
  // the weight, into shared memory once instead of reading them from L2 for every row.
  extern __shared__ float4 bwd_smem4[];
  float* s1s = reinterpret_cast<float*>(bwd_smem4);
  float* ws = s1s + p.D;  // AFFINE only
  char* ring = reinterpret_cast<char*>(bwd_smem4) + p.ring_offset;
  __shared__ float2 red[64];
  int red_buf = 0;
  const bool staged = p.stage && rr.block_start < rr.end && p.scale.map.inner_stride == 0 &&
                      p.scale.map(rr.block_start) == p.scale.map(rr.end - 1);
  if (staged) {
    const int64_t sc_row = p.scale.map(rr.block_start);
    for (int64_t c = threadIdx.x; c < nvec; c += blockDim.x) {
      float sc[VEC];
      load_vec(sc, p.scale.ptr, p.scale.kind, sc_row + c * VEC);
#pragma unroll
      for (int k = 0; k < VEC; ++k) s1s[c * VEC + k] = 1.f + sc[k];
      if (AFFINE) {
        float w[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) w[k] = 1.f;
        if (p.weight != nullptr) load_vec(w, p.weight, p.weight_kind, c * VEC);
#pragma unroll
        for (int k = 0; k < VEC; ++k) ws[c * VEC + k] = w[k];
      }
    }
  }
  __syncthreads();

  // Ring slot s of team j: [x row (D * sizeof(T) bytes) | dy row (D * dy_bytes) | padding].
  const int stages = p.stages;
  constexpr int dy_bytes = DYB;
  const int64_t x_row_bytes = p.D * static_cast<int64_t>(sizeof(T));
  const int64_t slot_bytes = ring_slot_bytes(p.D, sizeof(T), dy_bytes);
  const int64_t iters =
      rr.block_start < rr.end ? (rr.end - rr.block_start + rr.step - 1) / rr.step : 0;
  // Ring slots are counted, not computed as it % stages: a 64-bit remainder (like the row
  // maps' divisions) is a software routine of many instructions, paid per row by every thread.
  auto slot = [&](int s) { return ring + (static_cast<int64_t>(s) * teams + team) * slot_bytes; };
  int fill_slot = 0;  // the slot issue() fills next: (rows issued so far) % stages
  int read_slot = 0;  // the slot of the current row: it % stages
  auto issue = [&](int64_t it) {
    const int64_t row = rr.start + it * rr.step;
    char* sx = slot(fill_slot);
    if (++fill_slot == stages) fill_slot = 0;
    if (it < iters && row < rr.end) {
      char* sdy = sx + x_row_bytes;
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        const int64_t c = tid + static_cast<int64_t>(i) * tt;
        if (c < nvec) {
          const int64_t e = row * p.D + c * VEC;
          copy_async(sx + c * VEC * sizeof(T), static_cast<const T*>(p.x) + e, VEC * sizeof(T));
          copy_async(sdy + c * VEC * dy_bytes, static_cast<const char*>(p.dy) + e * dy_bytes,
                     VEC * dy_bytes);
        }
      }
    }
    copy_commit();  // possibly empty, so that group counts stay in step
  };
  for (int k = 0; k + 1 < stages; ++k) issue(k);
  constexpr bool kMean = N == Norm::kLayer;
  float row_mean = 0.f, row_rstd = 0.f;
  if (rr.start < rr.end) {
    if constexpr (kMean) row_mean = p.mean[rr.start];
    row_rstd = p.rstd[rr.start];
  }

  for (int64_t it = 0; it < iters; ++it) {
    issue(it + stages - 1);
    copy_wait(stages - 1);
    const int64_t row = rr.start + it * rr.step;
    const bool active = row < rr.end;
    const char* sx = slot(read_slot);
    if (++read_slot == stages) read_slot = 0;
    const char* sdy = sx + x_row_bytes;
    const int64_t base = row * p.D;
    // This row's statistics were loaded one row ahead; load the next row's now, so that their
    // global-memory latency is not paid here, between the ring wait and the first use.
    const float mean = kMean && active ? row_mean : 0.f;
    const float rstd = active ? row_rstd : 0.f;
    if (row + rr.step < rr.end) {
      if constexpr (kMean) row_mean = p.mean[row + rr.step];
      row_rstd = p.rstd[row + rr.step];
    }
    const int64_t scale_row = active && !staged ? p.scale.map(row) : 0;
    const int64_t gate_row = FUSED && active && p.dh != nullptr ? p.gate.map(row) : 0;
    const float neg_mean_rstd = kMean ? -mean * rstd : 0.f;

    // g = dy * (1 + scale) * weight is the gradient with respect to xhat.
    auto load_g = [&](int64_t c, float(&xh)[VEC], float(&dy)[VEC], float(&s1)[VEC],
                      float(&w)[VEC]) {
      XRaw xr;
      DyRaw dr;
      load_raw(xr, sx, XK, c * VEC);
      load_raw(dr, sdy, DYK, c * VEC);
      unpack(xr, XK, xh);
      unpack(dr, DYK, dy);
      if (staged) {
#pragma unroll
        for (int k = 0; k < VEC; k += 4) {
          const float4 v = *reinterpret_cast<const float4*>(s1s + c * VEC + k);
          s1[k] = v.x, s1[k + 1] = v.y, s1[k + 2] = v.z, s1[k + 3] = v.w;
        }
#pragma unroll
        for (int k = 0; k < VEC; ++k) w[k] = AFFINE ? ws[c * VEC + k] : 1.f;
      } else {
        load_vec(s1, p.scale.ptr, p.scale.kind, scale_row + c * VEC);
#pragma unroll
        for (int k = 0; k < VEC; ++k) s1[k] += 1.f;
#pragma unroll
        for (int k = 0; k < VEC; ++k) w[k] = 1.f;
        if (AFFINE && p.weight != nullptr) load_vec(w, p.weight, p.weight_kind, c * VEC);
      }
#pragma unroll
      for (int k = 0; k < VEC; ++k) xh[k] = fmaf(xh[k], rstd, neg_mean_rstd);
    };
    float sg = 0.f, sgx = 0.f;
    if (active) {
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        const int64_t c = tid + static_cast<int64_t>(i) * tt;
        if (c < nvec) {
          float xh[VEC], dy[VEC], s1[VEC], w[VEC];
          load_g(c, xh, dy, s1, w);
#pragma unroll
          for (int k = 0; k < VEC; ++k) {
            const float g = dy[k] * s1[k] * w[k];
            if constexpr (kMean) sg += g;
            sgx = fmaf(g, xh[k], sgx);
          }
        }
      }
    }
    team_sum2<kMean>(sg, sgx, tt, red, red_buf);
    if (!active) continue;
    // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), as two FMAs per element (RMSNorm: c0
    // is zero).
    const float c0 = kMean ? -sg * inv_d * rstd : 0.f;
    const float c1 = -sgx * inv_d * rstd;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int64_t c = tid + static_cast<int64_t>(i) * tt;
      if (c >= nvec) continue;
      const int64_t idx = base + c * VEC;
      float xh[VEC], dy[VEC], s1[VEC], w[VEC], dx[VEC];
      load_g(c, xh, dy, s1, w);
#pragma unroll
      for (int k = 0; k < VEC; ++k) dx[k] = fmaf(dy[k] * s1[k] * w[k], rstd, fmaf(xh[k], c1, c0));
      if constexpr (FUSED) {
        if (p.dr != nullptr) {
          float dr[VEC];
          load_vec(dr, p.dr, XK, idx);
#pragma unroll
          for (int k = 0; k < VEC; ++k) dx[k] += dr[k];
        }
        if (p.grad[kGate].mode != 0) {
          float hv[VEC];
          load_vec(hv, p.h, XK, idx);
#pragma unroll
          for (int k = 0; k < VEC; ++k) hv[k] *= dx[k];
          if (grouped[kGate]) {
#pragma unroll
            for (int k = 0; k < VEC; ++k) acc[kGate][i][k] += hv[k];
          } else {
            store_vec(p.grad[kGate].buf, p.grad[kGate].kind, idx, hv);
          }
        }
        if (p.dh != nullptr) {
          float g[VEC];
          load_vec(g, p.gate.ptr, p.gate.kind, gate_row + c * VEC);
#pragma unroll
          for (int k = 0; k < VEC; ++k) g[k] *= dx[k];
          store_vec(p.dh, XK, idx, g);
        }
      }
      if (p.dx != nullptr) store_vec(p.dx, XK, idx, dx);

      float b[VEC];
#pragma unroll
      for (int k = 0; k < VEC; ++k) b[k] = 0.f;
      if (AFFINE && p.bias != nullptr) load_vec(b, p.bias, p.bias_kind, c * VEC);
#pragma unroll
      for (int q = 0; q < NS; ++q) {
        if (q == kGate) continue;
        if (p.grad[q].mode == 0) continue;
        float e[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          e[k] = q == kShift    ? dy[k]
                 : q == kScale  ? dy[k] * (AFFINE ? fmaf(xh[k], w[k], b[k]) : xh[k])
                 : q == kWeight ? dy[k] * s1[k] * xh[k]
                                : dy[k] * s1[k];
        }
        if (grouped[q]) {
#pragma unroll
          for (int k = 0; k < VEC; ++k) acc[q][i][k] += e[k];
        } else {
          store_vec(p.grad[q].buf, p.grad[q].kind, idx, e);
        }
      }
    }
  }

  // Every block writes all its slots, zeros for an empty chunk, so stage two reads no garbage.
  copy_wait(0);
#pragma unroll
  for (int q = 0; q < NS; ++q) {
    if (grouped[q]) write_partials<VEC, VPT>(p, acc[q], q, ring, teams, team, tid);
  }
}

// The common case of the plain op, without the general kernel's run-time branches: no weight or
// bias, a scale row shared by the block's rows (shared or per-sample modulation, staged in
// shared memory as 1 + scale), dshift and dscale summed per group (or not needed), at most 16
// elements of a row per thread. Same teams, ring and row dealing as the general kernel. Pass 1
// keeps xhat and g = dy * (1 + scale) in registers and accumulates dshift and dscale, which need
// no row statistic but the saved ones; pass 2 only forms dx.
// Note: the general kernel is bound by instructions, not memory, at small D: two passes over
// the ring with the gradient modes and operand kinds decided per vector at run time, and 64-bit
// index math per vector (benchmarks/RESULTS.md, "Kernel tuning notes").
// Note: at 96 registers a block holds up to 640 threads (two teams of 320 at D = 5120, the
// default there); uncapped it took 122, which allows one team of 320 per block and one block
// per SM, so every team_sum2 barrier left the SM idle.
template <typename T, int VPT, int DYK, Norm N>
__global__ void __maxnreg__(VPT * 16 / sizeof(T) <= 8 ? 64 : 96)
    layer_norm_modulate_bwd_lean_kernel(const BwdParams p) {
  constexpr int VEC = 16 / sizeof(T);
  constexpr int XK = KindOf<T>::value;
  constexpr int DYB = DYK == kF32 ? 4 : 2;  // bytes per dy element
  using XRaw = Raw<VEC, sizeof(T)>;
  using DyRaw = Raw<VEC, DYB>;
  const int nvec = static_cast<int>(p.D / VEC);  // <= kMaxBwdVectors
  const float inv_d = 1.f / static_cast<float>(p.D);
  const int tt = p.team_threads;
  const int teams = blockDim.x / tt;
  const int team = threadIdx.x / tt;
  const int tid = threadIdx.x % tt;
  const RowRange rr =
      block_rows(p.group, p.per_group, p.chunk_rows, p.interleave, p.rows, team, teams);
  const int64_t iters =
      rr.block_start < rr.end ? (rr.end - rr.block_start + rr.step - 1) / rr.step : 0;

  // 1 + scale as float4 quads ordered [quad][vector] (quad_index; no shared-memory bank
  // conflicts for 16-bit x).
  extern __shared__ float4 bwd_smem4[];
  float4* s1s = bwd_smem4;
  char* ring = reinterpret_cast<char*>(bwd_smem4) + p.ring_offset;
  __shared__ float2 red[64];
  int red_buf = 0;
  if (iters > 0) {
    const int64_t sc_row = p.scale.map(rr.block_start);
    for (int c = threadIdx.x; c < nvec; c += blockDim.x) {
      float sc[VEC];
      load_vec(sc, p.scale.ptr, p.scale.kind, sc_row + c * VEC);
#pragma unroll
      for (int q = 0; q < VEC / 4; ++q) {
        s1s[quad_index<VEC, true>(nvec, c, q)] = make_float4(
            1.f + sc[4 * q], 1.f + sc[4 * q + 1], 1.f + sc[4 * q + 2], 1.f + sc[4 * q + 3]);
      }
    }
  }
  __syncthreads();

  // Byte offsets of this thread's vectors in an x row and a dy row (< 2^16), and whether each
  // exists (the last team threads may own fewer than VPT).
  int xoff[VPT], dyoff[VPT];
  bool has[VPT];
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int c = tid + i * tt;
    has[i] = c < nvec;
    xoff[i] = c * VEC * static_cast<int>(sizeof(T));
    dyoff[i] = c * VEC * DYB;
  }
  const int64_t x_row_bytes = p.D * static_cast<int64_t>(sizeof(T));
  const int64_t dy_row_bytes = p.D * static_cast<int64_t>(DYB);
  const int64_t slot_stride = teams * ring_slot_bytes(p.D, sizeof(T), DYB);
  char* my_ring = ring + team * ring_slot_bytes(p.D, sizeof(T), DYB);
  const int stages = p.stages;
  int fill_slot = 0, read_slot = 0;  // counted, as in the general kernel
  auto issue = [&](int64_t it) {
    const int64_t row = rr.start + it * rr.step;
    char* sx = my_ring + fill_slot * slot_stride;
    if (++fill_slot == stages) fill_slot = 0;
    if (it < iters && row < rr.end) {
      const char* gx = static_cast<const char*>(p.x) + row * x_row_bytes;
      const char* gdy = static_cast<const char*>(p.dy) + row * dy_row_bytes;
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        if (has[i]) {
          copy_async(sx + xoff[i], gx + xoff[i], VEC * sizeof(T));
          copy_async(sx + x_row_bytes + dyoff[i], gdy + dyoff[i], VEC * DYB);
        }
      }
    }
    copy_commit();  // possibly empty, so that group counts stay in step
  };
  for (int k = 0; k + 1 < stages; ++k) issue(k);
  constexpr bool kMean = N == Norm::kLayer;
  float row_mean = 0.f, row_rstd = 0.f;
  if (rr.start < rr.end) {
    if constexpr (kMean) row_mean = p.mean[rr.start];
    row_rstd = p.rstd[rr.start];
  }

  float acc_shift[VPT][VEC], acc_scale[VPT][VEC];
#pragma unroll
  for (int i = 0; i < VPT; ++i)
#pragma unroll
    for (int k = 0; k < VEC; ++k) acc_shift[i][k] = 0.f, acc_scale[i][k] = 0.f;

  for (int64_t it = 0; it < iters; ++it) {
    issue(it + stages - 1);
    copy_wait(stages - 1);
    const int64_t row = rr.start + it * rr.step;
    const bool active = row < rr.end;
    const char* sx = my_ring + read_slot * slot_stride;
    if (++read_slot == stages) read_slot = 0;
    const char* sdy = sx + x_row_bytes;
    const float mean = row_mean, rstd = row_rstd;
    if (row + rr.step < rr.end) {
      if constexpr (kMean) row_mean = p.mean[row + rr.step];
      row_rstd = p.rstd[row + rr.step];
    }
    const float neg_mean_rstd = kMean ? -mean * rstd : 0.f;
    float xh[VPT][VEC], g[VPT][VEC];
    float sg = 0.f, sgx = 0.f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      if (!(active && has[i])) {
        // Never read by pass 2; set only so that no value is carried from the last row
        // (left unset, the compiler kept them live across rows and spilled).
#pragma unroll
        for (int k = 0; k < VEC; ++k) xh[i][k] = 0.f, g[i][k] = 0.f;
      } else {
        XRaw xr;
        DyRaw dr;
        load_raw(xr, sx + xoff[i], XK, 0);
        load_raw(dr, sdy + dyoff[i], DYK, 0);
        float xv[VEC], dy[VEC];
        unpack(xr, XK, xv);
        unpack(dr, DYK, dy);
        const int c = xoff[i] / 16;  // vector index: 16 bytes of x each
#pragma unroll
        for (int k = 0; k < VEC; k += 4) {
          const float4 v = s1s[quad_index<VEC, true>(nvec, c, k / 4)];
          g[i][k] = dy[k] * v.x, g[i][k + 1] = dy[k + 1] * v.y;
          g[i][k + 2] = dy[k + 2] * v.z, g[i][k + 3] = dy[k + 3] * v.w;
        }
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          xh[i][k] = fmaf(xv[k], rstd, neg_mean_rstd);
          if constexpr (kMean) sg += g[i][k];
          sgx = fmaf(g[i][k], xh[i][k], sgx);
          acc_shift[i][k] += dy[k];
          acc_scale[i][k] = fmaf(dy[k], xh[i][k], acc_scale[i][k]);
        }
      }
    }
    team_sum2<kMean>(sg, sgx, tt, red, red_buf);
    if (!active || p.dx == nullptr) continue;
    // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), as two FMAs per element (RMSNorm: c0
    // is zero).
    const float c0 = kMean ? -sg * inv_d * rstd : 0.f;
    const float c1 = -sgx * inv_d * rstd;
    char* gdx = static_cast<char*>(p.dx) + row * x_row_bytes;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      if (!has[i]) continue;
      float dx[VEC];
#pragma unroll
      for (int k = 0; k < VEC; ++k) dx[k] = fmaf(g[i][k], rstd, fmaf(xh[i][k], c1, c0));
      store_vec(gdx + xoff[i], XK, 0, dx);
    }
  }

  copy_wait(0);
  if (p.grad[kShift].mode == 1)
    write_partials<VEC, VPT>(p, acc_shift, kShift, ring, teams, team, tid);
  if (p.grad[kScale].mode == 1)
    write_partials<VEC, VPT>(p, acc_scale, kScale, ring, teams, team, tid);
}

// Per-token modulation of the plain op without weight or bias: no gradient is summed over rows
// (dshift and dscale are per element, or not wanted), so a block simply takes rows in turn
// (grid-stride), one row at a time, VPT vectors per thread. x, dy and the row's scale are all
// loaded before the row's one reduction: a row costs one round trip to memory. No partials, no
// shared-memory ring: the general kernel's ring holds x and dy only, and its per-token scale was
// a second, unhidden round trip per row.
// Note: 128 threads a row (VPT 2) measured fastest, and keeping scale as raw 16-bit words no
// faster (benchmarks/RESULTS.md, "Kernel tuning notes"). VPT 2 spills under 64 registers (fp32
// dy), hence 3 blocks per SM there.
template <typename T, int VPT, int DYK, Norm N>
__global__ void __launch_bounds__(256, VPT == 1 ? 4 : 3)
    layer_norm_modulate_bwd_token_kernel(const BwdParams p) {
  constexpr int VEC = 16 / sizeof(T);
  constexpr int XK = KindOf<T>::value;
  constexpr bool kMean = N == Norm::kLayer;
  using XRaw = Raw<VEC, sizeof(T)>;
  using DyRaw = Raw<VEC, DYK == kF32 ? 4 : 2>;
  const int64_t nvec = p.D / VEC;
  const float inv_d = 1.f / static_cast<float>(p.D);
  const bool want_shift = p.grad[kShift].mode == 2, want_scale = p.grad[kScale].mode == 2;
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const int64_t base = row * p.D;
    const int64_t scale_row = p.scale.map(row);
    XRaw xr[VPT];
    DyRaw dr[VPT];
    float s1[VPT][VEC];  // scale, then 1 + scale
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int64_t c = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
      if (c < nvec) {
        load_raw(xr[i], p.x, XK, base + c * VEC);
        load_raw(dr[i], p.dy, DYK, base + c * VEC);
        load_vec(s1[i], p.scale.ptr, p.scale.kind, scale_row + c * VEC);
      }
    }
    const float mean = kMean ? p.mean[row] : 0.f;
    const float rstd = p.rstd[row];
    const float neg_mean_rstd = -mean * rstd;
    float sg = 0.f, sgx = 0.f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int64_t c = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
      if (c < nvec) {
        float xh[VEC], dy[VEC];
        unpack(xr[i], XK, xh);
        unpack(dr[i], DYK, dy);
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          s1[i][k] += 1.f;
          const float g = dy[k] * s1[i][k];
          if constexpr (kMean) sg += g;
          sgx = fmaf(g, fmaf(xh[k], rstd, neg_mean_rstd), sgx);
        }
      }
    }
    if constexpr (kMean) {
      block_sum2(sg, sgx);
    } else {
      sgx = block_sum(sgx);
    }
    // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) (RMSNorm: no mean(g) term).
    const float c0 = kMean ? -sg * inv_d * rstd : 0.f;
    const float c1 = -sgx * inv_d * rstd;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int64_t c = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
      if (c >= nvec) continue;
      const int64_t idx = base + c * VEC;
      float xh[VEC], dy[VEC], out[VEC];
      unpack(xr[i], XK, xh);
      unpack(dr[i], DYK, dy);
#pragma unroll
      for (int k = 0; k < VEC; ++k) xh[k] = fmaf(xh[k], rstd, neg_mean_rstd);
      if (p.dx != nullptr) {
#pragma unroll
        for (int k = 0; k < VEC; ++k) out[k] = fmaf(dy[k] * s1[i][k], rstd, fmaf(xh[k], c1, c0));
        store_vec(p.dx, XK, idx, out);
      }
      if (want_scale) {
#pragma unroll
        for (int k = 0; k < VEC; ++k) out[k] = dy[k] * xh[k];
        store_vec(p.grad[kScale].buf, p.grad[kScale].kind, idx, out);
      }
      if (want_shift) store_vec(p.grad[kShift].buf, p.grad[kShift].kind, idx, dy);
    }
  }
}

// Any D, any alignment. Partials are accumulated in place in this block's rows of the partial
// buffer; each column belongs to one thread, so no atomics are needed.
template <typename T, Norm N>
__global__ void __launch_bounds__(256) layer_norm_modulate_bwd_loop_kernel(const BwdParams p) {
  constexpr int XK = KindOf<T>::value;
  const float inv_d = 1.f / static_cast<float>(p.D);
  int64_t first, last;
  chunk_range(p, first, last);
  float* part[kNumSlots];
  for (int q = 0; q < kNumSlots; ++q) {
    part[q] = p.grad[q].mode == 1 ? p.part[q] + static_cast<int64_t>(blockIdx.x) * p.part_stride
                                  : nullptr;
    if (part[q] != nullptr)
      for (int64_t d = threadIdx.x; d < p.D; d += blockDim.x) part[q][d] = 0.f;
  }
  auto weight = [&](int64_t d) {
    return p.weight != nullptr ? load1(p.weight, p.weight_kind, d) : 1.f;
  };
  for (int64_t row = first; row < last; ++row) {
    const int64_t base = row * p.D;
    const float mean = N == Norm::kLayer ? p.mean[row] : 0.f, rstd = p.rstd[row];
    const int64_t srow = p.scale.map(row);
    float sg = 0.f, sgx = 0.f;
    for (int64_t d = threadIdx.x; d < p.D; d += blockDim.x) {
      const float xh = (load1(p.x, XK, base + d) - mean) * rstd;
      const float g = load1(p.dy, p.dy_kind, base + d) *
                      (1.f + load1(p.scale.ptr, p.scale.kind, srow + d)) * weight(d);
      if constexpr (N == Norm::kLayer) sg += g;
      sgx = fmaf(g, xh, sgx);
    }
    block_sum2(sg, sgx);
    sg *= inv_d;  // RMSNorm: 0
    sgx *= inv_d;
    for (int64_t d = threadIdx.x; d < p.D; d += blockDim.x) {
      const int64_t idx = base + d;
      const float xh = (load1(p.x, XK, idx) - mean) * rstd;
      const float dy = load1(p.dy, p.dy_kind, idx);
      const float s1 = 1.f + load1(p.scale.ptr, p.scale.kind, srow + d);
      const float w = weight(d);
      const float b = p.bias != nullptr ? load1(p.bias, p.bias_kind, d) : 0.f;
      float dx = rstd * (dy * s1 * w - sg - xh * sgx);
      float e[kNumSlots] = {dy, dy * fmaf(xh, w, b), 0.f, dy * s1 * xh, dy * s1};
      if (p.h != nullptr) {
        if (p.dr != nullptr) dx += load1(p.dr, XK, idx);
        e[kGate] = dx * load1(p.h, XK, idx);
        if (p.dh != nullptr) {
          store1(p.dh, XK, idx, dx * load1(p.gate.ptr, p.gate.kind, p.gate.map(row) + d));
        }
      }
      if (p.dx != nullptr) store1(p.dx, XK, idx, dx);
      for (int q = 0; q < kNumSlots; ++q) {
        if (p.grad[q].mode == 1) {
          part[q][d] += e[q];
        } else if (p.grad[q].mode == 2) {
          store1(p.grad[q].buf, p.grad[q].kind, idx, e[q]);
        }
      }
    }
  }
}

}  // namespace
}  // namespace adaptiveload
