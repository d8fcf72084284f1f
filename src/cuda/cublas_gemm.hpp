// ferry — cuBLAS GEMMs on a CudaBackend's streams, for the GEMM user operation
// (ferry/gemm.hpp, src/backends). Internal: only src/cuda and src/backends include
// it. It includes no CUDA header, so it compiles in builds without the backend
// (unavailable.cpp then answers unsupported).
//
// A cuBLAS handle is made once per native stream, at enqueue (prepare_cublas):
// creating one initializes the library on the device, far too slow for the user
// kernel, which runs under the backend's lock and must not block
// (user_kernel.hpp). The kernel then only looks the handle up and enqueues
// cublasGemmEx (CublasGemm::run). The backend owns the handles: each is
// destroyed with its stream, with the release of an adopted stream, or with the
// backend.
#pragma once

#include <cstdint>

#include "ferry/backend.hpp"
#include "ferry/result.hpp"
#include "ferry/stream.hpp"

namespace ferry::cuda_detail {

class CudaBackend;

// C = op(A) . op(B), bf16 row-major with FP32 accumulation, as gemm.hpp defines
// it, in plain numbers (the shape's type belongs to the layer above). m, n and k
// are below 2^31 (cublasGemmEx takes int); a, b and c are device addresses.
struct CublasGemmArgs {
  std::uint32_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  std::uint64_t a = 0, b = 0, c = 0;
};

// What a GEMM user op's kernel calls on cuda. Valid while its backend lives.
class CublasGemm {
 public:
  explicit CublasGemm(const CudaBackend* backend) : backend_(backend) {}
  // Enqueues the product on `stream` with its handle; never blocks, takes only
  // the handles' leaf lock. Errors: backend_error (no handle for `stream`:
  // prepare_cublas made none for it, or the stream was released since; cuBLAS
  // refused the call).
  Result<void> run(NativeStream stream, const CublasGemmArgs& g) const;

 private:
  [[maybe_unused]] const CudaBackend* backend_;  // unread where CUDA is not built (unavailable.cpp)
};

// Makes the cuBLAS handle of `stream` (a native stream of `backend`: native_stream
// or adopted) unless it has one. `backend` may be an adaptor of the CudaBackend
// (Backend::innermost). Blocks while the library loads and the handle is made;
// call it with no ferry lock held. Errors: unsupported (cuBLAS cannot be loaded:
// the loader's reason; no CudaBackend behind `backend`; no CUDA in this build),
// invalid_argument (`stream` is not one of the backend's), backend_error.
Result<CublasGemm> prepare_cublas(Backend& backend, NativeStream stream);

}  // namespace ferry::cuda_detail
