#include "option_values.hpp"

#include <array>
#include <string>
#include <utility>

namespace ferry::cli {
namespace {

constexpr std::uint64_t kMax = ~std::uint64_t{0};

std::string in_quotes(std::string_view s) { return "\"" + std::string(s) + "\""; }

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
                    in_quotes(text) + " is not a non-negative integer up to 18446744073709551615");
}

Result<std::uint64_t> parse_byte_size(std::string_view text) {
  static constexpr std::array<std::pair<std::string_view, unsigned>, 5> kSuffixes = {{
      {"B", 0}, {"KiB", 10}, {"MiB", 20}, {"GiB", 30}, {"TiB", 40},
  }};
  const std::size_t end = text.find_first_not_of("0123456789");
  const std::string_view digits = text.substr(0, end);
  std::string_view suffix = end == std::string_view::npos ? std::string_view{} : text.substr(end);
  while (!suffix.empty() && suffix.front() == ' ') suffix.remove_prefix(1);

  std::uint64_t value = 0;
  if (digits.empty()) {
    return make_error(ErrorCode::invalid_argument,
                      in_quotes(text) + " is not a byte count (expected e.g. 4096, 64KiB, 512MiB, 2GiB)");
  }
  if (!accumulate(digits, 10, value)) {
    return make_error(ErrorCode::invalid_argument, in_quotes(text) + " is too large");
  }
  unsigned shift = 0;
  if (!suffix.empty()) {
    bool known = false;
    for (const auto& [name, s] : kSuffixes) {
      if (suffix == name) {
        shift = s;
        known = true;
      }
    }
    if (!known) {
      return make_error(ErrorCode::invalid_argument,
                        in_quotes(text) + " has an unknown unit " + in_quotes(suffix) +
                            " (units: B, KiB, MiB, GiB, TiB; powers of 1024)");
    }
  }
  if (value == 0) return make_error(ErrorCode::invalid_argument, in_quotes(text) + " is zero bytes");
  if (shift > 0 && value > (kMax >> shift)) {
    return make_error(ErrorCode::invalid_argument, in_quotes(text) + " is too large");
  }
  return value << shift;
}

}  // namespace ferry::cli
