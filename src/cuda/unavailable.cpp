// The CUDA backend factory and its GEMM hooks in builds without the CUDA toolkit.
#include "cuda/cublas_gemm.hpp"
#include "ferry/cuda_backend.hpp"

namespace ferry {

bool cuda_backend_built() noexcept { return false; }

int cuda_device_count() noexcept { return 0; }

Result<std::unique_ptr<Backend>> make_cuda_backend(const CudaOptions&) {
  return make_error(ErrorCode::unsupported,
                    "this build of ferry has no CUDA backend (configured with FERRY_CUDA=OFF "
                    "or without a CUDA toolkit)");
}

Result<CublasLocation> locate_cublas() {
  return make_error(ErrorCode::unsupported, "this build of ferry has no CUDA backend, hence no cuBLAS");
}

}  // namespace ferry

namespace ferry::cuda_detail {

Result<CublasGemm> prepare_cublas(Backend&, NativeStream) {
  return make_error(ErrorCode::unsupported, "this build of ferry has no CUDA backend, hence no cuBLAS");
}

Result<void> CublasGemm::run(NativeStream, const CublasGemmArgs&) const {
  return make_error(ErrorCode::unsupported, "this build of ferry has no CUDA backend, hence no cuBLAS");
}

}  // namespace ferry::cuda_detail
