// ferry — the byte-level definitions every backend and every reference model share.
//
// A sim "kernel", a CUDA kernel and a host reference model must produce the same
// bytes, so the functions below are defined once, here, down to the bit:
//
//   fill_pattern(seed)[i] = byte (i % 8) (little-endian) of splitmix64(seed + i / 8)
//   content_hash(b)       = XXH64(h_0..h_{n-1} as little-endian u64, seed = |b|)
//                           where h_j = XXH64(chunk j of b, seed = j), chunks of
//                           kHashChunk bytes (the last one shorter)
//   mix_seed(inputs)      = fold of splitmix64(acc ^ content_hash(input_k) ^ k)
//                           starting at acc = kMixStart
//   mix_kernel(inputs)    = fill_pattern(mix_seed(inputs)): every output byte
//                           depends on every byte of every input
//   small_bf16(seed)      = 2-byte little-endian bf16 elements; element j is the
//                           integer ((splitmix64(seed + j / 4) >> 16 * (j % 4))
//                           & 0xffff) % 5 - 2, so every value lies in [-2, 2]
//
// A fill or a kernel writes one of two patterns: raw bytes (fill_pattern), or
// small_bf16 values, which a bf16 GEMM with FP32 accumulation sums exactly
// (|partial sums| <= 4k < 2^24 for k < 2^22), so cuBLAS and the host agree to
// the bit whatever order either sums in (see gemm.hpp).
//
// The chunked hash lets a device hash 64 KiB chunks in parallel and still agree
// with the host, which uses xxHash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "ferry/api.hpp"

namespace ferry FERRY_API {

inline constexpr std::uint64_t kHashChunk = 64 * 1024;
inline constexpr std::uint64_t kMixStart = 0x6a09e667f3bcc908ull;

constexpr std::uint64_t splitmix64(std::uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

enum class Pattern : std::uint8_t { bytes, small_bf16 };
std::string_view to_string(Pattern pattern) noexcept;  // "bytes", "small_bf16"
bool known_pattern(Pattern pattern) noexcept;           // a value the enum names

// Writes bytes [offset, offset + out.size()) of fill_pattern(seed).
void fill_pattern(std::uint64_t seed, std::uint64_t offset, std::span<std::byte> out) noexcept;
// Writes bytes [offset, offset + out.size()) of small_bf16(seed); any offset and
// length, so a fill split at an odd byte still joins up.
void fill_small_bf16(std::uint64_t seed, std::uint64_t offset, std::span<std::byte> out) noexcept;
// The one the pattern names.
void fill_with(Pattern pattern, std::uint64_t seed, std::uint64_t offset, std::span<std::byte> out) noexcept;

// Inputs of at least twice this size are hashed on several threads.
inline constexpr std::uint64_t kParallelHashMin = std::uint64_t{8} << 20;

// content_hash over one contiguous range. Large inputs are hashed on a few
// threads (blocks until they finish); the value never depends on that.
std::uint64_t content_hash(std::span<const std::byte> bytes) noexcept;

// Incremental form for data that is not contiguous in host memory (sim granules):
// feed the bytes in order, in pieces of any size.
class ContentHasher {
 public:
  void update(std::span<const std::byte> bytes) noexcept;
  std::uint64_t finish() noexcept;

 private:
  void flush_chunk() noexcept;
  std::byte chunk_[kHashChunk];
  std::uint64_t chunk_fill_ = 0;
  std::uint64_t total_ = 0;
  std::vector<std::uint64_t> chunk_hashes_;
};

// mix_seed folds one input hash at a time: acc = mix_step(acc, k, content_hash(input_k)).
constexpr std::uint64_t mix_step(std::uint64_t acc, std::uint64_t k, std::uint64_t h) noexcept {
  return splitmix64(acc ^ h ^ k);
}

}  // namespace ferry
