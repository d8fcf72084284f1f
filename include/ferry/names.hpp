// ferry — the one mechanism for names of enum values (reports, options, messages).
//
// Each enum that has names keeps one table of {value, name} next to its
// to_string / parse function; these helpers read it both ways, so a name is
// written once and a parser can never disagree with the printer.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

#include "ferry/api.hpp"
#include "ferry/result.hpp"

namespace ferry FERRY_API {

template <class E>
struct NamedValue {
  E value;
  std::string_view name;
};

// The name of `value` in `table`; "unknown" for a value the table lacks.
template <class E>
constexpr std::string_view name_in(std::span<const NamedValue<E>> table, E value) noexcept {
  for (const NamedValue<E>& n : table) {
    if (n.value == value) return n.name;
  }
  return "unknown";
}

// "a|b|c": the table's names, in order (for --help and error messages).
template <class E>
std::string names_in(std::span<const NamedValue<E>> table, std::string_view separator = "|") {
  std::string out;
  for (const NamedValue<E>& n : table) {
    if (!out.empty()) out += separator;
    out += n.name;
  }
  return out;
}

// The value named `text`. Errors: invalid_argument naming `what`, the text and
// every accepted name.
template <class E>
Result<E> value_in(std::span<const NamedValue<E>> table, std::string_view text, std::string_view what) {
  for (const NamedValue<E>& n : table) {
    if (n.name == text) return n.value;
  }
  std::string expected;
  for (std::size_t i = 0; i < table.size(); ++i) {
    expected += i == 0 ? "" : i + 1 == table.size() ? " or " : ", ";
    expected += table[i].name;
  }
  return make_error(ErrorCode::invalid_argument,
                    std::string(what) + " '" + std::string(text) + "' is unknown; expected " + expected);
}

}  // namespace ferry
