// ferry — how the device hash kernel splits content_hash over its grid: the loop
// each thread runs, written once for the kernel (kernels.cu, where it is
// __host__ __device__) and for the host test that runs every thread of a grid on
// the CPU (tests/cuda/hash_grid_test.cpp). Only the loads and the block reduction
// (a sum of one value per thread) are the kernel's own.
//
// content_hash is a sum of hash_word terms (ferry/content.hpp), so the kernel is
// right when every word is summed by exactly one thread: thread t of T takes the
// 16-byte vectors t, t + T, ... (two words each) when the source is 16-byte
// aligned, thread 0 also the words past the last whole vector; otherwise thread t
// takes words t, t + T, ..., as 8-byte loads when the source is 8-byte aligned
// (the last, partial word byte by byte), else byte by byte.
//
// This header includes no CUDA header.
#pragma once

#include <cstdint>

#include "ferry/content.hpp"

#if defined(__CUDA_ARCH__)
#define FERRY_UNROLL _Pragma("unroll")
#else
#define FERRY_UNROLL
#endif

namespace ferry::cuda_detail {

inline constexpr unsigned kHashBlock = 256;           // threads per block
inline constexpr std::uint64_t kHashMaxBlocks = 2048;  // H200: 132 SMs x 8 resident blocks, twice over
inline constexpr unsigned kHashLoads = 4;              // 16-byte loads a thread keeps in flight

// Blocks (and device scratch words, one partial sum each) for `bytes`: one vector
// per thread up to the cap, grid-stride beyond it; at least one.
FERRY_HOST_DEVICE constexpr std::uint64_t hash_block_count(std::uint64_t bytes) noexcept {
  const std::uint64_t per_block = 16 * kHashBlock;
  const std::uint64_t blocks = bytes / per_block + (bytes % per_block != 0);  // no overflow near 2^64
  return blocks < 1 ? 1 : (blocks > kHashMaxBlocks ? kHashMaxBlocks : blocks);
}

// Word j of src[0, bytes), zero-padded: single-byte loads, any alignment.
FERRY_HOST_DEVICE inline std::uint64_t word_by_bytes(const unsigned char* src, std::uint64_t bytes,
                                                     std::uint64_t j) noexcept {
  std::uint64_t w = 0;
  for (std::uint64_t i = 0; i < 8 && 8 * j + i < bytes; ++i) {
    w |= static_cast<std::uint64_t>(src[8 * j + i]) << (8 * i);
  }
  return w;
}

// How the kernel reads a source, by its alignment.
enum class HashLoads { bytes, words, vectors };

FERRY_HOST_DEVICE inline HashLoads hash_loads_for(const void* src) noexcept {
  const auto at = reinterpret_cast<std::uintptr_t>(src);
  return at % 16 == 0 ? HashLoads::vectors : (at % 8 == 0 ? HashLoads::words : HashLoads::bytes);
}

struct WordPair {
  std::uint64_t lo;  // word 2p
  std::uint64_t hi;  // word 2p + 1
};

// Thread `first`'s share of the sum, in a grid of `stride` threads, reading src as
// `loads` says (hash_loads_for(src)). load_vector(p) returns 16-byte vector p of src
// (used only for HashLoads::vectors), load_word(j) whole word j (only for words).
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class LoadVector, class LoadWord>
FERRY_HOST_DEVICE std::uint64_t grid_thread_sum(const unsigned char* src, std::uint64_t bytes, HashLoads loads,
                                                std::uint64_t first, std::uint64_t stride,
                                                const LoadVector& load_vector, const LoadWord& load_word) {
  const std::uint64_t words = (bytes + 7) / 8;
  std::uint64_t sum = 0;
  if (loads == HashLoads::bytes) {
    for (std::uint64_t j = first; j < words; j += stride) sum += hash_word(word_by_bytes(src, bytes, j), j);
    return sum;
  }
  if (loads == HashLoads::words) {
    const std::uint64_t whole = bytes / 8;
    std::uint64_t j = first;
    for (; j < whole; j += stride) sum += hash_word(load_word(j), j);
    if (j < words) sum += hash_word(word_by_bytes(src, bytes, j), j);  // the partial last word
    return sum;
  }
  const std::uint64_t count = bytes / 16;  // whole vectors
  std::uint64_t p = first;
  // kHashLoads loads issued before any is used, so their latencies overlap.
  for (; p + (kHashLoads - 1) * stride < count; p += kHashLoads * stride) {
    WordPair x[kHashLoads];
    FERRY_UNROLL for (unsigned i = 0; i < kHashLoads; ++i) x[i] = load_vector(p + i * stride);
    FERRY_UNROLL for (unsigned i = 0; i < kHashLoads; ++i) {
      const std::uint64_t j = 2 * (p + i * stride);
      sum += hash_word(x[i].lo, j) + hash_word(x[i].hi, j + 1);
    }
  }
  for (; p < count; p += stride) {
    const WordPair x = load_vector(p);
    sum += hash_word(x.lo, 2 * p) + hash_word(x.hi, 2 * p + 1);
  }
  if (first == 0) {
    for (std::uint64_t j = 2 * count; j < words; ++j) sum += hash_word(word_by_bytes(src, bytes, j), j);
  }
  return sum;
}

}  // namespace ferry::cuda_detail
