// ferry — the CUDA backend's device kernels (kernels.cu), behind plain host functions.
//
// Every launch is asynchronous on `stream` and returns the launch error; none of
// them blocks. Each kernel produces exactly the bytes content.hpp defines.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "ferry/content.hpp"

namespace ferry::cuda_detail {

// dst[0, bytes) = bytes [0, bytes) of the pattern for seed: fill_pattern(seed) or
// small_bf16(seed). When device_seed is not null the seed is read from device
// memory when the kernel runs instead (the ComputeOp output).
cudaError_t launch_fill(void* dst, std::uint64_t bytes, Pattern pattern, std::uint64_t seed,
                        const std::uint64_t* device_seed, cudaStream_t stream) noexcept;

// *device_out = content_hash(src[0, bytes)). partials is device scratch of
// hash_block_count(bytes) words (hash_grid.hpp); device_out is device memory. Two launches: a
// grid-stride pass whose blocks each write one partial sum, then one block that
// adds them and applies hash_finish.
cudaError_t launch_content_hash(const void* src, std::uint64_t bytes, std::uint64_t* partials,
                                std::uint64_t* device_out, cudaStream_t stream) noexcept;

// *device_seed = fold of mix_step(acc, k, hashes[k]) for k < count from kMixStart.
cudaError_t launch_mix_seed(const std::uint64_t* hashes, std::uint64_t count,
                            std::uint64_t* device_seed, cudaStream_t stream) noexcept;

// Loads every kernel above into the current device's context (cudaFuncGetAttributes).
// CUDA >= 12.2 loads a kernel lazily at its first launch and may wait for the device to
// go idle there; the backend calls this at start, so no first launch happens under its
// locks or inside a graph capture. Returns the first failure.
cudaError_t load_kernels() noexcept;

// How many of the kernels above are not loaded in the current device's context yet
// (cuFuncIsLoaded), into `unloaded`; cudaErrorNotSupported where the driver cannot tell.
cudaError_t count_unloaded_kernels(int& unloaded) noexcept;

}  // namespace ferry::cuda_detail
