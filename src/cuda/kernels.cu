// ferry — fill, content-hash and mix kernels; bit-identical to src/content.cpp.
#include "cuda/kernels.hpp"

#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/xxh64_core.hpp"
#include "ferry/content.hpp"

namespace ferry::cuda_detail {
namespace {

constexpr unsigned kFillBlock = 256;
constexpr std::uint64_t kFillMaxBlocks = 4096;  // grid-stride beyond this; saturates any GPU
constexpr unsigned kHashBlock = 128;            // 32 chunks per block, 4 threads each
constexpr unsigned kLanes = 4;
constexpr unsigned kFullWarp = 0xffffffffu;

// Both patterns are made of 8-byte words, word w a function of splitmix64(seed + w).
template <Pattern kPattern>
__global__ void fill_kernel(unsigned char* dst, std::uint64_t bytes, std::uint64_t seed,
                            const std::uint64_t* device_seed, bool aligned) {
  if (device_seed != nullptr) seed = *device_seed;
  const std::uint64_t words = (bytes + 7) / 8;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t w = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       w < words; w += stride) {
    std::uint64_t v = xxh64::splitmix64(seed + w);
    if constexpr (kPattern == Pattern::small_bf16) v = xxh64::small_bf16_word(v);
    const std::uint64_t off = w * 8;
    if (aligned && off + 8 <= bytes) {
      *reinterpret_cast<unsigned long long*>(dst + off) = v;
    } else {
      for (std::uint64_t i = 0; i < 8 && off + i < bytes; ++i) {
        dst[off + i] = static_cast<unsigned char>(v >> (8 * i));
      }
    }
  }
}

// The XXH64 of [p, p + len) with `seed`, computed by the four consecutive threads of
// a lane group; lane 0 of the group returns the hash (the others return garbage).
// Every thread of the warp must call it (the shuffles name the full warp); threads
// without a buffer pass len 0.
__device__ std::uint64_t group_hash(const unsigned char* p, std::uint64_t len, std::uint64_t seed,
                                    bool aligned) {
  const unsigned lane = threadIdx.x % kLanes;
  const std::uint64_t mine = xxh64::lane_accumulate(p, len / xxh64::kStripe, seed, lane, aligned);
  std::uint64_t v[4];
#pragma unroll
  for (unsigned t = 0; t < kLanes; ++t) {
    v[t] = __shfl_sync(kFullWarp, static_cast<unsigned long long>(mine), static_cast<int>(t),
                       static_cast<int>(kLanes));
  }
  return xxh64::from_lanes(v, p, len, seed);
}

__global__ void chunk_hash_kernel(const unsigned char* src, std::uint64_t bytes,
                                  std::uint64_t chunks, std::uint64_t* chunk_hashes,
                                  bool aligned) {
  const std::uint64_t chunk =
      (static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kLanes;
  const bool active = chunk < chunks;
  const unsigned char* p = src;
  std::uint64_t len = 0;
  if (active) {
    p = src + chunk * kHashChunk;
    const std::uint64_t left = bytes - chunk * kHashChunk;
    len = left < kHashChunk ? left : kHashChunk;
  }
  const std::uint64_t h = group_hash(p, len, chunk, aligned);
  if (active && threadIdx.x % kLanes == 0) chunk_hashes[chunk] = h;
}

// One warp; its first lane group hashes the array of chunk hashes.
__global__ void combine_kernel(const std::uint64_t* chunk_hashes, std::uint64_t chunks,
                               std::uint64_t total_bytes, std::uint64_t* out) {
  const bool first_group = threadIdx.x < kLanes;
  const std::uint64_t len = first_group ? chunks * 8 : 0;
  const auto* p = reinterpret_cast<const unsigned char*>(chunk_hashes);
  const std::uint64_t h = group_hash(p, len, total_bytes, true);
  if (threadIdx.x == 0) *out = h;
}

__global__ void mix_seed_kernel(const std::uint64_t* hashes, std::uint64_t count,
                                std::uint64_t* seed_out) {
  std::uint64_t acc = kMixStart;
  for (std::uint64_t k = 0; k < count; ++k) acc = xxh64::mix_step(acc, k, hashes[k]);
  *seed_out = acc;
}

bool aligned8(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 8 == 0; }

}  // namespace

std::uint64_t hash_chunk_count(std::uint64_t bytes) noexcept {
  return (bytes + kHashChunk - 1) / kHashChunk;
}

cudaError_t launch_fill(void* dst, std::uint64_t bytes, Pattern pattern, std::uint64_t seed,
                        const std::uint64_t* device_seed, cudaStream_t stream) noexcept {
  if (bytes == 0) return cudaSuccess;
  auto* out = static_cast<unsigned char*>(dst);
  bool aligned = aligned8(dst);
  const std::uint64_t words = (bytes + 7) / 8;
  const auto blocks =
      static_cast<unsigned>(std::min<std::uint64_t>((words + kFillBlock - 1) / kFillBlock,
                                                    kFillMaxBlocks));
  void* args[] = {&out, &bytes, &seed, &device_seed, &aligned};
  const void* kernel = nullptr;
  switch (pattern) {
    case Pattern::bytes: kernel = reinterpret_cast<const void*>(&fill_kernel<Pattern::bytes>); break;
    case Pattern::small_bf16:
      kernel = reinterpret_cast<const void*>(&fill_kernel<Pattern::small_bf16>);
      break;
  }
  if (kernel == nullptr) return cudaErrorInvalidValue;  // not a Pattern
  return cudaLaunchKernel(kernel, dim3(blocks), dim3(kFillBlock), args, 0, stream);
}

cudaError_t launch_content_hash(const void* src, std::uint64_t bytes, std::uint64_t* chunk_hashes,
                                std::uint64_t* device_out, cudaStream_t stream) noexcept {
  std::uint64_t chunks = hash_chunk_count(bytes);
  if (chunks > 0) {
    const auto* in = static_cast<const unsigned char*>(src);
    bool aligned = aligned8(src);
    const std::uint64_t threads = chunks * kLanes;
    const std::uint64_t blocks = (threads + kHashBlock - 1) / kHashBlock;
    if (blocks > 0x7fffffffu) return cudaErrorInvalidValue;  // > 2^31 blocks: 2^44 bytes
    void* args[] = {&in, &bytes, &chunks, &chunk_hashes, &aligned};
    const cudaError_t e =
        cudaLaunchKernel(reinterpret_cast<const void*>(&chunk_hash_kernel),
                         dim3(static_cast<unsigned>(blocks)), dim3(kHashBlock), args, 0, stream);
    if (e != cudaSuccess) return e;
  }
  const std::uint64_t* hashes = chunk_hashes;
  void* args[] = {&hashes, &chunks, &bytes, &device_out};
  return cudaLaunchKernel(reinterpret_cast<const void*>(&combine_kernel), dim3(1), dim3(32), args,
                          0, stream);
}

cudaError_t launch_mix_seed(const std::uint64_t* hashes, std::uint64_t count,
                            std::uint64_t* device_seed, cudaStream_t stream) noexcept {
  void* args[] = {&hashes, &count, &device_seed};
  return cudaLaunchKernel(reinterpret_cast<const void*>(&mix_seed_kernel), dim3(1), dim3(1), args,
                          0, stream);
}

}  // namespace ferry::cuda_detail
