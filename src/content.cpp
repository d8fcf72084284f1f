#include "ferry/content.hpp"

#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cstring>

namespace ferry {

static_assert(std::endian::native == std::endian::little,
              "content definitions assume a little-endian host");

void fill_pattern(std::uint64_t seed, std::uint64_t offset, std::span<std::byte> out) noexcept {
  std::uint64_t i = 0;
  const std::uint64_t n = out.size();
  // Leading partial word.
  while (i < n && (offset + i) % 8 != 0) {
    const std::uint64_t pos = offset + i;
    out[i] = static_cast<std::byte>(splitmix64(seed + pos / 8) >> (8 * (pos % 8)));
    ++i;
  }
  for (; i + 8 <= n; i += 8) {
    const std::uint64_t w = splitmix64(seed + (offset + i) / 8);
    std::memcpy(out.data() + i, &w, 8);
  }
  for (; i < n; ++i) {
    const std::uint64_t pos = offset + i;
    out[i] = static_cast<std::byte>(splitmix64(seed + pos / 8) >> (8 * (pos % 8)));
  }
}

std::uint64_t content_hash(std::span<const std::byte> bytes) noexcept {
  const std::uint64_t n = bytes.size();
  const std::uint64_t chunks = (n + kHashChunk - 1) / kHashChunk;
  std::vector<std::uint64_t> hashes(chunks);
  for (std::uint64_t j = 0; j < chunks; ++j) {
    const std::uint64_t len = std::min(kHashChunk, n - j * kHashChunk);
    hashes[j] = XXH64(bytes.data() + j * kHashChunk, len, j);
  }
  return XXH64(hashes.data(), hashes.size() * 8, n);
}

void ContentHasher::update(std::span<const std::byte> bytes) noexcept {
  while (!bytes.empty()) {
    const std::uint64_t take = std::min<std::uint64_t>(kHashChunk - chunk_fill_, bytes.size());
    std::memcpy(chunk_ + chunk_fill_, bytes.data(), take);
    chunk_fill_ += take;
    total_ += take;
    bytes = bytes.subspan(take);
    if (chunk_fill_ == kHashChunk) flush_chunk();
  }
}

void ContentHasher::flush_chunk() noexcept {
  chunk_hashes_.push_back(XXH64(chunk_, chunk_fill_, chunk_hashes_.size()));
  chunk_fill_ = 0;
}

std::uint64_t ContentHasher::finish() noexcept {
  if (chunk_fill_ > 0) flush_chunk();
  const std::uint64_t h = XXH64(chunk_hashes_.data(), chunk_hashes_.size() * 8, total_);
  chunk_hashes_.clear();
  total_ = 0;
  return h;
}

}  // namespace ferry
