// The host reference model of one buffer's bytes.
//
// Every write a trace can make — fill, upload, compute — leaves a buffer holding
// fill_pattern(s) for some seed s (content.hpp: compute writes
// fill_pattern(mix_seed(inputs))). So the model keeps the seed, not the bytes,
// and regenerates the bytes when it hashes or compares: a replay of gigabytes of
// live buffers costs no host memory for the reference. A fresh allocation's
// bytes are undefined: the reference is "unknown" until the first write.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

namespace ferry::replay {

class ExpectedBytes {
 public:
  static ExpectedBytes unknown(std::uint64_t bytes) noexcept { return ExpectedBytes(bytes, std::nullopt); }
  static ExpectedBytes pattern(std::uint64_t bytes, std::uint64_t seed) noexcept {
    return ExpectedBytes(bytes, seed);
  }
  // What a device copy of `bytes` from `src` at `src_offset` leaves in a
  // `dst_bytes` buffer at `dst_offset`: src's pattern when it covers the whole
  // buffer from the same offset (a pattern's byte i depends on its seed and i
  // only), unknown otherwise.
  static ExpectedBytes copied(const ExpectedBytes& src, std::uint64_t src_offset, std::uint64_t dst_bytes,
                              std::uint64_t dst_offset, std::uint64_t bytes) noexcept {
    const bool whole = src.known() && src_offset == 0 && dst_offset == 0 && bytes == dst_bytes && bytes <= src.size();
    return whole ? pattern(dst_bytes, *src.seed_) : unknown(dst_bytes);
  }
  // What a compute kernel writes into an `output_bytes` buffer from `inputs`
  // (in order); unknown when any input is.
  static ExpectedBytes mixed(std::span<ExpectedBytes* const> inputs, std::uint64_t output_bytes);

  bool known() const noexcept { return seed_.has_value(); }
  std::uint64_t size() const noexcept { return bytes_; }

  // content_hash of the expected bytes, computed on the host from the
  // definitions in content.hpp. Precondition: known().
  std::uint64_t hash();

  // Offset (in the buffer) of the first byte of `actual`, bytes [offset, offset +
  // actual.size()) of the buffer, that differs from the expectation, or nullopt
  // when all match. Precondition: known(), the range lies inside size().
  std::optional<std::uint64_t> first_mismatch(std::span<const std::byte> actual, std::uint64_t offset = 0) const;

 private:
  ExpectedBytes(std::uint64_t bytes, std::optional<std::uint64_t> seed) noexcept
      : bytes_(bytes), seed_(seed) {}

  std::uint64_t bytes_ = 0;
  std::optional<std::uint64_t> seed_;
  std::optional<std::uint64_t> hash_;  // cache; the bytes never change
};

}  // namespace ferry::replay
