#include "core/text.hpp"

#include <charconv>
#include <cinttypes>
#include <cstdio>

#include "ferry/device_handle.hpp"

namespace ferry::text {

std::string hex(std::uint64_t value) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%" PRIx64, value);
  return buf;
}

std::string hex(const void* ptr) { return hex(static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(ptr))); }

std::string hex16(std::uint64_t value) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016" PRIx64, value);
  return buf;
}

std::string exact_bytes(std::uint64_t bytes) {
  constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  std::uint64_t value = bytes;
  while (unit < 4 && value != 0 && value % 1024 == 0) {
    value /= 1024;
    ++unit;
  }
  return std::to_string(value) + " " + kUnits[unit];
}

std::string human_bytes(std::uint64_t bytes, int decimals, ByteUnit largest) {
  constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  const int last = static_cast<int>(largest);
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < last) {
    v /= 1024.0;
    ++u;
  }
  char buf[48];
  if (u == 0) {
    std::snprintf(buf, sizeof buf, "%" PRIu64 " B", bytes);
  } else {
    std::snprintf(buf, sizeof buf, "%.*f %s", decimals, v, kUnits[u]);
  }
  return buf;
}

std::string human_ns(std::uint64_t ns, int decimals) {
  char buf[48];
  const double v = static_cast<double>(ns);
  if (ns < 1000) {
    std::snprintf(buf, sizeof buf, "%" PRIu64 " ns", ns);
  } else if (ns < 1'000'000) {
    std::snprintf(buf, sizeof buf, "%.*f us", decimals, v / 1e3);
  } else if (ns < 1'000'000'000) {
    std::snprintf(buf, sizeof buf, "%.*f ms", decimals, v / 1e6);
  } else {
    std::snprintf(buf, sizeof buf, "%.*f s", decimals, v / 1e9);
  }
  return buf;
}

std::string rate(double bytes_per_s) {
  char buf[48];
  if (bytes_per_s >= 1e12) {
    std::snprintf(buf, sizeof buf, "%.1f TB/s", bytes_per_s / 1e12);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f GB/s", bytes_per_s / 1e9);
  }
  return buf;
}

std::string fixed(double value, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, value);
  return buf;
}

std::string range(std::uint64_t addr, std::uint64_t bytes) {
  std::string out = "[";  // appended, not "[" + ...: gcc 12 warns falsely (-Wrestrict) on that
  out += hex(addr);
  out += ", +";
  out += std::to_string(bytes);
  out += ')';
  return out;
}

std::string count(std::uint64_t n, const char* one, const char* many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

std::string quoted(std::string_view text, std::size_t limit, char quote) {
  const bool cut = text.size() > limit;
  if (cut) text = text.substr(0, limit < 3 ? 0 : limit - 3);
  std::string out;  // appended: gcc 12 warns falsely (-Wrestrict) on "\"" + ...
  out.reserve(text.size() + 5);
  out += quote;
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    out += u < 0x20 || u == 0x7f ? '?' : c;
  }
  if (cut) out += "...";
  out += quote;
  return out;
}

std::string point(StreamPoint p) {
  return "stream " + std::to_string(p.stream) + " ticket " + std::to_string(p.ticket);
}

std::string handle(const DeviceHandle& h) {
  return "{pool " + std::to_string(h.pool) + ", slot " + std::to_string(h.slot) + ", gen " +
         std::to_string(h.generation) + "}";
}

std::string_view trimmed(std::string_view text) noexcept {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
  return text;
}

std::optional<std::uint64_t> parse_u64(std::string_view text) noexcept {
  std::uint64_t v = 0;
  const char* end = text.data() + text.size();
  const auto [p, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || p != end) return std::nullopt;
  return v;
}

}  // namespace ferry::text
