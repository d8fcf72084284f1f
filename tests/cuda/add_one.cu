// A program's own kernel, as an inference engine would bring it: adds 1 to every byte.
#include <cuda_runtime_api.h>

#include <cstddef>

#include "add_one.hpp"

namespace {

__global__ void add_one_kernel(unsigned char* p, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    p[i] = static_cast<unsigned char>(p[i] + 1);
  }
}

}  // namespace

int launch_add_one(void* bytes, std::size_t n, void* stream) {
  if (n == 0) return 0;
  add_one_kernel<<<256, 256, 0, static_cast<cudaStream_t>(stream)>>>(static_cast<unsigned char*>(bytes), n);
  return static_cast<int>(cudaGetLastError());
}
