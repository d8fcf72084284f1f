// ferry — the one rounding rule (STYLE practice 17): sizes and offsets up or
// down to a multiple, and the alignment every device block keeps.
#pragma once

#include <cstdint>
#include <optional>

namespace ferry::detail {

// Every device pool block (and each part cut from one) starts and ends on this.
inline constexpr std::uint64_t kBlockAlign = 256;

// `v` rounded up to a multiple of `a` (a > 0). Precondition: v + a - 1 does not
// overflow (callers bound v first, or use checked_align_up).
constexpr std::uint64_t align_up(std::uint64_t v, std::uint64_t a) noexcept { return (v + a - 1) / a * a; }

// As align_up, or nullopt where the multiple is past 2^64 - 1.
constexpr std::optional<std::uint64_t> checked_align_up(std::uint64_t v, std::uint64_t a) noexcept {
  if (v > UINT64_MAX - (a - 1)) return std::nullopt;
  return align_up(v, a);
}

constexpr std::uint64_t align_down(std::uint64_t v, std::uint64_t a) noexcept { return v / a * a; }

}  // namespace ferry::detail
