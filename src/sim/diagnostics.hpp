// Text for the sim backend's error messages: addresses and sizes the way a
// person reading a failure wants them.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace ferry::sim {

inline std::string hex(std::uint64_t value) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(value));
  return buf;
}

inline std::string hex(const void* ptr) {
  return hex(static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(ptr)));
}

// Exact: "3 MiB" only when the size is a whole number of MiB, else "3145729 B".
inline std::string bytes_text(std::uint64_t bytes) {
  constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  std::uint64_t value = bytes;
  while (unit < 4 && value != 0 && value % 1024 == 0) {
    value /= 1024;
    ++unit;
  }
  return std::to_string(value) + " " + kUnits[unit];
}

}  // namespace ferry::sim
