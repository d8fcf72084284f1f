// ferry — the byte-level definitions every backend and every reference model share.
//
// A sim "kernel", a CUDA kernel and a host reference model must produce the same
// bytes, so the functions below are defined once, here, down to the bit:
//
//   mix64(x)              = x ^= x >> 30; x *= 0xbf58476d1ce4e5b9; x ^= x >> 27;
//                           x *= 0x94d049bb133111eb; x ^ (x >> 31)  (a bijection)
//   splitmix64(x)         = mix64(x + 0x9e3779b97f4a7c15)
//   fill_pattern(seed)[i] = byte (i % 8) (little-endian) of splitmix64(seed + i / 8)
//   content_hash(b)       = hash_finish(S, |b|), S = sum over j of hash_word(w_j, j)
//                           mod 2^64, w_j = bytes [8j, 8j + 8) of b as a
//                           little-endian u64, the last one zero-padded
//   hash_word(w, j)       = mix64(w ^ ((j + 1) * kHashPositionKey))
//   hash_finish(S, n)     = mix64(S ^ mix64(n + kHashLengthKey))
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
// The content hash is a sum, so any split of the words over threads, blocks or
// pieces, summed in any order, gives the same value: a device hashes with every
// thread it has and no serial combine, and still agrees with the host. What it is
// for: verify finds a copy that did not happen (stale bytes), zeroed or partial
// copies, swapped or shifted pieces and flipped bits. A change confined to one
// 8-byte word is always detected (hash_word is a bijection of the word for a fixed
// position, hash_finish of the sum for a fixed length); any other change is missed
// only by coincidence (about 2^-64, if mix64 behaves as a random function). It is
// no defence against a collision chosen on purpose.
//
// The functions marked FERRY_HOST_DEVICE are compiled by nvcc for the device too
// (src/cuda/kernels.cu), so host and device share one definition.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "ferry/api.hpp"

#if defined(__CUDACC__)
#define FERRY_HOST_DEVICE __host__ __device__
#else
#define FERRY_HOST_DEVICE
#endif

namespace ferry FERRY_API {

inline constexpr std::uint64_t kMixStart = 0x6a09e667f3bcc908ull;
inline constexpr std::uint64_t kHashPositionKey = 0x9e3779b97f4a7c15ull;  // odd
inline constexpr std::uint64_t kHashLengthKey = 0xd1b54a32d192ed03ull;

FERRY_HOST_DEVICE constexpr std::uint64_t mix64(std::uint64_t x) noexcept {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

FERRY_HOST_DEVICE constexpr std::uint64_t splitmix64(std::uint64_t x) noexcept {
  return mix64(x + 0x9e3779b97f4a7c15ull);
}

// Word `index` of an input, mixed with its position: a bijection of `word` for
// each index, so a change of one word always changes the sum.
FERRY_HOST_DEVICE constexpr std::uint64_t hash_word(std::uint64_t word, std::uint64_t index) noexcept {
  return mix64(word ^ ((index + 1) * kHashPositionKey));
}

// The hash of an input of `length` bytes whose hash_word terms sum to `sum`.
FERRY_HOST_DEVICE constexpr std::uint64_t hash_finish(std::uint64_t sum, std::uint64_t length) noexcept {
  return mix64(sum ^ mix64(length + kHashLengthKey));
}

// small_bf16 word w (bytes [8w, 8w + 8), elements 4w..4w+3), given
// v = splitmix64(seed + w): element 4w + i comes from bits [16i, 16i + 16) of v.
FERRY_HOST_DEVICE constexpr std::uint64_t small_bf16_word(std::uint64_t v) noexcept {
  std::uint64_t out = 0;
  for (unsigned i = 0; i < 4; ++i) {
    std::uint64_t bits = 0;
    switch (((v >> (16 * i)) & 0xffff) % 5) {  // the bf16 bits of the value r - 2
      case 0: bits = 0xC000; break;  // -2
      case 1: bits = 0xBF80; break;  // -1
      case 2: bits = 0x0000; break;  //  0
      case 3: bits = 0x3F80; break;  //  1
      default: bits = 0x4000; break;  // 2
    }
    out |= bits << (16 * i);
  }
  return out;
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

// The sum of hash_word over the words of `bytes`, whose first byte is byte
// 8 * first_word of the whole input: hash_finish of the sum over the pieces of any
// split at word boundaries is content_hash of the whole. A size that is not a
// multiple of 8 pads the last word with zeros, so only the input's last piece may
// have one.
std::uint64_t content_hash_sum(std::span<const std::byte> bytes, std::uint64_t first_word) noexcept;

// Incremental form for data that is not contiguous in host memory (sim granules):
// feed the bytes in order, in pieces of any size.
class ContentHasher {
 public:
  void update(std::span<const std::byte> bytes) noexcept;
  // update() with bytes [offset, offset + bytes) of fill_with(pattern, seed),
  // generated a few KiB at a time: no buffer of their size.
  void update_pattern(Pattern pattern, std::uint64_t seed, std::uint64_t offset, std::uint64_t bytes) noexcept;
  std::uint64_t finish() noexcept;  // and starts over

 private:
  std::uint64_t sum_ = 0;
  std::uint64_t total_ = 0;      // bytes fed so far
  std::byte partial_[8] = {};    // the bytes of an unfinished word: total_ % 8 of them
};

// content_hash of bytes [offset, offset + bytes) of fill_with(pattern, seed),
// without a buffer of their size (ContentHasher::update_pattern).
std::uint64_t pattern_hash(Pattern pattern, std::uint64_t seed, std::uint64_t offset, std::uint64_t bytes) noexcept;

// mix_seed folds one input hash at a time: acc = mix_step(acc, k, content_hash(input_k)).
FERRY_HOST_DEVICE constexpr std::uint64_t mix_step(std::uint64_t acc, std::uint64_t k, std::uint64_t h) noexcept {
  return splitmix64(acc ^ h ^ k);
}

}  // namespace ferry
