#include <cuda_runtime_api.h>

#include "accumulate.hpp"

namespace {

__global__ void accumulate_kernel(unsigned char* acc, const unsigned char* w, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    acc[i] = static_cast<unsigned char>(acc[i] + w[i]);
  }
}

}  // namespace

int launch_accumulate(void* acc, const void* w, std::size_t bytes, void* stream) {
  accumulate_kernel<<<256, 256, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<unsigned char*>(acc), static_cast<const unsigned char*>(w), bytes);
  return static_cast<int>(cudaGetLastError());
}
