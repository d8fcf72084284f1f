// The device hash's split of the work, run on the host: src/cuda/hash_grid.hpp is
// the loop every thread of the CUDA hash kernel executes (there as a __host__
// __device__ template), so running each thread of a grid here and adding their
// sums, as the kernel's block reduction and finish kernel do, proves the kernel's
// arithmetic and indexing without a GPU. Only its loads and the reduction tree are
// left to a device run (cuda_backend_test).
#include "cuda/hash_grid.hpp"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <vector>

#include "ferry/content.hpp"

namespace ferry::cuda_detail {
namespace {

// What the kernel computes for [src, src + bytes) on a grid of `threads` threads.
// Every load is counted, so a test can see which path ran.
struct Loads {
  std::uint64_t vectors = 0;
  std::uint64_t words = 0;
};

std::uint64_t grid_hash(const unsigned char* src, std::uint64_t bytes, std::uint64_t threads,
                        Loads* loads = nullptr) {
  Loads counted;
  const auto load_vector = [src, &counted](std::uint64_t p) {
    ++counted.vectors;
    WordPair x{};
    std::memcpy(&x.lo, src + 16 * p, 8);
    std::memcpy(&x.hi, src + 16 * p + 8, 8);
    return x;
  };
  const auto load_word = [src, &counted](std::uint64_t j) {
    ++counted.words;
    std::uint64_t w = 0;
    std::memcpy(&w, src + 8 * j, 8);
    return w;
  };
  const HashLoads path = hash_loads_for(src);
  std::uint64_t sum = 0;
  for (std::uint64_t t = 0; t < threads; ++t) {
    sum += grid_thread_sum(src, bytes, path, t, threads, load_vector, load_word);
  }
  if (loads != nullptr) *loads = counted;
  return hash_finish(sum, bytes);
}

std::vector<unsigned char> data(std::size_t n) {
  std::vector<unsigned char> v(n + 16);
  fill_pattern(3, 0, std::as_writable_bytes(std::span(v)));
  return v;
}

TEST(CudaHashGrid, EveryGridShapeAndAlignmentGivesContentHash) {
  const auto buffer = data((1u << 20) + 64);
  // The vector start is 16-byte aligned (the vector path), 8 bytes past it (the word
  // path) or 1 (the byte path); lengths cover empty, tails of every size and whole vectors.
  const auto* base = buffer.data() + (16 - reinterpret_cast<std::uintptr_t>(buffer.data()) % 16) % 16;
  for (const std::uint64_t shift : {0u, 1u, 8u}) {
    const unsigned char* src = base + shift;
    for (const std::uint64_t n : {0ull, 1ull, 7ull, 8ull, 15ull, 16ull, 17ull, 24ull, 31ull, 33ull,
                                  4096ull + 5, 65536ull, (1ull << 20) + 3}) {
      const std::uint64_t want =
          content_hash(std::span(reinterpret_cast<const std::byte*>(src), static_cast<std::size_t>(n)));
      for (const std::uint64_t threads :
           std::initializer_list<std::uint64_t>{1, 3, 32, 1000, hash_block_count(n) * kHashBlock}) {
        EXPECT_EQ(grid_hash(src, n, threads), want) << "shift " << shift << ", " << n << " bytes, "
                                                     << threads << " threads";
      }
    }
  }
}

TEST(CudaHashGrid, AnEightByteAlignedSourceIsReadInWholeWords) {
  const auto buffer = data(4096 + 64);
  const auto* base = buffer.data() + (16 - reinterpret_cast<std::uintptr_t>(buffer.data()) % 16) % 16;
  EXPECT_EQ(hash_loads_for(base), HashLoads::vectors);
  EXPECT_EQ(hash_loads_for(base + 8), HashLoads::words);
  EXPECT_EQ(hash_loads_for(base + 4), HashLoads::bytes);
  for (const std::uint64_t n : {4096ull, 4096ull + 5}) {
    Loads loads;
    const std::uint64_t want =
        content_hash(std::span(reinterpret_cast<const std::byte*>(base + 8), static_cast<std::size_t>(n)));
    EXPECT_EQ(grid_hash(base + 8, n, 1000, &loads), want) << n << " bytes";
    EXPECT_EQ(loads.words, n / 8) << "every whole word one 8-byte load, the partial one by bytes";
    EXPECT_EQ(loads.vectors, 0u);
  }
}

TEST(CudaHashGrid, TheLargestGridAlsoLoopsAndSumsToContentHash) {
  // 64 MiB on the capped grid: every thread takes several vectors, kHashLoads at a time.
  std::vector<std::byte> v(64u << 20);
  fill_pattern(9, 0, v);
  const std::uint64_t threads = hash_block_count(v.size()) * kHashBlock;
  ASSERT_GT(v.size() / 16, kHashLoads * threads);
  const auto* src = reinterpret_cast<const unsigned char*>(v.data());
  ASSERT_EQ(reinterpret_cast<std::uintptr_t>(src) % 16, 0u);
  EXPECT_EQ(grid_hash(src, v.size(), threads), content_hash(v));
}

TEST(CudaHashGrid, BlockCountOneVectorPerThreadUpToTheCap) {
  EXPECT_EQ(hash_block_count(0), 1u);
  EXPECT_EQ(hash_block_count(1), 1u);
  EXPECT_EQ(hash_block_count(16 * kHashBlock), 1u);
  EXPECT_EQ(hash_block_count(16 * kHashBlock + 1), 2u);
  EXPECT_EQ(hash_block_count(1u << 20), 256u);  // 1 MiB: 256 blocks, two per SM of an H200
  EXPECT_EQ(hash_block_count(64u << 20), kHashMaxBlocks);
  EXPECT_EQ(hash_block_count(~0ull), kHashMaxBlocks);
}

}  // namespace
}  // namespace ferry::cuda_detail
