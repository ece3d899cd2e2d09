// The backward's second stage: sums each block's fp32 partials (written by the kernels of
// bwd_kernels.cuh) into the gradients of broadcast operands, in a fixed order. Launched by
// dispatch.cu (reduce_partials).
#pragma once

#include "params.cuh"
#include "vec.cuh"

namespace adaptiveload {
namespace {

// Stage two: out[j, d] = sum of the partials of blocks j*n .. (j+1)*n-1, in a fixed order.
// Block (32, 32): 32 columns; thread row y sums blocks y, y + 32, ... (four loads in flight at
// a time), then the 32 row sums are added in order through shared memory. Only a few such
// blocks exist per output row, so each keeps many loads in flight rather than walking the
// partials one latency at a time.
__global__ void __launch_bounds__(1024) reduce_partials_kernel(const ReduceParams p) {
  __shared__ float part[32][33];
  const int64_t d = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  int64_t total_rows = 0;
  for (int o = 0; o < p.num_outputs; ++o) total_rows += p.out_rows[o];
  for (int64_t y = blockIdx.y; y < total_rows; y += gridDim.y) {
    int o = 0;
    int64_t j = y;
    while (j >= p.out_rows[o]) j -= p.out_rows[o++];
    float s = 0.f;
    if (d < p.D) {
      const int64_t n = p.blocks_per_out[o];
      const int64_t stride = static_cast<int64_t>(p.num_slots) * p.D;
      const float* src = p.partials + (j * n * p.num_slots + p.slot[o]) * p.D + d;
      int64_t b = threadIdx.y;
      for (; b + 96 < n; b += 128) {
        const float v0 = src[b * stride], v1 = src[(b + 32) * stride];
        const float v2 = src[(b + 64) * stride], v3 = src[(b + 96) * stride];
        s += v0;
        s += v1;
        s += v2;
        s += v3;
      }
      for (; b < n; b += 32) s += src[b * stride];
    }
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && d < p.D) {
      float t = 0.f;
#pragma unroll
      for (int k = 0; k < 32; ++k) t += part[k][threadIdx.x];
      store1(p.out[o], p.kind[o], j * p.D + d, t);
    }
    __syncthreads();
  }
}

}  // namespace
}  // namespace adaptiveload
