// ferry — cuBLAS handles per native stream and the GEMM the user kernel enqueues
// (cublas_gemm.hpp).
#include "cuda/cublas_gemm.hpp"

#include <cuda_runtime_api.h>

#include <mutex>
#include <string>

#include "core/text.hpp"
#include "cuda/cublas_api.hpp"
#include "cuda/cuda_backend.hpp"

namespace ferry::cuda_detail {

Result<CublasGemm> prepare_cublas(Backend& backend, NativeStream stream) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend.innermost());
  if (cuda == nullptr) {
    return make_error(ErrorCode::unsupported,
                      "no CudaBackend behind this backend (an adaptor must derive from ForwardingBackend)");
  }
  FERRY_TRY(cuda->prepare_cublas(static_cast<cudaStream_t>(stream)));
  return CublasGemm(cuda);
}

Result<void> CublasGemm::run(NativeStream stream, const CublasGemmArgs& g) const {
  const cublasHandle_t handle = backend_->cublas_handle(static_cast<cudaStream_t>(stream));
  std::string why;
  const CublasApi* cublas = cublas_api(why);  // loaded already where a handle exists: no load here
  if (handle == nullptr || cublas == nullptr) {
    return make_error(ErrorCode::backend_error, "cublasGemmEx on native stream " + text::hex(stream) +
                                                    ": no cuBLAS handle for it (made at enqueue by prepare_cublas; "
                                                    "the stream was released since?)");
  }
  const auto m = static_cast<int>(g.m);
  const auto n = static_cast<int>(g.n);
  const auto k = static_cast<int>(g.k);
  // cuBLAS is column-major, and a row-major r x c matrix is the column-major c x r
  // matrix of the same bytes (its transpose, leading dimension c). So row-major
  // C = op(A) op(B) is column-major C^T (n x m, ldc n) = op(B)^T op(A)^T:
  //   B stored k x n: its column-major view is B^T = op(B)^T        -> N, ldb n
  //   B stored n x k (trans_b): view is (n x k)^T, op(B)^T = B      -> T, ldb k
  //   A stored m x k: view is A^T = op(A)^T                         -> N, lda k
  //   A stored k x m (trans_a): view is (k x m)^T, op(A)^T = A      -> T, lda m
  const cublasOperation_t op_b = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int ldb = g.trans_b ? k : n;
  const int lda = g.trans_a ? m : k;
  const float alpha = 1.0f;
  const float beta = 0.0f;
  // COMPUTE_32F (not a _FAST_ mode): bf16 products summed in FP32, as gemm.hpp says.
  const cublasStatus_t status =
      cublas->gemm_ex(handle, op_b, op_a, n, m, k, &alpha, device_ptr(g.b), CUDA_R_16BF, ldb, device_ptr(g.a),
                      CUDA_R_16BF, lda, &beta, device_ptr(g.c), CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                      CUBLAS_GEMM_DEFAULT);
  if (status != CUBLAS_STATUS_SUCCESS) {
    return make_error(ErrorCode::backend_error, "cublasGemmEx of " + std::to_string(g.m) + " x " +
                                                    std::to_string(g.n) + " x " + std::to_string(g.k) +
                                                    " failed: " + cublas->describe(status));
  }
  return {};
}

cublasHandle_t CudaBackend::cublas_handle(cudaStream_t native) const {
  std::lock_guard lock(cublas_handles_mu_);
  const auto it = cublas_handles_.find(native);
  return it == cublas_handles_.end() ? nullptr : it->second;
}

Result<void> CudaBackend::prepare_cublas(cudaStream_t native) {
  if (cublas_handle(native) != nullptr) return {};
  std::lock_guard making(cublas_mu_);
  if (cublas_handle(native) != nullptr) return {};  // another thread made it meanwhile
  std::string why;
  const CublasApi* cublas = cublas_api(why);
  if (cublas == nullptr) return make_error(ErrorCode::unsupported, why);
  const DeviceScope bound = bind();
  cublasHandle_t handle = nullptr;
  cublasStatus_t status = cublas->create(&handle);
  if (status != CUBLAS_STATUS_SUCCESS) {
    return make_error(ErrorCode::backend_error, "cublasCreate for native stream " + text::hex(native) +
                                                    " failed: " + cublas->describe(status));
  }
  // Partial sums stay FP32 even when cuBLAS splits k: the result is rounded to
  // bf16 once, as gemm.hpp defines it.
  status = cublas->set_math_mode(handle, static_cast<cublasMath_t>(
                                             CUBLAS_DEFAULT_MATH |
                                             CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
  Result<void> result;
  if (status != CUBLAS_STATUS_SUCCESS) {
    result = make_error(ErrorCode::backend_error, "cublasSetMathMode failed: " + cublas->describe(status));
  } else {
    // Under mu_, so that the stream cannot be detached (detach_resources) between
    // this check and the insertion: no handle outlives its stream's binding.
    std::lock_guard lock(mu_);
    bool ours = false;
    for (const Stream& st : streams_) ours = ours || (st.handle != nullptr && st.handle == native);
    if (fault_) {
      result = *fault_;
    } else if (!ours) {
      result = make_error(ErrorCode::invalid_argument,
                          "native stream " + text::hex(native) + " is none of this backend's streams");
    } else if (status = cublas->set_stream(handle, native); status != CUBLAS_STATUS_SUCCESS) {
      result = make_error(ErrorCode::backend_error, "cublasSetStream for native stream " + text::hex(native) +
                                                        " failed: " + cublas->describe(status));
    } else {
      std::lock_guard handles(cublas_handles_mu_);
      cublas_handles_[native] = handle;
      handle = nullptr;
    }
  }
  if (handle != nullptr) (void)cublas->destroy(handle);
  return result;
}

}  // namespace ferry::cuda_detail
