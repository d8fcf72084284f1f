// Text from a pickle as the inside of a JSON string: its UTF-8 kept (a str is
// UTF-8 as pickled), a byte that starts no well-formed sequence (RFC 3629) or a
// control character becomes '?', so the trace stays valid JSON whatever the
// file holds.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace ferry::import {

// Bytes of the well-formed UTF-8 sequence opening `s`, or 0.
inline std::size_t utf8_length(std::string_view s) noexcept {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(0);
  std::size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;  // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (s.size() < n || b(1) < lo || b(1) > hi) return 0;
  for (std::size_t k = 2; k < n; ++k) {
    if (b(k) < 0x80 || b(k) > 0xBF) return 0;
  }
  return n;
}

inline void append_json_text(std::string& out, std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += s[i++];
    } else if (c < 0x20) {
      out += '?';
      ++i;
    } else if (c < 0x80) {
      out += s[i++];
    } else if (const std::size_t n = utf8_length(s.substr(i)); n != 0) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out += '?';
      ++i;
    }
  }
}

}  // namespace ferry::import
