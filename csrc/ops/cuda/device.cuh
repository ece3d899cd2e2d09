// The current CUDA device and its properties, the latter queried once per device (the launchers
// and the dispatch read them on every call).
#pragma once

#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>
#include <cuda_runtime.h>

#include <mutex>

namespace adaptiveload {
namespace {

// The current device and its properties, queried once per device.
inline int current_device() {
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

inline const cudaDeviceProp& device_props() {
  constexpr int kMaxDevices = 64;
  static std::once_flag once[kMaxDevices];
  static cudaDeviceProp props[kMaxDevices];
  const int device = current_device();
  TORCH_CHECK(device < kMaxDevices, "layer_norm_modulate: device index ", device, " too large");
  std::call_once(once[device],
                 [&] { C10_CUDA_CHECK(cudaGetDeviceProperties(&props[device], device)); });
  return props[device];
}

}  // namespace
}  // namespace adaptiveload
