// The CUDA backend factory in builds without the CUDA toolkit.
#include "ferry/cuda_backend.hpp"

namespace ferry {

bool cuda_backend_built() noexcept { return false; }

Result<std::unique_ptr<Backend>> make_cuda_backend(const CudaOptions&) {
  return make_error(ErrorCode::unsupported,
                    "this build of ferry has no CUDA backend (configured with FERRY_CUDA=OFF "
                    "or without a CUDA toolkit)");
}

}  // namespace ferry
