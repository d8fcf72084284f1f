#include "replay/reference.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "ferry/content.hpp"

namespace ferry::replay {

ExpectedBytes ExpectedBytes::mixed(std::span<ExpectedBytes* const> inputs, std::uint64_t output_bytes) {
  std::uint64_t acc = kMixStart;
  std::uint64_t k = 0;
  for (ExpectedBytes* in : inputs) {
    if (!in->known()) return unknown(output_bytes);
    acc = mix_step(acc, k++, in->hash());
  }
  return pattern(output_bytes, acc);
}

std::uint64_t ExpectedBytes::hash() {
  if (!hash_) hash_ = pattern_hash(Pattern::bytes, *seed_, 0, bytes_);
  return *hash_;
}

std::optional<std::uint64_t> ExpectedBytes::first_mismatch(std::span<const std::byte> actual,
                                                           std::uint64_t offset) const {
  constexpr std::uint64_t kPiece = 64 * 1024;
  const std::uint64_t total = actual.size();
  std::vector<std::byte> piece(static_cast<std::size_t>(std::min(total, kPiece)));
  for (std::uint64_t off = 0; off < total; off += kPiece) {
    const std::uint64_t n = std::min(kPiece, total - off);
    std::span<std::byte> want(piece.data(), static_cast<std::size_t>(n));
    fill_pattern(*seed_, offset + off, want);
    const std::byte* got = actual.data() + off;
    if (std::memcmp(got, want.data(), want.size()) != 0) {
      for (std::uint64_t i = 0; i < n; ++i) {
        if (got[i] != want[i]) return offset + off + i;
      }
    }
  }
  return std::nullopt;
}

}  // namespace ferry::replay
