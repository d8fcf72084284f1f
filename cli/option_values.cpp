#include "option_values.hpp"

#include <array>
#include <string>
#include <utility>

#include "core/text.hpp"

namespace ferry::cli {
namespace {

constexpr std::uint64_t kMax = ~std::uint64_t{0};

// Accumulates digits of `base`; false on overflow or a non-digit.
bool accumulate(std::string_view digits, unsigned base, std::uint64_t& value) {
  value = 0;
  if (digits.empty()) return false;
  for (char c : digits) {
    unsigned d = 0;
    if (c >= '0' && c <= '9') {
      d = static_cast<unsigned>(c - '0');
    } else if (base == 16 && c >= 'a' && c <= 'f') {
      d = static_cast<unsigned>(c - 'a' + 10);
    } else if (base == 16 && c >= 'A' && c <= 'F') {
      d = static_cast<unsigned>(c - 'A' + 10);
    } else {
      return false;
    }
    if (value > (kMax - d) / base) return false;
    value = value * base + d;
  }
  return true;
}

}  // namespace

Result<std::uint64_t> parse_u64(std::string_view text) {
  std::uint64_t v = 0;
  if (text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) {
    if (accumulate(text.substr(2), 16, v)) return v;
  } else if (accumulate(text, 10, v)) {
    return v;
  }
  return make_error(ErrorCode::invalid_argument,
                    text::quoted(text) + " is not a non-negative integer up to 18446744073709551615");
}

Result<std::uint64_t> parse_byte_size(std::string_view text) {
  struct Unit {
    std::string_view name;  // as --help spells it; matched without regard to case
    std::uint64_t bytes;
  };
  static constexpr std::array<Unit, 9> kUnits = {{
      {"B", 1},
      {"KB", 1000},
      {"MB", 1'000'000},
      {"GB", 1'000'000'000},
      {"TB", 1'000'000'000'000},
      {"KiB", std::uint64_t{1} << 10},
      {"MiB", std::uint64_t{1} << 20},
      {"GiB", std::uint64_t{1} << 30},
      {"TiB", std::uint64_t{1} << 40},
  }};
  const auto bad = [&](const std::string& why) {
    return make_error(ErrorCode::invalid_argument, text::quoted(text) + why);
  };
  const std::size_t int_end = text.find_first_not_of("0123456789");
  const std::string_view whole = text.substr(0, int_end);
  std::string_view rest = int_end == std::string_view::npos ? std::string_view{} : text.substr(int_end);
  std::string_view fraction;
  if (!rest.empty() && rest.front() == '.') {
    rest.remove_prefix(1);
    const std::size_t frac_end = rest.find_first_not_of("0123456789");
    fraction = rest.substr(0, frac_end);
    rest = frac_end == std::string_view::npos ? std::string_view{} : rest.substr(frac_end);
    if (fraction.empty()) return bad(" is not a byte count (a digit must follow the decimal point)");
  }
  while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
  if (whole.empty()) {
    return bad(" is not a byte count (expected e.g. 4096, 64KiB, 1.5GiB, 512MB)");
  }

  std::uint64_t unit = 1;
  if (!rest.empty()) {
    const auto same = [](std::string_view a, std::string_view b) {
      if (a.size() != b.size()) return false;
      for (std::size_t i = 0; i < a.size(); ++i) {
        const auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; };
        if (lower(a[i]) != lower(b[i])) return false;
      }
      return true;
    };
    bool known = false;
    for (const Unit& u : kUnits) {
      if (same(rest, u.name)) {
        unit = u.bytes;
        known = true;
      }
    }
    if (!known) {
      return bad(" has an unknown unit " + text::quoted(rest) +
                 " (units: B; KB, MB, GB, TB = powers of 1000; KiB, MiB, GiB, TiB = powers of 1024)");
    }
  }
  // Exact in 128 bits: whole * unit + fraction * unit / 10^digits.
  __extension__ typedef unsigned __int128 u128;
  constexpr u128 kLimit = kMax;
  u128 bytes = 0;
  for (char c : whole) {
    bytes = bytes * 10 + static_cast<unsigned>(c - '0');
    if (bytes > kLimit) return bad(" is too large (at most 18446744073709551615 bytes)");
  }
  bytes *= unit;
  if (bytes > kLimit) return bad(" is too large (at most 18446744073709551615 bytes)");
  if (fraction.size() > 18) return bad(" has more decimals than a byte count can use");
  u128 numerator = 0, denominator = 1;
  for (char c : fraction) {
    numerator = numerator * 10 + static_cast<unsigned>(c - '0');
    denominator *= 10;
  }
  numerator *= unit;
  if (numerator % denominator != 0) return bad(" is not a whole number of bytes");
  bytes += numerator / denominator;
  if (bytes > kLimit) return bad(" is too large (at most 18446744073709551615 bytes)");
  if (bytes == 0) return bad(" is zero bytes");
  return static_cast<std::uint64_t>(bytes);
}

}  // namespace ferry::cli
