// The program's own kernel: acc[i] += w[i] (bytes, wrapping). accumulate.cu
// launches it on a CUDA stream; host_accumulate is its host reference, which the
// sim runs on the operands' bytes.
#pragma once

#include <cstddef>
#include <span>

inline void host_accumulate(std::span<std::byte> acc, std::span<const std::byte> w) {
  for (std::size_t i = 0; i < acc.size(); ++i) {
    acc[i] = static_cast<std::byte>(static_cast<unsigned char>(acc[i]) + static_cast<unsigned char>(w[i]));
  }
}

// 0, or the cudaError_t of the launch.
int launch_accumulate(void* acc, const void* w, std::size_t bytes, void* stream);
