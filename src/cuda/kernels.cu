// ferry — fill, content-hash and mix kernels; bit-identical to the definitions in
// ferry/content.hpp, whose word functions they call.
#include "cuda/kernels.hpp"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <string>

#include "cuda/driver_api.hpp"
#include "cuda/hash_grid.hpp"
#include "ferry/content.hpp"

namespace ferry::cuda_detail {
namespace {

constexpr unsigned kFillBlock = 256;
constexpr std::uint64_t kFillMaxBlocks = 4096;  // grid-stride beyond this; saturates any GPU
constexpr unsigned kWarp = 32;
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
    std::uint64_t v = splitmix64(seed + w);
    if constexpr (kPattern == Pattern::small_bf16) v = small_bf16_word(v);
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

// The block's sum, in thread 0. Every thread of the block must call it, and the
// block must have kHashBlock threads (the kernels' __launch_bounds__).
__device__ std::uint64_t block_sum(std::uint64_t v) {
  __shared__ std::uint64_t warp_sums[kHashBlock / kWarp];
  for (unsigned d = kWarp / 2; d > 0; d /= 2) {
    v += __shfl_down_sync(kFullWarp, static_cast<unsigned long long>(v), d);
  }
  if (threadIdx.x % kWarp == 0) warp_sums[threadIdx.x / kWarp] = v;
  __syncthreads();
  std::uint64_t total = 0;
  if (threadIdx.x == 0) {
    for (unsigned w = 0; w < kHashBlock / kWarp; ++w) total += warp_sums[w];
  }
  return total;
}

// 16-byte vector p of a 16-byte aligned source, through the read-only cache.
struct LdgVector {
  const ulonglong2* v;
  __device__ WordPair operator()(std::uint64_t p) const {
    const ulonglong2 x = __ldg(v + p);
    return WordPair{x.x, x.y};
  }
};

// 8-byte word j of an 8-byte aligned source, through the read-only cache.
struct LdgWord {
  const unsigned long long* w;
  __device__ std::uint64_t operator()(std::uint64_t j) const { return __ldg(w + j); }
};

// partials[blockIdx.x] = this block's share of the content_hash sum; which thread
// takes which word is hash_grid.hpp's. Launched with kHashBlock threads (block_sum).
__global__ void __launch_bounds__(kHashBlock)
    hash_sum_kernel(const unsigned char* src, std::uint64_t bytes, HashLoads loads, std::uint64_t* partials) {
  const std::uint64_t first = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  const LdgVector load_vector{reinterpret_cast<const ulonglong2*>(src)};
  const LdgWord load_word{reinterpret_cast<const unsigned long long*>(src)};
  const std::uint64_t total =
      block_sum(grid_thread_sum(src, bytes, loads, first, stride, load_vector, load_word));
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

// *out = hash_finish(sum of partials[0, count), bytes). One block of kHashBlock threads.
__global__ void __launch_bounds__(kHashBlock) hash_finish_kernel(const std::uint64_t* partials, unsigned count,
                                   std::uint64_t bytes, std::uint64_t* out) {
  std::uint64_t sum = 0;
  for (unsigned i = threadIdx.x; i < count; i += blockDim.x) sum += partials[i];
  const std::uint64_t total = block_sum(sum);
  if (threadIdx.x == 0) *out = hash_finish(total, bytes);
}

__global__ void mix_seed_kernel(const std::uint64_t* hashes, std::uint64_t count,
                                std::uint64_t* seed_out) {
  std::uint64_t acc = kMixStart;
  for (std::uint64_t k = 0; k < count; ++k) acc = mix_step(acc, k, hashes[k]);
  *seed_out = acc;
}

bool aligned_to(const void* p, std::uintptr_t n) { return reinterpret_cast<std::uintptr_t>(p) % n == 0; }

// Every kernel of this file: what load_kernels loads.
std::array<const void*, 5> all_kernels() noexcept {
  return {reinterpret_cast<const void*>(&fill_kernel<Pattern::bytes>),
          reinterpret_cast<const void*>(&fill_kernel<Pattern::small_bf16>),
          reinterpret_cast<const void*>(&hash_sum_kernel), reinterpret_cast<const void*>(&hash_finish_kernel),
          reinterpret_cast<const void*>(&mix_seed_kernel)};
}

}  // namespace

cudaError_t load_kernels() noexcept {
  for (const void* kernel : all_kernels()) {
    cudaFuncAttributes attributes{};
    if (const cudaError_t e = cudaFuncGetAttributes(&attributes, kernel); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t count_unloaded_kernels(int& unloaded) noexcept {
  unloaded = 0;
  std::string why;
  void* fn = driver_entry_point("cuFuncIsLoaded", why, 12040);
  if (fn == nullptr) return cudaErrorNotSupported;  // a driver before 12.4
  cudaError_t e = cudaSuccess;
  const auto is_loaded = reinterpret_cast<PFN_cuFuncIsLoaded_v12040>(fn);
  for (const void* kernel : all_kernels()) {
    cudaFunction_t function = nullptr;
    if ((e = cudaGetFuncBySymbol(&function, kernel)) != cudaSuccess) return e;
    CUfunctionLoadingState state = CU_FUNCTION_LOADING_STATE_UNLOADED;
    if (is_loaded(&state, reinterpret_cast<CUfunction>(function)) != CUDA_SUCCESS) return cudaErrorUnknown;
    if (state != CU_FUNCTION_LOADING_STATE_LOADED) ++unloaded;
  }
  return cudaSuccess;
}

cudaError_t launch_fill(void* dst, std::uint64_t bytes, Pattern pattern, std::uint64_t seed,
                        const std::uint64_t* device_seed, cudaStream_t stream) noexcept {
  if (bytes == 0) return cudaSuccess;
  auto* out = static_cast<unsigned char*>(dst);
  bool aligned = aligned_to(dst, 8);
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

cudaError_t launch_content_hash(const void* src, std::uint64_t bytes, std::uint64_t* partials,
                                std::uint64_t* device_out, cudaStream_t stream) noexcept {
  const auto* in = static_cast<const unsigned char*>(src);
  auto blocks = static_cast<unsigned>(hash_block_count(bytes));
  HashLoads loads = hash_loads_for(src);
  void* sum_args[] = {&in, &bytes, &loads, &partials};
  const cudaError_t e = cudaLaunchKernel(reinterpret_cast<const void*>(&hash_sum_kernel), dim3(blocks),
                                         dim3(kHashBlock), sum_args, 0, stream);
  if (e != cudaSuccess) return e;
  const std::uint64_t* sums = partials;
  void* finish_args[] = {&sums, &blocks, &bytes, &device_out};
  return cudaLaunchKernel(reinterpret_cast<const void*>(&hash_finish_kernel), dim3(1), dim3(kHashBlock),
                          finish_args, 0, stream);
}

cudaError_t launch_mix_seed(const std::uint64_t* hashes, std::uint64_t count,
                            std::uint64_t* device_seed, cudaStream_t stream) noexcept {
  void* args[] = {&hashes, &count, &device_seed};
  return cudaLaunchKernel(reinterpret_cast<const void*>(&mix_seed_kernel), dim3(1), dim3(1), args,
                          0, stream);
}

}  // namespace ferry::cuda_detail
