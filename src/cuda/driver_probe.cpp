#include "cuda/driver_probe.hpp"

#include <cudaTypedefs.h>
#include <dlfcn.h>

namespace ferry::cuda_detail {

DriverProbe probe_driver(const char* library) {
  DriverProbe probe;
  void* handle = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    probe.note = std::string(library) + " does not load (" + (why != nullptr ? why : "no reason given") + ")";
    return probe;
  }
  const auto init = reinterpret_cast<PFN_cuInit_v2000>(dlsym(handle, "cuInit"));
  if (init == nullptr) {
    probe.note = std::string(library) + " has no cuInit: not a CUDA driver";
    return probe;
  }
  probe.loads = true;
  probe.init = init(0);
  const char* name = nullptr;
  const auto error_name = reinterpret_cast<PFN_cuGetErrorName_v6000>(dlsym(handle, "cuGetErrorName"));
  if (error_name == nullptr || error_name(probe.init, &name) != CUDA_SUCCESS || name == nullptr) name = "?";
  probe.note = std::string(library) + " loads; cuInit says " + name + " (" +
               std::to_string(static_cast<int>(probe.init)) + ")";
  return probe;
}

bool no_driver_or_device(cudaError_t err, const DriverProbe& probe) noexcept {
  if (err == cudaErrorNoDevice || err == cudaErrorStubLibrary) return true;
  if (!probe.loads) return true;
  // The driver answered: only "no device" or "I am the stub" is not a broken start.
  return probe.init == CUDA_ERROR_NO_DEVICE || probe.init == CUDA_ERROR_STUB_LIBRARY;
}

}  // namespace ferry::cuda_detail
