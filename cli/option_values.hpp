// ferry CLI — parsing the values of numeric options, strictly.
//
// CLI11's own unsigned conversion goes through strtoull, which accepts "-1"
// (as 2^64-1) and octal; these do not.
#pragma once

#include <cstdint>
#include <string_view>

#include "ferry/result.hpp"

namespace ferry::cli {

// A byte count: decimal digits with an optional decimal fraction, optionally
// followed (after optional spaces) by a unit, in any case: B; KB, MB, GB, TB
// (powers of 1000); KiB, MiB, GiB, TiB (powers of 1024). "64MiB", "1.5 GiB",
// "64mb", "4096". Errors: invalid_argument (empty, not a number, unknown unit,
// not a whole number of bytes such as "1.5B", zero, larger than 2^64-1); the
// message says which.
Result<std::uint64_t> parse_byte_size(std::string_view text);

// A non-negative integer, decimal or 0x-prefixed hexadecimal, up to 2^64-1.
// Errors: invalid_argument.
Result<std::uint64_t> parse_u64(std::string_view text);

}  // namespace ferry::cli
