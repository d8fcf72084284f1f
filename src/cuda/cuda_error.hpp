// ferry — CUDA runtime errors as ferry Errors.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "ferry/result.hpp"

namespace ferry::cuda_detail {

// "cudaErrorInvalidValue: invalid argument"
inline std::string describe(cudaError_t err) {
  return std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
}

// Memory exhaustion becomes out_of_memory, everything else backend_error. The
// runtime's last-error slot is cleared so that a reported failure does not resurface
// in an unrelated later call (sticky device faults stay, as they must).
inline Error cuda_error(cudaError_t err, const std::string& what) {
  (void)cudaGetLastError();
  const ErrorCode code =
      err == cudaErrorMemoryAllocation ? ErrorCode::out_of_memory : ErrorCode::backend_error;
  return make_error(code, what + " failed: " + describe(err));
}

}  // namespace ferry::cuda_detail
