// ferry — the device the CUDA backend works on, made current for one call and given back.
#pragma once

#include <cuda_runtime_api.h>

namespace ferry::cuda_detail {

// Makes `device` (its primary context) current on the calling thread for the scope's
// life, then makes the caller's device current again: a program on cuda:0 that frees
// a cuda:1 block through ferry stays on cuda:0. Every public entry of the backend
// holds one. Never fails: a failed cudaSetDevice shows in the call the scope guards.
class DeviceScope {
 public:
  explicit DeviceScope(int device) noexcept : device_(device) {
    if (cudaGetDevice(&saved_) != cudaSuccess) {
      (void)cudaGetLastError();
      saved_ = device;  // nothing to give back
    }
    (void)cudaSetDevice(device);  // even when current: a driver-made context may be
  }
  ~DeviceScope() {
    if (saved_ != device_) (void)cudaSetDevice(saved_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int device_;
  int saved_ = 0;
};

}  // namespace ferry::cuda_detail
