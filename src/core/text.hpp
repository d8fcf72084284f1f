// The one home of how ferry writes numbers, sizes, addresses and times in
// messages and reports, and of how it reads the few numbers it takes as text
// (fault specs, link lists). Every layer goes through these; none keeps its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "ferry/stream.hpp"

namespace ferry {
struct DeviceHandle;
}

namespace ferry::text {

// "0x1f00": the shortest form (addresses in messages).
std::string hex(std::uint64_t value);
std::string hex(const void* ptr);
// "0x00000000000001f0": all 16 digits (hashes and digests, which line up).
std::string hex16(std::uint64_t value);

// Exact: "3 MiB" only for a whole number of MiB, else "3145729 B".
std::string exact_bytes(std::uint64_t bytes);

enum class ByteUnit : std::uint8_t { B, KiB, MiB, GiB, TiB, PiB, EiB };
// Rounded to `decimals`: "12 B", "1.5 KiB", "2.00 GiB"; never past `largest`.
std::string human_bytes(std::uint64_t bytes, int decimals = 1, ByteUnit largest = ByteUnit::EiB);

// "812 ns", "3.2 us", "14.0 ms", "2.5 s" (decimals for every unit above ns).
std::string human_ns(std::uint64_t ns, int decimals = 1);

// "52.0 GB/s", "4.3 TB/s": a bandwidth, one decimal, decimal units.
std::string rate(double bytes_per_s);

// printf's %.*f.
std::string fixed(double value, int decimals);

// "[0x1000, +4096)": a device or host range.
std::string range(std::uint64_t addr, std::uint64_t bytes);

// "1 race", "3 races": a count and its noun, singular for exactly one.
std::string count(std::uint64_t n, const char* one, const char* many);

// "text" (or 'text' with quote '\''), for messages: control characters shown as
// '?' (names may come from untrusted files), and a text longer than `limit`
// cut to its first limit - 3 characters and "...".
std::string quoted(std::string_view text, std::size_t limit = std::string_view::npos, char quote = '"');

// "stream 3 ticket 12".
std::string point(StreamPoint p);

// "{pool 1, slot 4, gen 2}": a device allocation's handle.
std::string handle(const DeviceHandle& h);

// Reading. `text` without leading and trailing spaces and tabs.
std::string_view trimmed(std::string_view text) noexcept;
// The decimal integer that is all of `text` (no sign, no spaces); nullopt for
// anything else, including a value over 2^64-1.
std::optional<std::uint64_t> parse_u64(std::string_view text) noexcept;

}  // namespace ferry::text
