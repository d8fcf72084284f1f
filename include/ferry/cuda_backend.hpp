// ferry — the CUDA backend factory.
//
// Built when the CUDA toolkit is found (FERRY_CUDA=AUTO|ON|OFF). The driver is
// reached lazily, so binaries start on machines without a GPU or driver; there
// make_cuda_backend() answers `unsupported` with a plain sentence.
#pragma once

#include <memory>

#include "ferry/api.hpp"
#include "ferry/backend.hpp"

namespace ferry FERRY_API {

struct CudaOptions {
  int device = 0;
};

// True when this build contains the CUDA backend.
bool cuda_backend_built() noexcept;

// Errors: unsupported (not built, no driver, no device), backend_error.
Result<std::unique_ptr<Backend>> make_cuda_backend(const CudaOptions& options);

}  // namespace ferry
