// Device profiles: the figures the sim backend models each GPU with.
//
// Bandwidths and rates are sustained figures (what a well-written kernel or a
// large copy achieves), not datasheet peaks, because the sim reports times that
// benchmarks compare against real runs. Latencies are per operation: one
// host<->device copy pays link_latency_ns, one kernel pays kernel_latency_ns.
#include "ferry/device_profile.hpp"

#include <algorithm>
#include <array>
#include <cctype>

namespace ferry {
namespace {

constexpr std::uint64_t kKiB = std::uint64_t{1} << 10;
constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;
constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;

constexpr std::uint64_t round_down(std::uint64_t bytes, std::uint64_t granularity) {
  return bytes / granularity * granularity;
}

DeviceProfile h200() {
  DeviceProfile p;
  p.name = "h200";
  // 141 GB of HBM3e (decimal, as NVIDIA states it), in whole 2 MiB granules.
  p.granularity = 2 * kMiB;
  p.capacity = round_down(141'000'000'000ull, p.granularity);
  p.mem_bytes_per_s = 4.3e12;       // 4.8 TB/s peak; ~90% sustained by streaming kernels
  p.h2d_bytes_per_s = 52e9;         // PCIe 5.0 x16, pinned
  p.pageable_bytes_per_s = 20e9;    // staged through the driver's bounce buffers
  p.link_latency_ns = 2000;
  p.kernel_latency_ns = 4000;
  p.flops_per_s = 790e12;           // dense BF16, ~80% of the 989 TFLOP/s peak
  p.copy_engines = 2;
  p.peer_bytes_per_s = 370e9;       // NVLink 4, 450 GB/s per direction; ~80% sustained
  p.peer_latency_ns = 2500;
  return p;
}

DeviceProfile rtx4090() {
  DeviceProfile p;
  p.name = "rtx4090";
  p.granularity = 2 * kMiB;
  p.capacity = 24 * kGiB;
  p.mem_bytes_per_s = 1.0e12;       // GDDR6X, 1008 GB/s peak
  p.h2d_bytes_per_s = 23e9;         // PCIe 4.0 x16, pinned
  p.pageable_bytes_per_s = 15e9;
  p.link_latency_ns = 2000;
  p.kernel_latency_ns = 4000;
  p.flops_per_s = 165e12;           // dense BF16 with FP32 accumulate
  p.copy_engines = 2;
  return p;
}

DeviceProfile rtx3090() {
  DeviceProfile p;
  p.name = "rtx3090";
  p.granularity = 2 * kMiB;
  p.capacity = 24 * kGiB;
  p.mem_bytes_per_s = 936e9;        // GDDR6X, datasheet figure
  p.h2d_bytes_per_s = 22e9;         // PCIe 4.0 x16, pinned
  p.pageable_bytes_per_s = 12e9;
  p.link_latency_ns = 2000;
  p.kernel_latency_ns = 4000;
  p.flops_per_s = 71e12;            // dense BF16 with FP32 accumulate
  p.copy_engines = 2;
  p.peer_bytes_per_s = 50e9;        // NVLink 3 bridge, 56.25 GB/s per direction
  p.peer_latency_ns = 2000;
  return p;
}

// Small enough that tests reach capacity with a handful of allocations, and one
// copy engine so that copy ordering is easy to reason about.
DeviceProfile tiny() {
  DeviceProfile p;
  p.name = "tiny";
  p.granularity = 64 * kKiB;
  p.capacity = 64 * kMiB;
  p.mem_bytes_per_s = 100e9;
  p.h2d_bytes_per_s = 10e9;
  p.pageable_bytes_per_s = 5e9;
  p.link_latency_ns = 1000;
  p.kernel_latency_ns = 2000;
  p.flops_per_s = 10e12;
  p.copy_engines = 1;
  p.peer_bytes_per_s = 40e9;
  p.peer_latency_ns = 1000;
  return p;
}

using ProfileFactory = DeviceProfile (*)();
constexpr std::array<ProfileFactory, 4> kProfiles = {h200, rtx4090, rtx3090, tiny};

bool equal_ignoring_case(std::string_view a, std::string_view b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](char x, char y) {
    return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
  });
}

}  // namespace

std::optional<DeviceProfile> find_profile(std::string_view name) {
  for (ProfileFactory make : kProfiles) {
    DeviceProfile p = make();
    if (equal_ignoring_case(p.name, name)) return p;
  }
  return std::nullopt;
}

std::vector<std::string> profile_names() {
  std::vector<std::string> names;
  names.reserve(kProfiles.size());
  for (ProfileFactory make : kProfiles) names.push_back(make().name);
  return names;
}

}  // namespace ferry
