// ferry — whether the NVIDIA driver is on this machine, asked of the driver itself.
//
// A CUDA start-up failure is "no driver or no device here" (make_cuda_backend answers
// unsupported: GPU tests skip) or "a driver that cannot start CUDA" (backend_error: a
// machine with a GPU must not skip its GPU tests). A sandboxed container may lack
// /proc/driver/nvidia on a working machine, so the driver decides: libcuda.so.1 loads
// and cuInit answers.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <string>

namespace ferry::cuda_detail {

inline constexpr const char* kDriverSoname = "libcuda.so.1";

struct DriverProbe {
  bool loads = false;                           // the library loaded and has cuInit
  CUresult init = CUDA_ERROR_NOT_INITIALIZED;   // cuInit(0), when it loaded
  std::string note;                             // what the probe saw, for messages
};

// Loads `library` (kept loaded: the CUDA runtime uses the same one) and calls cuInit(0).
// Never fails; a library that does not load says so in `note`.
DriverProbe probe_driver(const char* library = kDriverSoname);

// Whether the runtime's start-up failure `err`, with the driver as `probe` found it,
// means no driver or no device on this machine (rather than a driver that is there and
// cannot start CUDA).
bool no_driver_or_device(cudaError_t err, const DriverProbe& probe) noexcept;

}  // namespace ferry::cuda_detail
