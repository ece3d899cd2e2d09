// CUDA kernels of adaptiveload::layer_norm_modulate and gated_residual_layer_norm_modulate
// (forward and backward). See docs/ops.md for the design.
//
// Vector path (D a multiple of the 16-byte vector width VEC, D / VEC <= 8192 forward and
// <= 2048 backward, aligned pointers): the row lives in registers as VPT 16-byte vectors per
// thread, a block covers one row, statistics are reduced with cub::WarpReduce plus a small
// shared-memory step. Other shapes take the loop path (scalar loads, the row re-read from cache).
// Backward never uses float atomics: blocks own row chunks, write fp32 partials, and a second
// kernel sums them in a fixed order, so results are bitwise reproducible.
#include "../layer_norm_modulate.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <torch/library.h>

#include <cub/cub.cuh>

#include <cstdlib>
#include <functional>
#include <type_traits>

namespace adaptiveload {
namespace {

// Dtype codes for tensors whose dtype is only known at run time (modulation, weight, y, dy).
// The branch on them is uniform across the block.
enum Kind : int { kF32 = 0, kBF16 = 1, kF16 = 2 };

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

template <typename T>
struct KindOf;
template <>
struct KindOf<float> {
  static constexpr int value = kF32;
};
template <>
struct KindOf<at::BFloat16> {
  static constexpr int value = kBF16;
};
template <>
struct KindOf<at::Half> {
  static constexpr int value = kF16;
};

__device__ __forceinline__ float bits_to_float(uint32_t bits, int kind) {
  return kind == kBF16 ? __uint_as_float(bits << 16) : __half2float(__ushort_as_half(bits));
}

__device__ __forceinline__ uint32_t pack2(float a, float b, int kind) {
  if (kind == kBF16) {
    __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  __half2 v = __floats2half2_rn(a, b);
  return *reinterpret_cast<uint32_t*>(&v);
}

// N elements of any kind, as raw bits: N fp32 need N/4 uint4, N 16-bit values half of that.
template <int N, int BYTES>
struct Raw {
  static constexpr int kWords = N * BYTES / 4;
  uint32_t w[kWords];
};

// True when the raw storage is 4 bytes per element and holds fp32; a constant false for 16-bit
// storage, so the fp32 branches (which would index past its words) compile away.
template <int BYTES>
__device__ __forceinline__ bool bytes_is_f32(int kind) {
  if constexpr (BYTES == 4) return kind == kF32;
  return false;
}

template <int N, int BYTES>
__device__ __forceinline__ void load_raw(Raw<N, BYTES>& r, const void* base, int kind,
                                         int64_t idx) {
  if (bytes_is_f32<BYTES>(kind)) {
    const uint4* p = reinterpret_cast<const uint4*>(static_cast<const float*>(base) + idx);
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
      const uint4 v = p[i];
      r.w[4 * i] = v.x, r.w[4 * i + 1] = v.y, r.w[4 * i + 2] = v.z, r.w[4 * i + 3] = v.w;
    }
  } else {
    const uint16_t* p = static_cast<const uint16_t*>(base) + idx;
    if constexpr (N >= 8) {
#pragma unroll
      for (int i = 0; i < N / 8; ++i) {
        const uint4 v = reinterpret_cast<const uint4*>(p)[i];
        r.w[4 * i] = v.x, r.w[4 * i + 1] = v.y, r.w[4 * i + 2] = v.z, r.w[4 * i + 3] = v.w;
      }
    } else {
      const uint2 v = *reinterpret_cast<const uint2*>(p);
      r.w[0] = v.x, r.w[1] = v.y;
    }
  }
}

template <int N, int BYTES>
__device__ __forceinline__ void unpack(const Raw<N, BYTES>& r, int kind, float (&out)[N]) {
  if (bytes_is_f32<BYTES>(kind)) {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = __uint_as_float(r.w[i]);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i)
      out[i] = bits_to_float((r.w[i / 2] >> (16 * (i % 2))) & 0xffffu, kind);
  }
}

// unpack for the forward's passes over a row held packed in registers: pass 0 as unpack, passes 1
// and 2 (bf16) with byte permutes written differently, so that the compiler cannot reuse an
// earlier pass's fp32 values; reusing them kept the whole row live in fp32 across the
// reductions, twice the registers of the packed row, and spilled it.
template <int PASS, int N, int BYTES>
__device__ __forceinline__ void unpack_pass(const Raw<N, BYTES>& r, int kind, float (&out)[N]) {
  if constexpr (BYTES == 2 && PASS > 0) {
    if (kind == kBF16) {
#pragma unroll
      for (int i = 0; i < N / 2; ++i) {
        uint32_t lo, hi;
        if constexpr (PASS == 1) {
          asm("prmt.b32 %0, %1, 0, 0x1044;" : "=r"(lo) : "r"(r.w[i]));
          asm("prmt.b32 %0, %1, 0, 0x3244;" : "=r"(hi) : "r"(r.w[i]));
        } else {
          asm("prmt.b32 %0, 0, %1, 0x5400;" : "=r"(lo) : "r"(r.w[i]));
          asm("prmt.b32 %0, 0, %1, 0x7600;" : "=r"(hi) : "r"(r.w[i]));
        }
        out[2 * i] = __uint_as_float(lo);
        out[2 * i + 1] = __uint_as_float(hi);
      }
      return;
    }
  }
  unpack(r, kind, out);
}

// Rounds v to 16-bit `kind` (or keeps fp32) into raw bits.
template <int N, int BYTES>
__device__ __forceinline__ void pack(Raw<N, BYTES>& r, int kind, const float (&v)[N]) {
  if (bytes_is_f32<BYTES>(kind)) {
#pragma unroll
    for (int i = 0; i < N; ++i) r.w[i] = __float_as_uint(v[i]);
  } else {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) r.w[i] = pack2(v[2 * i], v[2 * i + 1], kind);
  }
}

template <int N>
__device__ __forceinline__ void load_vec(float (&out)[N], const void* base, int kind, int64_t idx) {
  Raw<N, 4> r;
  load_raw(r, base, kind, idx);
  unpack(r, kind, out);
}

template <int N>
__device__ __forceinline__ void store_vec(void* base, int kind, int64_t idx, const float (&v)[N]) {
  if (kind == kF32) {
    float4* p = reinterpret_cast<float4*>(static_cast<float*>(base) + idx);
#pragma unroll
    for (int i = 0; i < N / 4; ++i)
      p[i] = make_float4(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
  } else {
    uint16_t* p = static_cast<uint16_t*>(base) + idx;
    if constexpr (N >= 8) {
#pragma unroll
      for (int i = 0; i < N / 8; ++i) {
        reinterpret_cast<uint4*>(p)[i] = make_uint4(
            pack2(v[8 * i], v[8 * i + 1], kind), pack2(v[8 * i + 2], v[8 * i + 3], kind),
            pack2(v[8 * i + 4], v[8 * i + 5], kind), pack2(v[8 * i + 6], v[8 * i + 7], kind));
      }
    } else {
      *reinterpret_cast<uint2*>(p) = make_uint2(pack2(v[0], v[1], kind), pack2(v[2], v[3], kind));
    }
  }
}

// store_vec for 16-bit kinds as N / 2 separate 4-byte stores (FwdParams::y_words).
template <int N>
__device__ __forceinline__ void store_vec_words(void* base, int kind, int64_t idx,
                                                const float (&v)[N]) {
  uint32_t* p = reinterpret_cast<uint32_t*>(static_cast<uint16_t*>(base) + idx);
#pragma unroll
  for (int i = 0; i < N / 2; ++i) p[i] = pack2(v[2 * i], v[2 * i + 1], kind);
}

// Stores packed raw bits of N elements (as held in registers) at element idx.
template <int N, int BYTES>
__device__ __forceinline__ void store_raw_vec(void* base, const Raw<N, BYTES>& r, int64_t idx) {
  uint4* p = reinterpret_cast<uint4*>(static_cast<char*>(base) + idx * BYTES);
#pragma unroll
  for (int i = 0; i < Raw<N, BYTES>::kWords / 4; ++i)
    p[i] = make_uint4(r.w[4 * i], r.w[4 * i + 1], r.w[4 * i + 2], r.w[4 * i + 3]);
}

__device__ __forceinline__ float load1(const void* base, int kind, int64_t idx) {
  if (kind == kF32) return static_cast<const float*>(base)[idx];
  return bits_to_float(static_cast<const uint16_t*>(base)[idx], kind);
}

__device__ __forceinline__ void store1(void* base, int kind, int64_t idx, float v) {
  if (kind == kF32) {
    static_cast<float*>(base)[idx] = v;
  } else if (kind == kBF16) {
    static_cast<__nv_bfloat16*>(base)[idx] = __float2bfloat16_rn(v);
  } else {
    static_cast<__half*>(base)[idx] = __float2half_rn(v);
  }
}

__device__ __forceinline__ float round_to_kind(float v, int kind) {
  if (kind == kBF16) return __bfloat162float(__float2bfloat16_rn(v));
  if (kind == kF16) return __half2float(__float2half_rn(v));
  return v;
}

struct DeviceRowMap {
  int64_t inner, outer_stride, inner_stride;
  __device__ __forceinline__ int64_t operator()(int64_t r) const {
    return (r / inner) * outer_stride + (r % inner) * inner_stride;
  }
};

DeviceRowMap to_device(const RowMap& m) { return {m.inner, m.outer_stride, m.inner_stride}; }

struct ModArg {
  const void* ptr = nullptr;
  int kind = kF32;
  DeviceRowMap map{1, 0, 0};
};

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

// Asynchronous global-to-shared copies (cp.async, sm_80 and newer; plain copies before that).
// Each thread copies and later reads back only its own vectors, so the ring of row buffers
// needs no barrier: a thread waits for its own commit groups.
__device__ __forceinline__ void copy_async(void* dst, const void* src, int bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  if (bytes == 8) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(d), "l"(src) : "memory");
  } else {
    for (int k = 0; k < bytes; k += 16) {
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d + k),
                   "l"(static_cast<const char*>(src) + k)
                   : "memory");
    }
  }
#else
  if (bytes == 8) {
    *static_cast<uint2*>(dst) = *static_cast<const uint2*>(src);
  } else {
    for (int k = 0; k < bytes; k += 16) {
      *reinterpret_cast<uint4*>(static_cast<char*>(dst) + k) =
          *reinterpret_cast<const uint4*>(static_cast<const char*>(src) + k);
    }
  }
#endif
}

__device__ __forceinline__ void copy_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Waits until at most n (0, 1 or 2) of this thread's commit groups are still in flight.
__device__ __forceinline__ void copy_wait(int n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if (n <= 0) {
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
  } else if (n == 1) {
    asm volatile("cp.async.wait_group 1;\n" ::: "memory");
  } else {
    asm volatile("cp.async.wait_group 2;\n" ::: "memory");
  }
#endif
}

// Bulk copies (sm_90): one thread moves a whole row between global and shared memory through
// the copy engine. Loads complete on an mbarrier (its transaction count set to the bytes to
// arrive); stores form bulk groups the issuing thread waits on. Addresses and sizes are
// multiples of 16 bytes. Before sm_90 these trap; the host never selects them there.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
#endif

__device__ __forceinline__ void bar_init(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_addr(bar)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#else
  __trap();
#endif
}

// Arms `bar` for `bytes` of bulk loads issued next by this thread (the barrier's one arrival).
__device__ __forceinline__ void bar_expect(uint64_t* bar, int bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
#else
  __trap();
#endif
}

// Waits until the barrier's phase of this parity (0 for its first use, then 1, 0, ...) is over.
__device__ __forceinline__ void bar_wait(uint64_t* bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred ready;\n mbarrier.try_wait.parity.shared::cta.b64 ready, [%1], %2;\n"
        " selp.u32 %0, 1, 0, ready;\n}\n"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
  } while (!done);
#else
  __trap();
#endif
}

__device__ __forceinline__ void bulk_load(void* dst, const void* src, int bytes, uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
#else
  __trap();
#endif
}

// Orders this thread's ordinary shared-memory accesses before the copy engine's (a bulk store
// reading what it wrote, a bulk load overwriting what it read).
__device__ __forceinline__ void fence_async_smem() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void bulk_store(void* dst, const void* src, int bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst),
               "r"(smem_addr(src)), "r"(bytes)
               : "memory");
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#else
  __trap();
#endif
}

// Waits until this thread's bulk stores have read their shared-memory sources.
__device__ __forceinline__ void bulk_store_wait_read() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
#endif
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
// Forward
// ------------------------------------------------------------------------------------------

struct FwdParams {
  const void* x;  // T: x, or residual for the fused op
  const void* h;  // T, fused only
  void* r;        // T, fused only
  void* y;
  int y_kind;
  // 16-bit y stored as 4-byte words (four stores per 16-byte vector) instead of one 16-byte
  // store per vector. Set per kernel by the host (see fwd_y_words).
  bool y_words;
  ModArg shift, scale, gate;
  const void* weight;  // may be null
  const void* bias;    // may be null
  int weight_kind, bias_kind;
  float* mean;
  float* rstd;
  int64_t rows, D;
  float eps;
};

// One block per row (grid-stride), the row held in registers as packed x values (half the
// registers of fp32 for 16-bit x): thread t owns vectors t, t + blockDim.x, ..., at most VPT.
// Note: the register cap (64 for VPT <= 2, 85 for VPT 4) keeps 4+ blocks, i.e. rows in flight, per
// SM; left alone the compiler spends registers on hoisting every modulation load.
template <typename T, int VPT, bool FUSED>
__global__ void __launch_bounds__(VPT <= 4 ? 256 : 512, VPT <= 2   ? 4
                                                        : VPT == 4 ? 3
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
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      float v[VEC];
      unpack(xr[i], XK, v);  // padding vectors are zero
#pragma unroll
      for (int k = 0; k < VEC; ++k) sum += v[k];
    }
    const float mean = block_sum(sum) * inv_d;
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
        load_vec(sh, p.shift.ptr, p.shift.kind, p.shift.map(row) + c * VEC);
        load_vec(sc, p.scale.ptr, p.scale.kind, p.scale.map(row) + c * VEC);
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
      p.mean[row] = mean;
      p.rstd[row] = rstd;
    }
  }
}

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

// Stages the modulation of the block's rows (constant over them) in shared memory, folded as
//   a = weight * (1 + scale),  b = bias * (1 + scale) + shift   (and the gate, FUSED)
// so that y = xhat * a + b costs no modulation traffic per row. a and b are float4 quads, in
// the order [vector][quad] (QUADS false), or [quad][vector] (QUADS true), where lanes reading
// quad q of their vectors c, c + 1, ... read neighbouring 16 bytes, free of bank conflicts (for
// 16-bit x [vector][quad] puts them 32 bytes apart: two wavefronts per quarter warp).
// Note: [quad][vector] lifted the ring kernel by 5 points (bf16, D = 1536) but cost the
// register kernel 2-4 points at the same shapes (its loads take an extra address each); each
// keeps the order it measured faster with.
template <int VEC, bool QUADS>
__device__ __forceinline__ int quad_index(int nvec, int c, int q) {
  return QUADS ? q * nvec + c : c * (VEC / 4) + q;
}

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
// Note: on the H200 the bandwidth followed the row bytes a warp holds: 3 KB (bf16 D = 1536, one
// row of 6 vectors per lane) ran at 77% of copy bandwidth, 6 KB (D = 3072, 12 vectors) at 87%,
// while 10 KB (D = 5120, 20 vectors, one warp) needed 168 registers, spilled and ran at 77%.
// Hence two rows per warp at D = 1536 and two warps per row at D = 5120: 32-48 data registers
// per lane.
// The rest of the forward for R rows a team of WPR warps holds packed in registers (xr, zero
// where a lane has no vector; live[r]: row r exists, at row index rows[r]), given each lane's
// sum of its elements of each row in `mean`: the mean, then the sum of squared deviations (a
// second pass over the registers; both reduced with team_sum), and y = xhat * a + b with a and
// b as staged by stage_modulation (order QUADS). `writer`: the one lane of the team that stores
// mean and rstd. Shared by the warp and ring kernels; with R = 1 the callers' row exists.
// STAGE_Y: y goes to shared memory at `ystage` (R rows of D elements of y's kind, which the
// caller then stores in bulk) instead of global memory. FULL: every lane has all VPW vectors
// (nvec = 32 x VPW x WPR), so no vector needs a bounds test. CHAINS: independent partial sums
// per lane for the squared deviations (1, or 4 to cut the 4-cycle dependency between
// consecutive fmas of one long chain).
// Note: the lane sums are the callers' so that the ring kernel can add each vector as it reads
// it from shared memory; a separate pass here took its default (bf16 D = 1536) from 72 to 78
// registers, 21 warps per SM instead of 28.
template <typename T, int VPW, int R, int WPR, bool QUADS, bool STAGE_Y, bool FULL, int CHAINS>
__device__ __forceinline__ void normalize_rows(const FwdParams& p,
                                               const Raw<16 / sizeof(T), sizeof(T)> (&xr)[R][VPW],
                                               const bool (&live)[R], const int64_t (&rows)[R],
                                               float (&mean)[R], int col0, int nvec,
                                               const float4* sa, const float4* sb, float* red,
                                               bool writer, char* ystage = nullptr) {
  constexpr int VEC = 16 / sizeof(T);
  constexpr int XK = KindOf<T>::value;
  const float inv_d = 1.f / static_cast<float>(p.D);
  float rstd[R];
  team_sum<R, WPR>(mean, red, 0);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    mean[r] *= inv_d;
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
  team_sum<R, WPR>(rstd, red, 1);
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
      if constexpr (STAGE_Y) ybase = ystage + r * p.D * (YK == kF32 ? 4 : 2), base = 0;
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
        p.mean[rows[r]] = mean[r];
        p.rstd[rows[r]] = rstd[r];
      }
    }
  }
}

template <int VPW, int R>
constexpr int fwd_warp_min_blocks() {
  // Note: two rows of D = 1536 capped at 85 registers (three blocks, 24 warps per SM) spilled
  // 8 bytes and ran at 74% of copy bandwidth against 83% at 108 registers and two blocks.
  return R * VPW * 4 <= 24 ? 3 : 2;  // registers per thread: <= 85 or <= 128 at 256 threads
}

template <typename T, int VPW, int R, int WPR, bool FUSED>
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
  // measured 1-6 points slower on the H200 (bf16, 32,760 rows).
  for (int64_t row0 = rr.start; row0 < rr.end; row0 += R * rr.step) {
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
    float mean[R];  // this lane's row sums
#pragma unroll
    for (int r = 0; r < R; ++r) {
      mean[r] = 0.f;
#pragma unroll
      for (int i = 0; i < VPW; ++i) {
        float v[VEC];
        unpack(xr[r][i], XK, v);  // padding vectors are zero
#pragma unroll
        for (int k = 0; k < VEC; ++k) mean[r] += v[k];
      }
    }
    normalize_rows<T, VPW, R, WPR, false, false, false, 1>(p, xr, live, rows, mean, col0, nvec, sa,
                                                           sb, red, lane == 0 && warp % WPR == 0);
  }
}

// One warp per row, R rows per warp at a time, the rows streamed through a ring of `stages`
// shared-memory slots per warp (R rows each): each lane copies its own vectors of the next rows
// with cp.async while the warp normalizes the current ones, so a warp always has loads in
// flight and the kernel's start and end (the first loads, the last stores) overlap with work.
// Non-fused rows of up to 32 x VPW vectors whose modulation is constant over the block's rows,
// as in the warp kernel.
// Note: the register kernel above loads its rows, waits for them, normalizes and stores them;
// at bf16 D = 1536 (H200) its time fitted ~7 us plus 1.52 ns per row, about one round of rows
// of fill and drain. One row per warp through this ring fitted ~1 us plus 1.68 ns per row: the
// fill and drain were gone, but it streamed slower, as one row per warp in registers did
// (1.66 ns). Two rows per warp (R = 2) ran at 74% of copy bandwidth at 32,760 rows while
// ptxas split its y stores into 4-byte ones (see fwd_y_words), at 83.8% with 16-byte stores,
// and at 85.3-86.4% with 16-bit rows summed on the tensor cores (mma_sum16) and no bounds
// tests (128 registers, no spills; other runs, 1-3 points apart between machines): the
// host's default below 37,500 rows at bf16 D = 1536 (launch_fwd_warp_any). FULL: every lane
// has all VPW vectors (no bounds tests).
// BULK (sm_90, R = 1 rows used): 0 the lanes' 16-byte cp.async copies above; 1 one bulk copy
// per row by lane 0, completing on the slot's mbarrier; 2 as 1, and y (x's dtype) written to a
// y buffer of the warp and stored per row by one bulk copy.
template <int VPW, int R>
constexpr int fwd_ring_max_registers() {
  // 72 at one row of 6 vectors per lane: 4 blocks of 7 warps per SM (65,536 registers).
  return R * VPW <= 6 ? 72 : 128;
}

template <typename T, int VPW, int R, int BULK, bool FULL>
__global__ void __maxnreg__((fwd_ring_max_registers<VPW, R>()))
    layer_norm_modulate_fwd_ring_kernel(const FwdParams p, const RowChunks chunks, int stages) {
  constexpr int VEC = 16 / sizeof(T);
  constexpr int XK = KindOf<T>::value;
  using XRaw = Raw<VEC, sizeof(T)>;
  extern __shared__ float4 smem4[];
  __shared__ uint64_t bars[BULK > 0 ? 8 * 3 : 1];  // BULK: one per warp and slot
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

  // The warp's slots, then (BULK 2) its y buffer of R rows.
  char* my_ring = reinterpret_cast<char*>(smem4 + p.D / 2) +
                  warp * (stages + (BULK == 2 ? 1 : 0)) * R * row_bytes;
  char* ybuf = my_ring + stages * R * row_bytes;
  uint64_t* my_bars = bars + (BULK > 0 ? warp * 3 : 0);
  if constexpr (BULK > 0) {
    if (lane == 0) {
      for (int k = 0; k < stages; ++k) bar_init(my_bars + k);
    }
    __syncwarp();
  }
  int fill_slot = 0, read_slot = 0;
  uint32_t phase = 0;  // BULK: parity of the slots' current use
  auto row_of = [&](int64_t k) { return rr.start + k * rr.step; };  // the warp's k-th row
  auto issue = [&](int64_t it) {
    const int slot = fill_slot;
    if (++fill_slot == stages) fill_slot = 0;
    char* s = my_ring + slot * R * row_bytes;
    const char* x = static_cast<const char*>(p.x);
    if constexpr (BULK > 0) {
      // The slot was last read in the previous iteration: every lane is past that read.
      __syncwarp();
      const int64_t left = my_rows - it * R;
      const int live = left < R ? static_cast<int>(left) : R;
      if (lane == 0 && live > 0) {
        fence_async_smem();
        bar_expect(my_bars + slot, live * row_bytes);
        for (int r = 0; r < live; ++r) {
          bulk_load(s + r * row_bytes, x + row_of(it * R + r) * row_bytes, row_bytes,
                    my_bars + slot);
        }
      }
    } else {
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
    }
  };
  // The first rows' loads go out before the staging, which they overlap.
  for (int k = 0; k + 1 < stages; ++k) issue(k);
  stage_modulation<VEC, false, true>(p, rr.block_start, nvec, smem4, smem4 + p.D / 4, nullptr);

  for (int64_t it = 0; it < iters; ++it) {
    issue(it + stages - 1);
    if constexpr (BULK > 0) {
      bar_wait(my_bars + read_slot, phase);
    } else {
      copy_wait(stages - 1);
    }
    const char* s = my_ring + read_slot * R * row_bytes;
    if (++read_slot == stages) read_slot = 0, phase ^= 1u;
    XRaw xr[R][VPW];
    bool live[R];
    int64_t rows[R];
    float mean[R];  // this lane's row sums, added as the vectors are read
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
        if constexpr (sizeof(T) == 2) {
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
    if constexpr (BULK == 2) {
      // y (of x's dtype) through the warp's y buffer: its previous rows' store must have read it.
      if (lane == 0) bulk_store_wait_read();
      __syncwarp();
      normalize_rows<T, VPW, R, 1, true, true, FULL, 4>(p, xr, live, rows, mean, lane, nvec, sa, sb,
                                                        nullptr, lane == 0, ybuf);
      fence_async_smem();
      __syncwarp();
      if (lane == 0) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
          if (live[r]) {
            bulk_store(static_cast<char*>(p.y) + rows[r] * row_bytes, ybuf + r * row_bytes,
                       row_bytes);
          }
        }
      }
    } else {
      normalize_rows<T, VPW, R, 1, true, false, FULL, 4>(p, xr, live, rows, mean, lane, nvec, sa,
                                                         sb, nullptr, lane == 0);
    }
  }
  if constexpr (BULK == 2) {
    if (lane == 0) bulk_store_wait_read();  // the buffers must outlive the stores' reads
  } else if constexpr (BULK == 0) {
    copy_wait(0);
  }
}

// Any D, any alignment: scalar loads, the row re-read from L1/L2 for each pass.
template <typename T>
__global__ void __launch_bounds__(256) layer_norm_modulate_fwd_loop_kernel(const FwdParams p) {
  constexpr int XK = KindOf<T>::value;
  const bool fused = p.h != nullptr;
  const float inv_d = 1.f / static_cast<float>(p.D);
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const int64_t base = row * p.D;
    const void* src = fused ? p.r : p.x;
    float sum = 0.f;
    for (int64_t d = threadIdx.x; d < p.D; d += blockDim.x) {
      float v = load1(p.x, XK, base + d);
      if (fused) {
        v = round_to_kind(
            fmaf(load1(p.gate.ptr, p.gate.kind, p.gate.map(row) + d), load1(p.h, XK, base + d), v),
            XK);
        store1(p.r, XK, base + d, v);  // re-read below by this same thread
      }
      sum += v;
    }
    const float mean = block_sum(sum) * inv_d;
    float sq = 0.f;
    for (int64_t d = threadIdx.x; d < p.D; d += blockDim.x) {
      const float dv = load1(src, XK, base + d) - mean;
      sq = fmaf(dv, dv, sq);
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
      p.mean[row] = mean;
      p.rstd[row] = rstd;
    }
  }
}

// ------------------------------------------------------------------------------------------
// Backward
// ------------------------------------------------------------------------------------------

// Gradient slots, in partial-buffer order.
enum Slot : int { kShift = 0, kScale = 1, kGate = 2, kWeight = 3, kBias = 4, kNumSlots = 5 };

struct GradArg {
  int mode = 0;         // GradMode
  int slot = -1;        // kGrouped: index into a block's partials
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
  const float* mean;
  const float* rstd;
  GradArg grad[kNumSlots];
  float* partials;  // [gridDim.x][num_slots][D]
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

// Bytes of one ring slot (an x row and a dy row), rounded up to 16 so that every slot, and the
// x row at its start, is 16-byte aligned (fp32 x with bf16 dy and D % 8 == 4 would not be).
__host__ __device__ constexpr int64_t ring_slot_bytes(int64_t D, int64_t x_bytes,
                                                      int64_t dy_bytes) {
  return (D * (x_bytes + dy_bytes) + 15) / 16 * 16;
}

// Sums (a, b) over each team of `team_threads` consecutive threads (a multiple of 32), in a
// fixed order. Every thread of the block calls it. `red` holds two buffers of 32 float2 used in
// turn (`buf` flips), so a call needs one barrier: the buffer written now was last read before
// the previous call's barrier.
__device__ __forceinline__ void team_sum2(float& a, float& b, int team_threads, float2* red,
                                          int& buf) {
  using WarpReduce = cub::WarpReduce<float>;
  __shared__ typename WarpReduce::TempStorage temp[32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float wa = WarpReduce(temp[warp]).Sum(a);
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
  a = sa;
  b = sb;
  buf ^= 1;
}

// Writes a block's partial sums of one gradient slot: teams 1.. hand their sums to team 0
// through the (idle) ring, which adds them in team order; team 0 writes the block's partials.
// Every thread of the block calls it (it has barriers); the ring's copies must be complete.
template <int VEC, int VPT>
__device__ __forceinline__ void write_partials(const BwdParams& p, float (&acc)[VPT][VEC], int slot,
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
    float* out = p.partials + (static_cast<int64_t>(blockIdx.x) * p.num_slots + slot) * p.D;
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
template <int VPT, bool WIDE>
constexpr int bwd_max_registers() {
  return WIDE ? 128 : VPT == 1 ? 80 : 96;
}

template <typename T, int VPT, int DYK, bool FUSED, bool AFFINE>
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
  float row_mean = 0.f, row_rstd = 0.f;
  if (rr.start < rr.end) {
    row_mean = p.mean[rr.start];
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
    const float mean = active ? row_mean : 0.f;
    const float rstd = active ? row_rstd : 0.f;
    if (row + rr.step < rr.end) {
      row_mean = p.mean[row + rr.step];
      row_rstd = p.rstd[row + rr.step];
    }
    const int64_t scale_row = active && !staged ? p.scale.map(row) : 0;
    const int64_t gate_row = FUSED && active && p.dh != nullptr ? p.gate.map(row) : 0;
    const float neg_mean_rstd = -mean * rstd;

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
            sg += g;
            sgx = fmaf(g, xh[k], sgx);
          }
        }
      }
    }
    team_sum2(sg, sgx, tt, red, red_buf);
    if (!active) continue;
    // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), as two FMAs per element.
    const float c0 = -sg * inv_d * rstd;
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
    if (grouped[q]) write_partials<VEC, VPT>(p, acc[q], p.grad[q].slot, ring, teams, team, tid);
  }
}

// The common case of the plain op, without the general kernel's run-time branches: no weight or
// bias, a scale row shared by the block's rows (shared or per-sample modulation, staged in
// shared memory as 1 + scale), dshift and dscale summed per group (or not needed), at most 16
// elements of a row per thread. Same teams, ring and row dealing as the general kernel. Pass 1
// keeps xhat and g = dy * (1 + scale) in registers and accumulates dshift and dscale, which need
// no row statistic but the saved ones; pass 2 only forms dx.
// Note: the general kernel ran about 38 instructions per element at D = 1536 (its SM issuing
// 61% of cycles, memory barely stalled): two passes over the ring with the gradient modes and
// operand kinds decided per vector at run time, and 64-bit index math per vector.
// Note: at 96 registers a block holds up to 640 threads (two teams of 320 at D = 5120, the
// default there); uncapped it took 122, which allows one team of 320 per block and one block
// per SM, so every team_sum2 barrier left the SM idle.
template <typename T, int VPT, int DYK>
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
  float row_mean = 0.f, row_rstd = 0.f;
  if (rr.start < rr.end) {
    row_mean = p.mean[rr.start];
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
      row_mean = p.mean[row + rr.step];
      row_rstd = p.rstd[row + rr.step];
    }
    const float neg_mean_rstd = -mean * rstd;
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
          sg += g[i][k];
          sgx = fmaf(g[i][k], xh[i][k], sgx);
          acc_shift[i][k] += dy[k];
          acc_scale[i][k] = fmaf(dy[k], xh[i][k], acc_scale[i][k]);
        }
      }
    }
    team_sum2(sg, sgx, tt, red, red_buf);
    if (!active || p.dx == nullptr) continue;
    // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), as two FMAs per element.
    const float c0 = -sg * inv_d * rstd;
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
    write_partials<VEC, VPT>(p, acc_shift, p.grad[kShift].slot, ring, teams, team, tid);
  if (p.grad[kScale].mode == 1)
    write_partials<VEC, VPT>(p, acc_scale, p.grad[kScale].slot, ring, teams, team, tid);
}

// Any D, any alignment. Partials are accumulated in place in this block's slice of the partial
// buffer; each column belongs to one thread, so no atomics are needed.
template <typename T>
__global__ void __launch_bounds__(256) layer_norm_modulate_bwd_loop_kernel(const BwdParams p) {
  constexpr int XK = KindOf<T>::value;
  const float inv_d = 1.f / static_cast<float>(p.D);
  int64_t first, last;
  chunk_range(p, first, last);
  float* part = p.partials + static_cast<int64_t>(blockIdx.x) * p.num_slots * p.D;
  for (int64_t d = threadIdx.x; d < p.num_slots * p.D; d += blockDim.x) part[d] = 0.f;
  auto weight = [&](int64_t d) {
    return p.weight != nullptr ? load1(p.weight, p.weight_kind, d) : 1.f;
  };
  for (int64_t row = first; row < last; ++row) {
    const int64_t base = row * p.D;
    const float mean = p.mean[row], rstd = p.rstd[row];
    const int64_t srow = p.scale.map(row);
    float sg = 0.f, sgx = 0.f;
    for (int64_t d = threadIdx.x; d < p.D; d += blockDim.x) {
      const float xh = (load1(p.x, XK, base + d) - mean) * rstd;
      const float g = load1(p.dy, p.dy_kind, base + d) *
                      (1.f + load1(p.scale.ptr, p.scale.kind, srow + d)) * weight(d);
      sg += g;
      sgx = fmaf(g, xh, sgx);
    }
    block_sum2(sg, sgx);
    sg *= inv_d;
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
          part[p.grad[q].slot * p.D + d] += e[q];
        } else if (p.grad[q].mode == 2) {
          store1(p.grad[q].buf, p.grad[q].kind, idx, e[q]);
        }
      }
    }
  }
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

// ------------------------------------------------------------------------------------------
// Host side
// ------------------------------------------------------------------------------------------

constexpr int64_t kMaxFwdVectors = 4096;  // 8 vectors per thread x 512 threads
constexpr int64_t kMaxBwdVectors = 2048;  // 4 vectors per thread x 512 threads

bool aligned(const void* p, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0;
}

// Whether every access of the vector path is a whole aligned vector of `vec` elements.
bool vector_ok(int64_t vec, std::initializer_list<const at::Tensor*> streams,
               std::initializer_list<const Operand*> operands) {
  for (const auto* t : streams) {
    if (t->defined() && t->numel() > 0 && !aligned(t->data_ptr(), vec * t->element_size())) {
      return false;
    }
  }
  for (const auto* o : operands) {
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

template <typename Kernel>
cudaFuncAttributes attributes_of(Kernel kernel) {
  cudaFuncAttributes attr{};
  C10_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
  return attr;
}

// Grid for a kernel sized by occupancy: allows it `smem` bytes of dynamic shared memory (above
// the default 48 KB when needed) and returns how many blocks of `threads` an SM then holds times
// the SM count (at least one block per SM). `attr`: the kernel's attributes_of.
// Note: the 48 KB default bounds static plus dynamic shared memory: the fp32-stream backward at
// D = 3072 asks for exactly 48 KB of dynamic memory beside its static 512 bytes, and failed to
// launch ("invalid argument") while the opt-in was keyed on the dynamic bytes alone.
template <typename Kernel>
int64_t resident_grid(Kernel kernel, const cudaFuncAttributes& attr, int threads, int smem) {
  if (smem + static_cast<int64_t>(attr.sharedSizeBytes) > 48 * 1024) {
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  }
  int per_sm = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  return static_cast<int64_t>(std::max(per_sm, 1)) *
         at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
}

// A positive integer from the environment, or `fallback`: tuning knobs for benchmarks
// (ADAPTIVELOAD_ROW_ORDER, ADAPTIVELOAD_FWD_LAYOUT, ADAPTIVELOAD_FWD_RING, ADAPTIVELOAD_FWD_WARPS,
// ADAPTIVELOAD_FWD_BULK, ADAPTIVELOAD_FWD_FULL, ADAPTIVELOAD_FWD_Y_WORDS, ADAPTIVELOAD_BWD_LEAN,
// ADAPTIVELOAD_BWD_TEAMS, ADAPTIVELOAD_BWD_STAGES; see docs/ops.md).
int env_knob(const char* name, int fallback, int lo, int hi) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  TORCH_CHECK(end != v && *end == '\0' && n >= lo && n <= hi, name, " must be an integer in [", lo,
              ", ", hi, "], got '", v, "'");
  return static_cast<int>(n);
}

// How rows are dealt to the blocks of the row-per-warp forward and the vector backward:
// 1 (default) interleaved tiles, 0 contiguous chunks (ADAPTIVELOAD_ROW_ORDER; see RowChunks).
int row_order() { return env_knob("ADAPTIVELOAD_ROW_ORDER", 1, 0, 1); }

// Calls f with a value of x's element type (float, at::BFloat16 or at::Half).
template <typename F>
void dispatch_x(at::ScalarType st, F&& f) {
  switch (st) {
    case at::kFloat:
      f(float{});
      break;
    case at::kBFloat16:
      f(at::BFloat16{});
      break;
    case at::kHalf:
      f(at::Half{});
      break;
    default:
      TORCH_CHECK(false, "layer_norm_modulate: unsupported dtype ", st, " on CUDA");
  }
}

int64_t vec_width(const at::Tensor& x) { return 16 / x.element_size(); }

int64_t grid_for_rows(int64_t rows) { return std::min<int64_t>(rows, int64_t{1} << 30); }

int64_t threads_for(int64_t nvec, int vpt) {
  return std::max<int64_t>(32, ((nvec + vpt - 1) / vpt + 31) / 32 * 32);
}

template <typename T, bool FUSED>
void launch_fwd_vector(const FwdParams& p, int64_t nvec, cudaStream_t stream) {
  const dim3 grid(grid_for_rows(p.rows));
  // Smallest VPT that keeps the row at <= 256 threads, so a block stays small and an SM holds
  // many rows in flight.
  auto go = [&](auto kernel, int vpt) {
    kernel<<<grid, threads_for(nvec, vpt), 0, stream>>>(p);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };
  if (nvec <= 256) {
    go(layer_norm_modulate_fwd_kernel<T, 1, FUSED>, 1);
  } else if (nvec <= 512) {
    go(layer_norm_modulate_fwd_kernel<T, 2, FUSED>, 2);
  } else if (nvec <= 1024) {
    go(layer_norm_modulate_fwd_kernel<T, 4, FUSED>, 4);
  } else {
    go(layer_norm_modulate_fwd_kernel<T, 8, FUSED>, 8);
  }
}

// Largest row the warp kernel keeps in registers: 4 warps of 10 vectors per lane (bf16
// D = 10240, fp32 D = 5120).
constexpr int64_t kMaxWarpVectors = 4 * 32 * 10;

// How many rows every operand stays constant over: 0 if some operand changes from row to row.
int64_t staging_group(std::initializer_list<const Operand*> operands, int64_t rows) {
  int64_t group = rows;
  for (const Operand* o : operands) {
    if (o->map.inner_stride != 0) return 0;
    if (o->map.outer_stride != 0) group = std::min(group, o->map.inner);
  }
  for (const Operand* o : operands) {
    if (o->map.outer_stride != 0 && o->map.inner % group != 0) return 0;
  }
  return group;
}

// How the rows of the warp and ring kernels are dealt to blocks of `teams` row slots: at least
// one row per slot and block, and enough blocks to fill the GPU once (`target` resident blocks).
// group: rows over which every modulation operand is constant (> 0).
RowChunks fwd_row_chunks(int64_t rows, int64_t group, int64_t target, int64_t teams,
                         int64_t& blocks) {
  RowChunks c{};
  c.group = group;
  c.interleave = row_order() == 1;
  const int64_t groups = (rows + c.group - 1) / c.group;
  c.per_group =
      std::max<int64_t>(1, std::min((target + groups - 1) / groups, (c.group + teams - 1) / teams));
  c.chunk_rows = (c.group + c.per_group - 1) / c.per_group;
  if (!c.interleave) c.per_group = (c.group + c.chunk_rows - 1) / c.chunk_rows;
  blocks = groups * c.per_group;
  TORCH_CHECK(blocks < (int64_t{1} << 31), "layer_norm_modulate: too many rows for one launch");
  return c;
}

// Whether the forward's warp and ring kernels store 16-bit y as 4-byte words: the kernel's
// default, or ADAPTIVELOAD_FWD_Y_WORDS (0: 16-byte stores, 1: 4-byte stores).
// Note: until this knob, ptxas happened to split the register kernel's 16-byte y stores into
// 4-byte ones (its register allocation); on the H200 (bf16, D = 1536, 75,600 rows) the
// register kernel ran at 88.5-88.7% of copy bandwidth with 4-byte stores and 82.3-82.5% with
// 16-byte ones (two runs), while the ring kernel lost 18-31 points with 4-byte stores (ptxas
// had split the two-row ring's stores too: 74% at 32,760 x 1536, against 83.8% unsplit).
bool fwd_y_words(bool fallback) {
  return env_knob("ADAPTIVELOAD_FWD_Y_WORDS", fallback ? 1 : 0, 0, 1) == 1;
}

// Whether the current GPU has the bulk copy engine (sm_90 and newer).
bool bulk_copies() { return at::cuda::getCurrentDeviceProperties()->major >= 9; }

// Warps per block of the forward's warp and ring kernels: 8, or ADAPTIVELOAD_FWD_WARPS (1-8, a
// multiple of wpr, the warps per row).
// Note: choosing the block size that lets an SM hold the most warps (6 warps, 3 blocks and 18
// warps per SM instead of 16 at bf16 D = 1536 and 5120) measured 0.5-2 points slower.
int fwd_block_warps(int wpr, int fallback = 8) {
  const int w = env_knob("ADAPTIVELOAD_FWD_WARPS", fallback, 1, 8);
  TORCH_CHECK(w % wpr == 0, "ADAPTIVELOAD_FWD_WARPS must be a multiple of ", wpr,
              " (warps per row) for D here, got ", w);
  return w;
}

template <typename T, int VPW, int R, int WPR, bool FUSED>
void launch_fwd_warp(const FwdParams& params, int64_t group, cudaStream_t stream) {
  FwdParams p = params;
  p.y_words = fwd_y_words(true);
  auto kernel = layer_norm_modulate_fwd_warp_kernel<T, VPW, R, WPR, FUSED>;
  const int smem = static_cast<int>((FUSED ? 3 : 2) * p.D * static_cast<int64_t>(sizeof(float)));
  const int warps = fwd_block_warps(WPR);
  const int64_t target = resident_grid(kernel, attributes_of(kernel), 32 * warps, smem);
  int64_t blocks = 0;
  const RowChunks c = fwd_row_chunks(p.rows, group, target, warps / WPR, blocks);
  kernel<<<blocks, 32 * warps, smem, stream>>>(p, c);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// False (nothing launched) when the GPU's shared memory per block cannot hold the ring.
template <typename T, int VPW, int R, int BULK = 0>
bool launch_fwd_ring(const FwdParams& params, int64_t group, int stages, cudaStream_t stream,
                     int warps_fallback = 8) {
  FwdParams p = params;
  p.y_words = fwd_y_words(false);
  // Rows that fill every lane's VPW vectors take the kernel without bounds tests, unless its
  // registers spill (ADAPTIVELOAD_FWD_FULL=0: the bounds-tested one anyway, for comparison).
  // Note: on the H200 (bf16, 32,760 x 1536) the one-row-per-warp kernel without bounds tests
  // spilled 24 bytes at its 72-register cap and ran at 80.5% of copy bandwidth, the
  // bounds-tested one at 83.7%; two rows per warp, without bounds tests and no spills, 86.4%.
  constexpr int VEC = 16 / sizeof(T);
  static const bool full_spills =
      attributes_of(layer_norm_modulate_fwd_ring_kernel<T, VPW, R, BULK, true>).localSizeBytes > 0;
  auto kernel = layer_norm_modulate_fwd_ring_kernel<T, VPW, R, BULK, false>;
  if (p.D == int64_t{32} * VPW * VEC && !full_spills &&
      env_knob("ADAPTIVELOAD_FWD_FULL", 1, 0, 1) == 1) {
    kernel = layer_norm_modulate_fwd_ring_kernel<T, VPW, R, BULK, true>;
  }
  const int warps = fwd_block_warps(1, warps_fallback);
  const int64_t slots = stages + (BULK == 2 ? 1 : 0);  // BULK 2: the y buffer
  const int64_t smem = 2 * p.D * static_cast<int64_t>(sizeof(float)) +
                       int64_t{warps} * slots * R * p.D * static_cast<int64_t>(sizeof(T));
  const auto attr = attributes_of(kernel);
  if (smem + static_cast<int64_t>(attr.sharedSizeBytes) >
      static_cast<int64_t>(at::cuda::getCurrentDeviceProperties()->sharedMemPerBlockOptin)) {
    return false;
  }
  const int64_t target = resident_grid(kernel, attr, 32 * warps, static_cast<int>(smem));
  int64_t blocks = 0;
  const RowChunks c = fwd_row_chunks(p.rows, group, target, warps, blocks);
  kernel<<<blocks, 32 * warps, static_cast<int>(smem), stream>>>(p, c, stages);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return true;
}

// Registers per lane and row split for a row of nvec vectors: about 6-12 vectors of a row per
// lane, two rows per warp for short rows, two or four warps per row for long ones (see the
// kernel's note). ADAPTIVELOAD_FWD_LAYOUT=1: one row per warp up to D = 1536 (16-bit types)
// too, for comparison.
template <typename T, bool FUSED>
void launch_fwd_warp_any(const FwdParams& p, int64_t nvec, int64_t group, cudaStream_t stream) {
  const int64_t vpl = (nvec + 31) / 32;  // vectors per lane with one warp per row
  // ADAPTIVELOAD_FWD_RING: 0 the register kernel, 1-3 the ring kernel with that many slots;
  // unset (-1): the ring (2 slots, two rows per warp, 8 warps per block) for bf16 rows of 5-6
  // vectors per lane (bf16 D = 1536) with fewer than kRingRows rows, else the register kernel.
  // Note: on the H200 (bf16, D = 1536) the register kernel's time fitted ~7 us + 1.52 ns per
  // row, the one-row-per-warp ring's ~1 us + 1.68 ns per row: equal near 37,500 rows, where
  // the default switched. The ring with two rows per warp (16-byte y stores, tensor-core row
  // sums, no bounds tests; 128 registers, no spills) measured best below that (86.4 and
  // 85.3% of copy bandwidth at 32,760 rows against 83.7 and 82.7% for one row per warp and
  // 83.5 and 82.6% for the register kernel, two runs), and 86.4-86.8% against the register
  // kernel's 88.5-88.7% at 75,600 rows.
  constexpr int64_t kRingRows = 37500;
  const int ring = env_knob("ADAPTIVELOAD_FWD_RING", -1, 0, 3);
  if constexpr (!FUSED) {
    // ADAPTIVELOAD_FWD_BULK: 1 or 2, the ring kernel's rows (2: and y) move by bulk copies
    // (sm_90 and newer; 2 only when y has x's dtype, else 1), one row per warp.
    const int bulk = bulk_copies() ? env_knob("ADAPTIVELOAD_FWD_BULK", 0, 0, 2) : 0;
    if (bulk > 0 && ring != 0 && vpl <= 12) {
      const int stages = ring > 0 ? ring : 2;
      const int warps = ring > 0 ? 8 : 7;
      const bool y_too = bulk == 2 && p.y_kind == KindOf<T>::value;
      const bool done =
          vpl <= 6 ? (y_too ? launch_fwd_ring<T, 6, 1, 2>(p, group, stages, stream, warps)
                            : launch_fwd_ring<T, 6, 1, 1>(p, group, stages, stream, warps))
                   : (y_too ? launch_fwd_ring<T, 12, 1, 2>(p, group, stages, stream, warps)
                            : launch_fwd_ring<T, 12, 1, 1>(p, group, stages, stream, warps));
      if (done) return;
    }
    if (ring == -1 && std::is_same_v<T, at::BFloat16> && vpl > 4 && vpl <= 6 &&
        p.rows < kRingRows && launch_fwd_ring<T, 6, 2>(p, group, 2, stream)) {
      return;
    }
    if (ring > 0 && vpl <= 12) {
      const bool one_row = env_knob("ADAPTIVELOAD_FWD_LAYOUT", 0, 0, 1) == 1;
      const bool done = vpl <= 4               ? launch_fwd_ring<T, 4, 2>(p, group, ring, stream)
                        : vpl <= 6 && !one_row ? launch_fwd_ring<T, 6, 2>(p, group, ring, stream)
                        : vpl <= 6             ? launch_fwd_ring<T, 6, 1>(p, group, ring, stream)
                                               : launch_fwd_ring<T, 12, 1>(p, group, ring, stream);
      if (done) return;
    }
  }
  if (env_knob("ADAPTIVELOAD_FWD_LAYOUT", 0, 0, 1) == 1 && vpl <= 6) {
    return launch_fwd_warp<T, 6, 1, 1, FUSED>(p, group, stream);
  }
  if (vpl <= 4) return launch_fwd_warp<T, 4, 2, 1, FUSED>(p, group, stream);
  if (vpl <= 6) return launch_fwd_warp<T, 6, 2, 1, FUSED>(p, group, stream);  // D = 1536, bf16
  if (vpl <= 12) return launch_fwd_warp<T, 12, 1, 1, FUSED>(p, group, stream);
  if (vpl <= 20) return launch_fwd_warp<T, 10, 1, 2, FUSED>(p, group, stream);  // D = 5120, bf16
  if (vpl <= 24) return launch_fwd_warp<T, 12, 1, 2, FUSED>(p, group, stream);
  launch_fwd_warp<T, 10, 1, 4, FUSED>(p, group, stream);
}

// group: rows over which every modulation operand is constant (0: not constant).
template <typename T>
void dispatch_fwd(const FwdParams& p, bool vector_path, int64_t group, cudaStream_t stream) {
  const int64_t nvec = p.D / (16 / sizeof(T));
  if (!vector_path) {
    layer_norm_modulate_fwd_loop_kernel<T><<<grid_for_rows(p.rows), 256, 0, stream>>>(p);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  } else if (nvec <= kMaxWarpVectors && group > 0) {
    if (p.h != nullptr) {
      launch_fwd_warp_any<T, true>(p, nvec, group, stream);
    } else {
      launch_fwd_warp_any<T, false>(p, nvec, group, stream);
    }
  } else if (p.h != nullptr) {
    launch_fwd_vector<T, true>(p, nvec, stream);
  } else {
    launch_fwd_vector<T, false>(p, nvec, stream);
  }
}

// x is what gets normalized (residual for the fused op, with h and gate set).
void fwd_cuda(const at::Tensor& x, const at::Tensor* h, const Operand* gate, at::Tensor* r,
              const Operand& shift, const Operand& scale, const std::optional<at::Tensor>& weight,
              const std::optional<at::Tensor>& bias, double eps, at::Tensor& y, at::Tensor& mean,
              at::Tensor& rstd) {
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t D = x.size(-1);
  FwdParams p{};
  p.x = x.data_ptr();
  p.y = y.data_ptr();
  p.y_kind = kind_of(y.scalar_type());
  p.shift = mod_arg(shift);
  p.scale = mod_arg(scale);
  const at::Tensor w = weight.has_value() ? weight->contiguous() : at::Tensor();
  const at::Tensor b = bias.has_value() ? bias->contiguous() : at::Tensor();
  p.weight = w.defined() ? w.data_ptr() : nullptr;
  p.bias = b.defined() ? b.data_ptr() : nullptr;
  p.weight_kind = w.defined() ? kind_of(w.scalar_type()) : kF32;
  p.bias_kind = b.defined() ? kind_of(b.scalar_type()) : kF32;
  p.mean = mean.data_ptr<float>();
  p.rstd = rstd.data_ptr<float>();
  p.rows = x.numel() / D;
  p.D = D;
  p.eps = static_cast<float>(eps);
  const at::Tensor none;
  if (h != nullptr) {
    p.h = h->data_ptr();
    p.r = r->data_ptr();
    p.gate = mod_arg(*gate);
  }
  const int64_t vec = vec_width(x);
  const Operand* ops3[3] = {&shift, &scale, gate != nullptr ? gate : &shift};
  const bool vector_path =
      D % vec == 0 && D / vec <= kMaxFwdVectors &&
      vector_ok(vec, {&x, &y, h != nullptr ? h : &none, r != nullptr ? r : &none, &w, &b},
                {ops3[0], ops3[1], ops3[2]});
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int64_t group = gate != nullptr ? staging_group({&shift, &scale, gate}, p.rows)
                                        : staging_group({&shift, &scale}, p.rows);
  dispatch_x(x.scalar_type(),
             [&](auto tag) { dispatch_fwd<decltype(tag)>(p, vector_path, group, stream); });
}

// Launches a vector backward kernel (the lean one when `lean`); returns false (launching
// nothing) when even its smallest configuration needs more shared memory than a block of this
// device gets, so that the caller takes another kernel instead. set_grid(target blocks, rows per
// tile) plans the chunks.
template <typename T, int VPT, int DYK>
constexpr auto lean_kernel() {
  if constexpr (VPT * (16 / sizeof(T)) <= 16) {
    return layer_norm_modulate_bwd_lean_kernel<T, VPT, DYK>;
  } else {
    return static_cast<void (*)(BwdParams)>(nullptr);  // never launched (see bwd_cuda)
  }
}

template <typename T, int VPT, int DYK>
bool launch_bwd_vector(BwdParams& p, bool fused, bool affine, bool lean, int64_t nvec,
                       cudaStream_t stream, int64_t& blocks_out,
                       std::function<void(int64_t, int64_t)> set_grid) {
  constexpr auto lean_k = lean_kernel<T, VPT, DYK>();
  TORCH_INTERNAL_ASSERT(!lean || lean_k != nullptr);
  auto kernel = lean    ? lean_k
                : fused ? (affine ? layer_norm_modulate_bwd_kernel<T, VPT, DYK, true, true>
                                  : layer_norm_modulate_bwd_kernel<T, VPT, DYK, true, false>)
                        : (affine ? layer_norm_modulate_bwd_kernel<T, VPT, DYK, false, true>
                                  : layer_norm_modulate_bwd_kernel<T, VPT, DYK, false, false>);
  const auto* props = at::cuda::getCurrentDeviceProperties();
  const int tt = static_cast<int>(threads_for(nvec, VPT));
  // Small rows: several teams (rows) per block, up to 512 threads by default; never more than
  // the kernel's registers allow in one block.
  const cudaFuncAttributes attr = attributes_of(kernel);
  // By default, as many teams (up to 4) as keep three blocks' registers on an SM, so that one
  // block's barrier does not leave the SM idle.
  // Note: at D = 1536 (two vectors per thread, 96 threads a row) 2 teams ran at 71.5% of copy
  // bandwidth, 3 teams (two blocks per SM, the same rows in flight) at 69.7%, 4 at 63.8%.
  const int max_teams = std::max(1, attr.maxThreadsPerBlock / tt);
  const int three_blocks = props->regsPerMultiprocessor / (3 * std::max(1, attr.numRegs));
  // The lean kernel: up to 3 teams and 640 threads, even at one block per SM.
  // Note: H200, lean kernel, % of copy bandwidth with 1 / 2 / 3 teams: D = 1536 85.0 / 87.5 /
  // 88.4, D = 3072 92.2 / 82.6 (384 threads, one block per SM) / 94.2, D = 5120 91.3 / 96.8.
  const int fit = lean ? std::max(1, std::min(3, 640 / tt))
                       : std::max(1, std::min({4, 512 / tt, three_blocks / tt}));
  int teams = std::min(max_teams, env_knob("ADAPTIVELOAD_BWD_TEAMS", fit, 1, 8));
  p.team_threads = tt;
  p.stage = p.scale.map.inner_stride == 0;
  p.ring_offset = p.stage ? (affine ? 2 : 1) * p.D * static_cast<int64_t>(sizeof(float)) : 0;
  const int64_t slot_bytes = ring_slot_bytes(p.D, sizeof(T), DYK == kF32 ? 4 : 2);
  auto smem_for = [&](int stages, int teams) {
    return p.ring_offset + stages * teams * slot_bytes;
  };
  const int64_t per_block = static_cast<int64_t>(props->sharedMemPerBlockOptin) -
                            static_cast<int64_t>(attr.sharedSizeBytes);
  if (smem_for(1, 1) > per_block && p.stage && !lean) {  // give up staging 1 + scale first
    p.stage = false;
    p.ring_offset = 0;
  }
  if (smem_for(1, 1) > per_block) return false;
  // Ring depth: two rows (one in flight while one is reduced) when two blocks still fit on an
  // SM, else one. Knob values that do not fit one block are lowered, stages first.
  // Note: a third row in flight measured no faster for 16-bit rows and slower for fp32 rows
  // (D = 5120: 75% against 80% of copy bandwidth), its larger ring halving the blocks per SM.
  const int64_t per_sm = static_cast<int64_t>(props->sharedMemPerMultiprocessor) - 4096;
  // The lean kernel runs one block per SM at its larger team counts anyway: two rows whenever
  // they fit one block.
  // Note: fp32 x, D = 3072 and 5120: the two-block rule gave the lean kernel one row (82% and
  // 86% of copy bandwidth) against 87-93% with two.
  int stages = 2;
  while (!lean && stages > 1 && smem_for(stages, teams) * 2 > per_sm) --stages;
  stages = env_knob("ADAPTIVELOAD_BWD_STAGES", stages, 1, 3);
  while (stages > 1 && smem_for(stages, teams) > per_block) --stages;
  while (teams > 1 && smem_for(stages, teams) > per_block) --teams;
  p.stages = stages;
  p.interleave = row_order() == 1;
  const int threads = teams * tt;
  const int smem = static_cast<int>(smem_for(stages, teams));
  set_grid(resident_grid(kernel, attr, threads, smem), p.interleave ? teams : 1);
  kernel<<<blocks_out, threads, smem, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return true;
}

struct BwdTargets {
  GradTarget* t[kNumSlots];
};

// Chooses the chunking for `target_blocks` blocks, allocates the partials and fills p. Chunks
// never straddle a group of `gmin` rows (see row_group); a block takes at least `tile` rows of a
// group (its teams' rows at a time when they are interleaved).
at::Tensor plan_chunks(BwdParams& p, int64_t gmin, int64_t target_blocks, int64_t tile,
                       const at::Tensor& x, int64_t& blocks) {
  const int64_t rows = p.rows;
  const int64_t groups = rows / gmin;
  int64_t per_group = std::max<int64_t>(1, (target_blocks + groups - 1) / groups);
  per_group = std::min(per_group, (gmin + tile - 1) / tile);
  const int64_t chunk = (gmin + per_group - 1) / per_group;
  per_group = (gmin + chunk - 1) / chunk;  // no empty chunks
  blocks = groups * per_group;
  TORCH_CHECK(blocks < (int64_t{1} << 31), "layer_norm_modulate backward: too many row groups (",
              groups, ")");
  p.group = gmin;
  p.per_group = per_group;
  p.chunk_rows = chunk;
  return at::empty({p.num_slots > 0 ? blocks * p.num_slots * p.D : 0},
                   x.options().dtype(at::kFloat));
}

void reduce_partials(const BwdParams& p, const BwdTargets& tg, cudaStream_t stream) {
  ReduceParams r{};
  r.partials = p.partials;
  r.num_slots = p.num_slots;
  r.D = p.D;
  for (int q = 0; q < kNumSlots; ++q) {
    const GradTarget& t = *tg.t[q];
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

void bwd_cuda(const at::Tensor& dy, const at::Tensor& x, const at::Tensor* dr, const at::Tensor* h,
              const Operand* gate, const Operand& scale, const std::optional<at::Tensor>& weight,
              const std::optional<at::Tensor>& bias, const at::Tensor& mean, const at::Tensor& rstd,
              at::Tensor& dx, at::Tensor* dh, BwdTargets tg) {
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t D = x.size(-1);
  const bool fused = h != nullptr;
  // The vector kernel reads dy as x's own 16-bit type, as bf16 under fp32 x, or as fp32; any
  // other 16-bit dy is widened to fp32 first (exact).
  const auto dst = dy.scalar_type(), xst = x.scalar_type();
  const bool dy_ok = dst == xst || dst == at::kFloat || (xst == at::kFloat && dst == at::kBFloat16);
  const at::Tensor dyv = dy_ok ? dy : dy.to(at::kFloat);
  BwdParams p{};
  p.dy = dyv.data_ptr();
  p.dy_kind = kind_of(dyv.scalar_type());
  p.x = x.data_ptr();
  p.dx = dx.numel() > 0 ? dx.data_ptr() : nullptr;
  p.scale = mod_arg(scale);
  const at::Tensor w = weight.has_value() ? weight->contiguous() : at::Tensor();
  const at::Tensor b = bias.has_value() ? bias->contiguous() : at::Tensor();
  p.weight = w.defined() ? w.data_ptr() : nullptr;
  p.bias = b.defined() ? b.data_ptr() : nullptr;
  p.weight_kind = w.defined() ? kind_of(w.scalar_type()) : kF32;
  p.bias_kind = b.defined() ? kind_of(b.scalar_type()) : kF32;
  p.mean = mean.data_ptr<float>();
  p.rstd = rstd.data_ptr<float>();
  p.rows = x.numel() / D;
  p.D = D;
  const at::Tensor none;
  if (fused) {
    p.h = h->data_ptr();
    p.dr = dr->defined() ? dr->data_ptr() : nullptr;
    p.dh = dh->numel() > 0 ? dh->data_ptr() : nullptr;
    p.gate = mod_arg(*gate);
  }
  for (int q = 0; q < kNumSlots; ++q) {
    const GradTarget& t = *tg.t[q];
    p.grad[q].mode = static_cast<int>(t.mode);
    if (t.mode == GradMode::kGrouped) p.grad[q].slot = p.num_slots++;
    if (t.mode == GradMode::kElementwise) {
      p.grad[q].buf = t.buf.data_ptr();
      p.grad[q].kind = kind_of(t.buf.scalar_type());
    }
  }
  const bool affine = w.defined() || b.defined();
  const int64_t vec = vec_width(x);
  const int64_t nvec = D / vec;
  const at::Tensor* bufs[kNumSlots];
  for (int q = 0; q < kNumSlots; ++q)
    bufs[q] = tg.t[q]->mode == GradMode::kElementwise ? &tg.t[q]->buf : &none;
  const Operand& g = gate != nullptr ? *gate : scale;
  const bool vector_path =
      D % vec == 0 && nvec <= kMaxBwdVectors &&
      vector_ok(vec,
                {&x, &dyv, &dx, &w, &b, fused ? h : &none, fused ? dr : &none, fused ? dh : &none,
                 bufs[0], bufs[1], bufs[2], bufs[3], bufs[4]},
                {&scale, &g});
  // Rows per chunk group: every grouped gradient's groups are whole numbers of them, and for
  // the lean kernel so are the stretches of rows that share one scale row.
  int64_t gmin = min_group({tg.t[0], tg.t[1], tg.t[2], tg.t[3], tg.t[4]}, p.rows);
  bool lean = vector_path && !fused && !affine && scale.map.inner_stride == 0 &&
              tg.t[kShift]->mode != GradMode::kElementwise &&
              tg.t[kScale]->mode != GradMode::kElementwise &&
              env_knob("ADAPTIVELOAD_BWD_LEAN", 1, 0, 1) == 1;
  if (lean && scale.map.outer_stride != 0) {
    const int64_t per_scale = scale.map.inner;
    const int64_t lo = std::min(gmin, per_scale), hi = std::max(gmin, per_scale);
    lean = hi % lo == 0 && p.rows % lo == 0;
    if (lean) gmin = lo;
  }
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  at::Tensor partials;
  int64_t blocks = 0;
  auto set_grid = [&](int64_t target, int64_t tile) {
    partials = plan_chunks(p, gmin, target, tile, x, blocks);
    p.partials = partials.data_ptr<float>();
  };
  dispatch_x(x.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    // Two vectors per thread from D = 1032 (bf16) up: a row's fixed costs (its reductions, the
    // ring's bookkeeping) are then shared by 16 elements instead of 8. Four past 1024 vectors.
    // Note: one vector per thread ran at 62-64% of copy bandwidth at D = 1536 and 3072 against
    // 77% with two at D = 5120; the SM was issuing an instruction 71% of the cycles.
    const int vpt = nvec <= 128 ? 1 : nvec <= 1024 ? 2 : 4;
    auto go = [&](auto dyk_c) {
      constexpr int DYK = decltype(dyk_c)::value;
      if (vpt == 1)
        return launch_bwd_vector<T, 1, DYK>(p, fused, affine, false, nvec, stream, blocks,
                                            set_grid);
      if (vpt == 2)
        return launch_bwd_vector<T, 2, DYK>(p, fused, affine, false, nvec, stream, blocks,
                                            set_grid);
      return launch_bwd_vector<T, 4, DYK>(p, fused, affine, false, nvec, stream, blocks, set_grid);
    };
    // The lean kernel: 8 elements per thread up to D = 1024, else 16 (D <= 8192 in 16-bit
    // types; registers hold xhat, g and two accumulators per element).
    constexpr int kVec = 16 / sizeof(T);
    const bool lean_fits = nvec * kVec <= 16 * 512;
    const int lean_vpt = (nvec * kVec <= 1024 ? 8 : 16) / kVec;
    auto go_lean = [&](auto dyk_c) {
      constexpr int DYK = decltype(dyk_c)::value;
      if (lean_vpt == 8 / kVec)
        return launch_bwd_vector<T, 8 / kVec, DYK>(p, false, false, true, nvec, stream, blocks,
                                                   set_grid);
      return launch_bwd_vector<T, 16 / kVec, DYK>(p, false, false, true, nvec, stream, blocks,
                                                  set_grid);
    };
    constexpr int XK = KindOf<T>::value;
    // The narrow kind: x's own for 16-bit x, bf16 for fp32 x (fp32 stream, bf16 output).
    constexpr int NARROW = XK == kF32 ? kBF16 : XK;
    bool launched = false;
    if (lean && lean_fits) {
      launched = p.dy_kind == NARROW ? go_lean(std::integral_constant<int, NARROW>{})
                                     : go_lean(std::integral_constant<int, kF32>{});
    }
    if (vector_path && !launched) {
      launched = p.dy_kind == NARROW ? go(std::integral_constant<int, NARROW>{})
                                     : go(std::integral_constant<int, kF32>{});
    }
    if (!launched) {
      const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
      set_grid(static_cast<int64_t>(sms) * 4, 1);
      layer_norm_modulate_bwd_loop_kernel<T><<<blocks, 256, 0, stream>>>(p);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  });
  reduce_partials(p, tg, stream);
}

void check_cuda_stats(const char* op, const at::Tensor& mean, const at::Tensor& rstd,
                      const at::Tensor& x) {
  const int64_t rows = x.numel() / x.size(-1);
  TORCH_CHECK(mean.scalar_type() == at::kFloat && rstd.scalar_type() == at::kFloat &&
                  mean.numel() == rows && rstd.numel() == rows,
              op, ": mean and rstd must be float32 with ", rows, " elements (one per row)");
  TORCH_CHECK(mean.device() == x.device() && rstd.device() == x.device(), op,
              ": mean and rstd must be on ", x.device());
}

// ---- op entry points ----

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_modulate_cuda(
    const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale,
    const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias, double eps,
    std::optional<at::ScalarType> out_dtype) {
  constexpr const char* op = "layer_norm_modulate";
  check_inputs(op, "x", x, {{"shift", shift}, {"scale", scale}}, weight, bias);
  auto [y, mean, rstd] = make_forward_outputs(op, x, out_dtype);
  if (x.numel() == 0) return {y, mean, rstd};
  const Operand sh = prepare_operand(shift, x), sc = prepare_operand(scale, x);
  fwd_cuda(x, nullptr, nullptr, nullptr, sh, sc, weight, bias, eps, y, mean, rstd);
  return {y, mean, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
layer_norm_modulate_backward_cuda(const at::Tensor& dy_in, const at::Tensor& x,
                                  const at::Tensor& shift, const at::Tensor& scale,
                                  const std::optional<at::Tensor>& weight,
                                  const std::optional<at::Tensor>& bias, const at::Tensor& mean,
                                  const at::Tensor& rstd, std::array<bool, 5> mask) {
  constexpr const char* op = "_layer_norm_modulate_backward";
  check_inputs(op, "x", x, {{"shift", shift}, {"scale", scale}}, weight, bias);
  check_grad_input(op, "dy", dy_in, "x", x);
  check_cuda_stats(op, mean, rstd, x);
  const at::Tensor dy = dy_in.contiguous();
  at::Tensor dx =
      mask[0] ? at::empty_like(x, at::MemoryFormat::Contiguous) : at::empty({0}, x.options());
  GradTarget none_gate;
  GradTarget dshift = make_grad_target(shift, x, mask[1], at::kFloat);
  GradTarget dscale = make_grad_target(scale, x, mask[2], at::kFloat);
  GradTarget dweight =
      make_grad_target(weight.value_or(x), x, mask[3] && weight.has_value(), at::kFloat);
  GradTarget dbias = make_grad_target(bias.value_or(x), x, mask[4] && bias.has_value(), at::kFloat);
  BwdTargets tg{{&dshift, &dscale, &none_gate, &dweight, &dbias}};
  if (x.numel() > 0) {
    const Operand sc = prepare_operand(scale, x);
    bwd_cuda(dy, x, nullptr, nullptr, nullptr, sc, weight, bias, mean.contiguous(),
             rstd.contiguous(), dx, nullptr, tg);
    for (auto* t : tg.t) finish_grad(*t);
  } else {
    for (auto* t : tg.t)
      if (t->out.defined()) t->out.zero_();
  }
  return {dx, dshift.out, dscale.out, dweight.out, dbias.out};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> gated_residual_layer_norm_modulate_cuda(
    const at::Tensor& residual, const at::Tensor& h_in, const at::Tensor& gate,
    const at::Tensor& shift, const at::Tensor& scale, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, double eps, std::optional<at::ScalarType> out_dtype) {
  constexpr const char* op = "gated_residual_layer_norm_modulate";
  check_inputs(op, "residual", residual, {{"gate", gate}, {"shift", shift}, {"scale", scale}},
               weight, bias);
  check_residual_pair(op, residual, h_in);
  const at::Tensor h = h_in.contiguous();
  auto r = at::empty_like(residual, at::MemoryFormat::Contiguous);
  auto [y, mean, rstd] = make_forward_outputs(op, residual, out_dtype);
  if (residual.numel() == 0) return {r, y, mean, rstd};
  const Operand g = prepare_operand(gate, residual);
  const Operand sh = prepare_operand(shift, residual), sc = prepare_operand(scale, residual);
  fwd_cuda(residual, &h, &g, &r, sh, sc, weight, bias, eps, y, mean, rstd);
  return {r, y, mean, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
gated_residual_layer_norm_modulate_backward_cuda(const std::optional<at::Tensor>& dr_in,
                                                 const at::Tensor& dy_in, const at::Tensor& r,
                                                 const at::Tensor& h_in, const at::Tensor& gate,
                                                 const at::Tensor& shift, const at::Tensor& scale,
                                                 const std::optional<at::Tensor>& weight,
                                                 const std::optional<at::Tensor>& bias,
                                                 const at::Tensor& mean, const at::Tensor& rstd,
                                                 std::array<bool, 7> mask) {
  constexpr const char* op = "_gated_residual_layer_norm_modulate_backward";
  check_inputs(op, "r", r, {{"gate", gate}, {"shift", shift}, {"scale", scale}}, weight, bias);
  check_residual_pair(op, r, h_in);
  check_grad_input(op, "dy", dy_in, "r", r);
  check_cuda_stats(op, mean, rstd, r);
  const at::Tensor h = h_in.contiguous();
  const at::Tensor dy = dy_in.contiguous();
  at::Tensor dr;
  if (dr_in.has_value() && dr_in->defined()) {
    check_grad_input(op, "dr", *dr_in, "r", r);
    // The kernel reads dr in r's dtype.
    dr = dr_in->to(r.scalar_type()).contiguous();
  }
  const auto contiguous = at::MemoryFormat::Contiguous;
  // dresidual is computed whenever dh or dgate needs it; it is only stored when asked for.
  at::Tensor dres = mask[0] ? at::empty_like(r, contiguous) : at::empty({0}, r.options());
  at::Tensor dh = mask[1] ? at::empty_like(h, contiguous) : at::empty({0}, h.options());
  GradTarget dgate = make_grad_target(gate, r, mask[2], at::kFloat);
  GradTarget dshift = make_grad_target(shift, r, mask[3], at::kFloat);
  GradTarget dscale = make_grad_target(scale, r, mask[4], at::kFloat);
  GradTarget dweight =
      make_grad_target(weight.value_or(r), r, mask[5] && weight.has_value(), at::kFloat);
  GradTarget dbias = make_grad_target(bias.value_or(r), r, mask[6] && bias.has_value(), at::kFloat);
  BwdTargets tg{{&dshift, &dscale, &dgate, &dweight, &dbias}};
  if (r.numel() > 0) {
    const Operand g = prepare_operand(gate, r), sc = prepare_operand(scale, r);
    bwd_cuda(dy, r, &dr, &h, &g, sc, weight, bias, mean.contiguous(), rstd.contiguous(), dres, &dh,
             tg);
    for (auto* t : tg.t) finish_grad(*t);
  } else {
    for (auto* t : tg.t)
      if (t->out.defined()) t->out.zero_();
  }
  return {dres, dh, dgate.out, dshift.out, dscale.out, dweight.out, dbias.out};
}

}  // namespace

TORCH_LIBRARY_IMPL(adaptiveload, CUDA, m) {
  m.impl("layer_norm_modulate", &layer_norm_modulate_cuda);
  m.impl("_layer_norm_modulate_backward", &layer_norm_modulate_backward_cuda);
  m.impl("gated_residual_layer_norm_modulate", &gated_residual_layer_norm_modulate_cuda);
  m.impl("_gated_residual_layer_norm_modulate_backward",
         &gated_residual_layer_norm_modulate_backward_cuda);
}

}  // namespace adaptiveload
