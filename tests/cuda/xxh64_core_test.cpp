// The device hash's arithmetic, run on the host: src/cuda/xxh64_core.hpp is the code
// the CUDA kernels execute (there as __host__ __device__ functions), so checking it
// against libxxhash here proves the device hash without a GPU.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <vector>

#include "cuda/xxh64_core.hpp"
#include "ferry/content.hpp"

namespace ferry {
namespace {

namespace x = cuda_detail::xxh64;

std::vector<unsigned char> bytes(std::size_t n, std::uint64_t seed) {
  std::vector<unsigned char> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<unsigned char>(splitmix64(seed + i) >> 17);
  return v;
}

TEST(CudaXxh64Core, MatchesLibxxhashForEveryLengthUpTo1KiB) {
  const auto data = bytes(1024, 1);
  for (std::size_t len = 0; len <= data.size(); ++len) {
    for (const std::uint64_t seed : {0ull, 1ull, 0x9E3779B185EBCA87ull, ~0ull,
                                     static_cast<unsigned long long>(len)}) {
      ASSERT_EQ(x::hash(data.data(), len, seed), XXH64(data.data(), len, seed))
          << "len " << len << " seed " << seed;
    }
  }
}

TEST(CudaXxh64Core, MatchesLibxxhashAtUnalignedStarts) {
  const auto data = bytes(4096 + 16, 2);
  for (std::size_t offset = 0; offset < 16; ++offset) {
    for (const std::size_t len : {0u, 3u, 31u, 32u, 33u, 255u, 256u, 4000u}) {
      EXPECT_EQ(x::hash(data.data() + offset, len, 7), XXH64(data.data() + offset, len, 7))
          << "offset " << offset << " len " << len;
    }
  }
}

TEST(CudaXxh64Core, MatchesLibxxhashOnLargeBuffers) {
  const auto data = bytes((1u << 20) + 13, 3);
  EXPECT_EQ(x::hash(data.data(), data.size(), 0), XXH64(data.data(), data.size(), 0));
  EXPECT_EQ(x::hash(data.data(), 1u << 20, 99, true), XXH64(data.data(), 1u << 20, 99));
}

// The four lanes computed apart, as four device threads do, then joined.
TEST(CudaXxh64Core, LanesComputedSeparatelyJoinToXxh64) {
  const auto data = bytes(kHashChunk, 4);
  for (const std::size_t len : {0u, 31u, 32u, 64u + 5u, 4096u, static_cast<unsigned>(kHashChunk)}) {
    const std::uint64_t seed = 12345;
    std::uint64_t v[4];
    for (unsigned lane = 0; lane < 4; ++lane) {
      v[lane] = x::lane_accumulate(data.data(), len / x::kStripe, seed, lane, false);
    }
    EXPECT_EQ(x::from_lanes(v, data.data(), len, seed), XXH64(data.data(), len, seed)) << len;
  }
}

// The device's scheme end to end: per-chunk hashes (seed = chunk index), then the
// hash of their array (seed = total length) — content.hpp's content_hash.
std::uint64_t device_scheme(const unsigned char* p, std::uint64_t n) {
  const std::uint64_t chunks = (n + kHashChunk - 1) / kHashChunk;
  std::vector<std::uint64_t> h(chunks);
  for (std::uint64_t j = 0; j < chunks; ++j) {
    const std::uint64_t len = std::min(kHashChunk, n - j * kHashChunk);
    std::uint64_t v[4];
    for (unsigned lane = 0; lane < 4; ++lane) {
      v[lane] = x::lane_accumulate(p + j * kHashChunk, len / x::kStripe, j, lane, false);
    }
    h[j] = x::from_lanes(v, p + j * kHashChunk, len, j);
  }
  return x::hash(h.data(), 8 * chunks, n, true);
}

TEST(CudaXxh64Core, ChunkedSchemeEqualsContentHash) {
  const auto data = bytes(3 * kHashChunk + 100, 5);
  for (const std::uint64_t n : std::initializer_list<std::uint64_t>{
           0, 1, 31, 32, 65535, 65536, 65537, 2 * kHashChunk, 3 * kHashChunk + 100}) {
    const std::span<const std::byte> span(reinterpret_cast<const std::byte*>(data.data()), n);
    EXPECT_EQ(device_scheme(data.data(), n), content_hash(span)) << n;
  }
}

TEST(CudaXxh64Core, MixAndFillAgreeWithContentDefinitions) {
  for (std::uint64_t v : {0ull, 1ull, 0xdeadbeefull, ~0ull}) {
    EXPECT_EQ(x::splitmix64(v), splitmix64(v));
    EXPECT_EQ(x::mix_step(kMixStart, v, v * 3), mix_step(kMixStart, v, v * 3));
  }
  // The fill kernel writes word w of fill_pattern(seed) as splitmix64(seed + w), little-endian.
  std::vector<std::byte> expected(77);
  fill_pattern(42, 0, expected);
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const auto byte = static_cast<std::byte>(x::splitmix64(42 + i / 8) >> (8 * (i % 8)));
    ASSERT_EQ(byte, expected[i]) << i;
  }
}

// The small_bf16 fill kernel writes word w as small_bf16_word(splitmix64(seed + w)).
TEST(CudaXxh64Core, SmallBf16WordAgreesWithTheContentDefinition) {
  for (const std::uint64_t seed : {0ull, 7ull, 0x5eedull, ~0ull}) {
    std::vector<std::byte> expected(4099);  // 2049 elements and a half
    fill_small_bf16(seed, 0, expected);
    for (std::size_t i = 0; i < expected.size(); ++i) {
      const std::uint64_t word = x::small_bf16_word(x::splitmix64(seed + i / 8));
      ASSERT_EQ(static_cast<std::byte>(word >> (8 * (i % 8))), expected[i])
          << "seed " << seed << " byte " << i;
    }
  }
  // Every element is one of the five values, and each of them occurs.
  const std::uint16_t values[5] = {0xC000, 0xBF80, 0x0000, 0x3F80, 0x4000};
  int seen[5] = {};
  for (std::uint64_t w = 0; w < 64; ++w) {
    const std::uint64_t word = x::small_bf16_word(x::splitmix64(w));
    for (unsigned e = 0; e < 4; ++e) {
      const auto bits = static_cast<std::uint16_t>(word >> (16 * e));
      const auto* at = std::find(values, values + 5, bits);
      ASSERT_NE(at, values + 5) << std::hex << bits;
      ++seen[at - values];
    }
  }
  for (int count : seen) EXPECT_GT(count, 0);
}

}  // namespace
}  // namespace ferry
