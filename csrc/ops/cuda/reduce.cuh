// Reductions in a fixed order (so results are the same run to run): over a block, over a
// team of warps sharing a row, over teams of threads (CUB's warp reduction), and a warp's
// 16-bit values summed on the tensor cores.
#pragma once

#include <cub/cub.cuh>

#include "vec.cuh"

namespace adaptiveload {
namespace {

// Sums (a, b) over the block in a fixed order. blockDim.x is a multiple of 32; every thread of
// the block must call it.
__device__ __forceinline__ void block_sum2(float& a, float& b) {
  using WarpReduce = cub::WarpReduce<float>;
  __shared__ typename WarpReduce::TempStorage temp[32];
  __shared__ float2 per_warp[32];
  __shared__ float2 total;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float wa = WarpReduce(temp[warp]).Sum(a);
  const float wb = WarpReduce(temp[warp]).Sum(b);
  if (lane == 0) per_warp[warp] = make_float2(wa, wb);
  __syncthreads();
  if (warp == 0) {
    const int nwarps = blockDim.x / 32;
    const float2 v = lane < nwarps ? per_warp[lane] : make_float2(0.f, 0.f);
    const float ta = WarpReduce(temp[0]).Sum(v.x);
    const float tb = WarpReduce(temp[0]).Sum(v.y);
    if (lane == 0) total = make_float2(ta, tb);
  }
  __syncthreads();
  a = total.x;
  b = total.y;
}

__device__ __forceinline__ float block_sum(float a) {
  float b = 0.f;
  block_sum2(a, b);
  return a;
}

// Adds a warp's 16-bit vectors (8 values per lane, as loaded) to `acc` with one tensor-core
// mma: the 256 values are the A operand (16 x 16; which value sits where does not matter), B is
// all ones, so acc[0] and acc[2] of the lanes of group g (lanes 4g-4g+3) get the sums of A's
// rows g and g + 8, and acc[1], acc[3] the same again. Products by one are exact and the mma
// adds in fp32: one instruction instead of 8 conversions and 8 adds per lane.
template <int XK>
__device__ __forceinline__ void mma_sum16(float (&acc)[4], const Raw<8, 2>& a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (XK == kBF16) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %8}, {%0, %1, %2, %3};\n"
        : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
        : "r"(a.w[0]), "r"(a.w[1]), "r"(a.w[2]), "r"(a.w[3]), "r"(0x3f803f80u));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %8}, {%0, %1, %2, %3};\n"
        : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
        : "r"(a.w[0]), "r"(a.w[1]), "r"(a.w[2]), "r"(a.w[3]), "r"(0x3c003c00u));
  }
#else
  float v[8];
  unpack(a, XK, v);
  float t = 0.f;
#pragma unroll
  for (int k = 0; k < 8; ++k) t += v[k];
  acc[0] += 2.f * t, acc[2] += 2.f * t;  // so that (acc[0] + acc[2]) / 4 is this lane's sum
#endif
}

// ------------------------------------------------------------------------------------------

// Sums v[0..R) over the team of WPR warps (1, 2 or 4) that shares a row; every lane gets the
// same totals, added in a fixed order. A butterfly of shuffles in each warp, then, for teams
// of several warps, the warps' sums through shared memory (`buf` in [2][8 warps][R], the half
// given by `half`: the sum and the square sum of one row use different halves, so that a warp
// rewriting one for its next row never races a team mate still reading it) and a named barrier
// for the team alone.
template <int R, int WPR>
__device__ __forceinline__ void team_sum(float (&v)[R], float* buf, int half) {
#pragma unroll
  for (int m = 16; m >= 1; m /= 2) {
#pragma unroll
    for (int r = 0; r < R; ++r) v[r] += __shfl_xor_sync(0xffffffffu, v[r], m);
  }
  if constexpr (WPR > 1) {
    const int warp = threadIdx.x / 32, first = warp - warp % WPR;
    float* b = buf + half * 8 * R;
    if (threadIdx.x % 32 == 0) {
#pragma unroll
      for (int r = 0; r < R; ++r) b[warp * R + r] = v[r];
    }
    asm volatile("bar.sync %0, %1;" ::"r"(1 + warp / WPR), "r"(32 * WPR) : "memory");
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float t = 0.f;
#pragma unroll
      for (int w = 0; w < WPR; ++w) t += b[(first + w) * R + r];
      v[r] = t;
    }
  }
}

// Sums (a, b) over each team of `team_threads` consecutive threads (a multiple of 32), in a
// fixed order. Every thread of the block calls it. `red` holds two buffers of 32 float2 used in
// turn (`buf` flips), so a call needs one barrier: the buffer written now was last read before
// the previous call's barrier. kWithA false: b alone is summed and a is left alone (the RMSNorm
// backward, which has no mean(g)).
template <bool kWithA = true>
__device__ __forceinline__ void team_sum2(float& a, float& b, int team_threads, float2* red,
                                          int& buf) {
  using WarpReduce = cub::WarpReduce<float>;
  __shared__ typename WarpReduce::TempStorage temp[32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float wa = kWithA ? WarpReduce(temp[warp]).Sum(a) : 0.f;
  const float wb = WarpReduce(temp[warp]).Sum(b);
  float2* r = red + 32 * buf;
  if (lane == 0) r[warp] = make_float2(wa, wb);
  __syncthreads();
  const int per_team = team_threads / 32;
  const int w0 = (threadIdx.x / team_threads) * per_team;
  float sa = 0.f, sb = 0.f;
  for (int k = 0; k < per_team; ++k) {
    const float2 v = r[w0 + k];
    sa += v.x;
    sb += v.y;
  }
  if constexpr (kWithA) a = sa;
  b = sb;
  buf ^= 1;
}

}  // namespace
}  // namespace adaptiveload
