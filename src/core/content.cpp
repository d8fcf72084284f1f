#include "ferry/content.hpp"

#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <thread>

namespace ferry {

static_assert(std::endian::native == std::endian::little,
              "content definitions assume a little-endian host");

namespace {

// Writes bytes [offset, offset + out.size()) of a stream of little-endian 8-byte
// words, word w being word(w): both patterns are defined that way.
template <class Word>
void fill_words(std::uint64_t offset, std::span<std::byte> out, Word&& word) noexcept {
  std::uint64_t i = 0;
  const std::uint64_t n = out.size();
  const auto byte_at = [&](std::uint64_t pos) {
    return static_cast<std::byte>(word(pos / 8) >> (8 * (pos % 8)));
  };
  for (; i < n && (offset + i) % 8 != 0; ++i) out[i] = byte_at(offset + i);  // leading partial word
  for (; i + 8 <= n; i += 8) {
    const std::uint64_t w = word((offset + i) / 8);
    std::memcpy(out.data() + i, &w, 8);
  }
  for (; i < n; ++i) out[i] = byte_at(offset + i);
}

// bf16 bits of the integers -2..2.
constexpr std::uint16_t kSmallBf16[5] = {0xC000, 0xBF80, 0x0000, 0x3F80, 0x4000};

// Elements 4w..4w+3 of small_bf16(seed), as the 8 bytes they occupy.
std::uint64_t small_bf16_word(std::uint64_t seed, std::uint64_t w) noexcept {
  const std::uint64_t x = splitmix64(seed + w);
  std::uint64_t out = 0;
  for (unsigned q = 0; q < 4; ++q) {
    out |= std::uint64_t{kSmallBf16[((x >> (16 * q)) & 0xffff) % 5]} << (16 * q);
  }
  return out;
}

}  // namespace

void fill_pattern(std::uint64_t seed, std::uint64_t offset, std::span<std::byte> out) noexcept {
  fill_words(offset, out, [seed](std::uint64_t w) { return splitmix64(seed + w); });
}

void fill_small_bf16(std::uint64_t seed, std::uint64_t offset, std::span<std::byte> out) noexcept {
  fill_words(offset, out, [seed](std::uint64_t w) { return small_bf16_word(seed, w); });
}

void fill_with(Pattern pattern, std::uint64_t seed, std::uint64_t offset,
               std::span<std::byte> out) noexcept {
  switch (pattern) {
    case Pattern::bytes:
      return fill_pattern(seed, offset, out);
    case Pattern::small_bf16:
      return fill_small_bf16(seed, offset, out);
  }
  fill_pattern(seed, offset, out);  // not a Pattern (a cast from a bad integer): bytes
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
