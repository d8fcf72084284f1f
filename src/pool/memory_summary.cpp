// memory_summary(): the pool's figures as one table (device_pool.hpp).
#include "ferry/device_pool.hpp"

#include <array>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "core/text.hpp"

namespace ferry {
namespace {

constexpr std::uint64_t KiB = 1024, MiB = KiB * 1024;

struct SizeClass {
  std::string_view label;
  std::uint64_t up_to;  // inclusive; the last class takes the rest
};
// The buckets device_pool.hpp states; change both together.
constexpr std::array<SizeClass, 5> kSizeClasses = {{
    {"<= 1 KiB", KiB},
    {"<= 64 KiB", 64 * KiB},
    {"<= 1 MiB", MiB},
    {"<= 16 MiB", 16 * MiB},
    {"> 16 MiB", UINT64_MAX},
}};

constexpr std::string_view kRule =
    "-----------------------------------------------------------------\n";

std::string bytes(std::uint64_t b) { return text::human_bytes(b, 2); }

void row(std::string& out, std::string_view label, const std::string& current,
         const std::string& peak) {
  char buf[160];
  std::snprintf(buf, sizeof buf, " %-26.*s %16s %16s", static_cast<int>(label.size()), label.data(),
                current.c_str(), peak.c_str());
  std::string line = buf;
  line.erase(line.find_last_not_of(' ') + 1);  // a row without a peak ends at its count
  out += line + "\n";
}

void count_row(std::string& out, std::string_view label, std::uint64_t a, std::uint64_t b) {
  row(out, label, std::to_string(a), std::to_string(b));
}

}  // namespace

std::string memory_summary(const DevicePool& pool) {
  const PoolStats s = pool.stats();
  const std::vector<BlockInfo> blocks = pool.snapshot();
  const std::uint64_t largest = pool.largest_free_extent();

  std::array<std::uint64_t, kSizeClasses.size()> live{}, pending{};
  for (const BlockInfo& b : blocks) {
    std::size_t c = 0;
    while (b.bytes > kSizeClasses[c].up_to) ++c;  // the last class's bound is UINT64_MAX
    if (b.state == BlockInfo::State::live) ++live[c];
    else if (b.state == BlockInfo::State::pending_free) ++pending[c];
  }

  std::string out;
  out += kRule;
  out += " ferry device pool memory summary, capacity " + bytes(pool.capacity()) + "\n";
  out += kRule;
  row(out, "Memory", "current", "peak");
  row(out, "Allocated", bytes(s.allocated_bytes), bytes(s.peak_allocated_bytes));
  row(out, "Requested", bytes(s.requested_bytes), bytes(s.peak_requested_bytes));
  row(out, "Reserved", bytes(s.reserved_bytes), bytes(s.peak_reserved_bytes));
  row(out, "Active", bytes(s.active_bytes), bytes(s.peak_active_bytes));
  row(out, "Pending free", bytes(s.pending_free_bytes), "-");
  row(out, "Cached", bytes(s.cached_bytes), "-");
  row(out, "Largest free extent", bytes(largest), "-");
  out += kRule;
  row(out, "Events", "count", "");
  row(out, "Allocs", std::to_string(s.allocs), "");
  row(out, "Frees", std::to_string(s.frees), "");
  row(out, "Internal allocs", std::to_string(s.internal_allocs), "");
  row(out, "Internal frees", std::to_string(s.internal_frees), "");
  row(out, "OOMs", std::to_string(s.ooms), "");
  row(out, "Reclaims", std::to_string(s.reclaims), "");
  row(out, "OOMs survived", std::to_string(s.ooms_survived), "");
  out += kRule;
  row(out, "Blocks by size", "live", "pending free");
  std::uint64_t live_total = 0, pending_total = 0;
  for (std::size_t c = 0; c < kSizeClasses.size(); ++c) {
    count_row(out, kSizeClasses[c].label, live[c], pending[c]);
    live_total += live[c];
    pending_total += pending[c];
  }
  count_row(out, "All", live_total, pending_total);
  out += kRule;
  return out;
}

}  // namespace ferry
