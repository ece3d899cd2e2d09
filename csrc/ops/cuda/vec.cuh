// Element kinds, 16-byte vectors of raw bits in registers, and their loads, stores and
// conversions; the row map of broadcast operands; asynchronous global-to-shared copies.
// Device code shared by the forward and backward kernels (fwd_kernels.cuh, bwd_kernels.cuh).
#pragma once

// Note: no ATen here: the kernel sources (tuned_*.cu) include only these light headers, which
// keeps each of their device passes seconds instead of a minute of parsing ATen.
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace adaptiveload {

// Dtype codes for tensors whose dtype is only known at run time (modulation, weight, y, dy).
// The branch on them is uniform across the block.
enum Kind : int { kF32 = 0, kBF16 = 1, kF16 = 2 };

// The row map of a broadcast operand (RowMap, see layer_norm_modulate.h) as kernels read it.
struct DeviceRowMap {
  int64_t inner, outer_stride, inner_stride;
  __device__ __forceinline__ int64_t operator()(int64_t r) const {
    return (r / inner) * outer_stride + (r % inner) * inner_stride;
  }
};

struct ModArg {
  const void* ptr = nullptr;
  int kind = kF32;
  DeviceRowMap map{1, 0, 0};
};

namespace {

template <typename T>
struct KindOf;
template <>
struct KindOf<float> {
  static constexpr int value = kF32;
};
template <>
struct KindOf<c10::BFloat16> {
  static constexpr int value = kBF16;
};
template <>
struct KindOf<c10::Half> {
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

}  // namespace
}  // namespace adaptiveload
