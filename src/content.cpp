#include "ferry/content.hpp"

#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <thread>

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
  auto hash_chunks = [&](std::uint64_t first, std::uint64_t last) {
    for (std::uint64_t j = first; j < last; ++j) {
      const std::uint64_t len = std::min(kHashChunk, n - j * kHashChunk);
      hashes[j] = XXH64(bytes.data() + j * kHashChunk, len, j);
    }
  };
  // Chunks hash independently (that is why the hash is chunked), so large
  // inputs spread over a few threads; the result does not depend on how.
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const std::uint64_t workers = std::min<std::uint64_t>({cores, 8, n / kParallelHashMin});
  if (workers <= 1) {
    hash_chunks(0, chunks);
  } else {
    std::vector<std::thread> threads;
    const std::uint64_t per = (chunks + workers - 1) / workers;
    try {
      for (std::uint64_t w = 1; w < workers; ++w) {
        threads.emplace_back(hash_chunks, w * per, std::min(chunks, (w + 1) * per));
      }
    } catch (...) {
      // No thread to be had: hash the rest here, as the serial path would.
      for (std::uint64_t w = threads.size() + 1; w < workers; ++w)
        hash_chunks(w * per, std::min(chunks, (w + 1) * per));
    }
    hash_chunks(0, std::min(chunks, per));
    for (std::thread& t : threads) t.join();
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
