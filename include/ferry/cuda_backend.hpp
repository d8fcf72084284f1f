// ferry — the CUDA backend factory.
//
// Built when the CUDA toolkit is found (FERRY_CUDA=AUTO|ON|OFF). The driver is
// reached lazily, so binaries start on machines without a GPU or driver; there
// make_cuda_backend() answers `unsupported` with a plain sentence.
#pragma once

#include <memory>
#include <string>

#include "ferry/api.hpp"
#include "ferry/backend.hpp"

namespace ferry FERRY_API {

struct CudaOptions {
  int device = 0;
};

// True when this build contains the CUDA backend.
bool cuda_backend_built() noexcept;

// The CUDA devices this process sees (cudaGetDeviceCount): 0 without a driver,
// a device or the toolkit. Blocks while the driver initializes.
int cuda_device_count() noexcept;

// Errors: unsupported (not built, no driver, no device: libcuda.so.1 does not load, is
// the stub, or its cuInit finds no device), backend_error (a driver that is there and
// cannot start CUDA; the backend's kernels do not load on the device). The backend's
// kernels are loaded before it is returned. Every call into it, and this one, leaves the
// calling thread's current CUDA device as it found it.
Result<std::unique_ptr<Backend>> make_cuda_backend(const CudaOptions& options);

// Where this process's cuBLAS came from (the GEMM user op loads it on first use).
struct CublasLocation {
  std::string path;      // the file loaded
  std::string found_by;  // "FERRY_CUBLAS_PATH", "the loader's search path", "$CUDA_HOME/lib64", ...
};
// Loads cuBLAS unless it is loaded already (once per process; the first call may take
// a few hundred ms), searching FERRY_CUBLAS_PATH (a file or a folder), the loader's
// path, $CUDA_HOME/lib64, a PyTorch wheel's site-packages/nvidia/cu13/lib, then the
// toolkit of the build. Errors: unsupported (not built, or not found: the message
// names every place tried). Any thread.
Result<CublasLocation> locate_cublas();

}  // namespace ferry
