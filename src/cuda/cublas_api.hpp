// ferry — the few cuBLAS calls the GEMM user op needs (cublas_gemm.hpp), loaded
// with dlopen on first use.
//
// cuBLAS is never linked: linking it costs every process start ~150 ms of
// relocation, and its ~600 MB of libraries are absent from many machines that run
// ferry without ever multiplying a matrix. The library is loaded once per process,
// by the first GEMM, and stays loaded (handles may outlive any one backend).
//
// Thread safety: cublas_api() may be called from any thread; the functions it hands
// out follow cuBLAS's own rules (a handle is used by one thread at a time).
#pragma once

#include <cublas_v2.h>

#include <string>

namespace ferry::cuda_detail {

// cublasGemmEx has a second, inline overload in C++ (a cudaDataType compute type);
// this is the exported one.
using CublasGemmExFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t,
                                          int, int, int, const void*, const void*, cudaDataType,
                                          int, const void*, cudaDataType, int, const void*, void*,
                                          cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);

struct CublasApi {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  CublasGemmExFn gemm_ex = nullptr;
  // Optional: they only improve messages.
  decltype(&cublasGetStatusName) get_status_name = nullptr;
  decltype(&cublasGetStatusString) get_status_string = nullptr;
  // The file that was loaded, and which search found it ("FERRY_CUBLAS_PATH",
  // "the loader's search path", "$CUDA_HOME/lib64", "a PyTorch wheel's DIR", ...).
  std::string path;
  std::string found_by;

  // "CUBLAS_STATUS_NOT_SUPPORTED (15): the functionality requested is not supported",
  // as much of it as the library can say.
  std::string describe(cublasStatus_t status) const;
};

// The process's cuBLAS, loaded on the first call: from FERRY_CUBLAS_PATH (a file or a
// folder), by soname through the loader, from $CUDA_HOME/lib64, from a PyTorch wheel's
// site-packages/nvidia/cu13/lib, then from the CUDA toolkit's library directory of the
// build. Null when it cannot be loaded or lacks a
// required symbol; `why` then names the library and the reason (the same text on
// every later call). Never blocks after the first call.
const CublasApi* cublas_api(std::string& why);

}  // namespace ferry::cuda_detail
