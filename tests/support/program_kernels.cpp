#include "program_kernels.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#if FERRY_TEST_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ferry::testing {
namespace {

Result<void> on_device(const char* what, [[maybe_unused]] int err) {
#if FERRY_TEST_HAVE_CUDA
  if (err == 0) return {};
  return make_error(ErrorCode::backend_error, std::string(what) + ": " + cudaGetErrorString(static_cast<cudaError_t>(err)));
#else
  return make_error(ErrorCode::unsupported, std::string(what) + ": built without CUDA");
#endif
}

Result<void> bad_args(const char* what) { return make_error(ErrorCode::invalid_argument, what); }

}  // namespace

Result<void> copy_operand(const KernelLaunch& launch, std::size_t dst, std::size_t src) {
  if (dst >= launch.args.size() || src >= launch.args.size() ||
      launch.args[dst].bytes != launch.args[src].bytes) {
    return bad_args("copy_operand: operands missing or of different sizes");
  }
  const KernelArg& d = launch.args[dst];
  const KernelArg& s = launch.args[src];
  if (launch.stream == nullptr) {  // sim: the host views
    if (d.out.size() != d.bytes || s.in.size() != s.bytes) return bad_args("copy_operand: views not given");
    std::memcpy(d.out.data(), s.in.data(), d.bytes);
    return {};
  }
#if FERRY_TEST_HAVE_CUDA
  const cudaError_t err =
      cudaMemcpyAsync(reinterpret_cast<void*>(d.addr), reinterpret_cast<const void*>(s.addr), d.bytes,
                      cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(launch.stream));
  return on_device("cudaMemcpyAsync", static_cast<int>(err));
#else
  return on_device("copy_operand", 1);
#endif
}

Result<void> set_operand(const KernelLaunch& launch, std::size_t index, unsigned char value) {
  if (index >= launch.args.size()) return bad_args("set_operand: no such operand");
  const KernelArg& a = launch.args[index];
  if (launch.stream == nullptr) {
    if (a.out.size() != a.bytes) return bad_args("set_operand: no writable view");
    std::fill(a.out.begin(), a.out.end(), static_cast<std::byte>(value));
    return {};
  }
#if FERRY_TEST_HAVE_CUDA
  const cudaError_t err = cudaMemsetAsync(reinterpret_cast<void*>(a.addr), value, a.bytes,
                                          static_cast<cudaStream_t>(launch.stream));
  return on_device("cudaMemsetAsync", static_cast<int>(err));
#else
  return on_device("set_operand", 1);
#endif
}

}  // namespace ferry::testing
