// ferry — device profiles: the numbers the sim backend models a GPU with.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/api.hpp"

namespace ferry FERRY_API {

struct DeviceProfile {
  std::string name;
  std::uint64_t capacity = 0;          // device memory, bytes
  std::uint64_t granularity = 0;       // physical mapping unit, bytes (power of two)
  double mem_bytes_per_s = 0;          // device memory bandwidth
  double h2d_bytes_per_s = 0;          // host<->device, pinned
  double pageable_bytes_per_s = 0;     // host<->device from pageable memory
  double link_latency_ns = 0;          // per host<->device copy
  double kernel_latency_ns = 0;        // per kernel launch
  double flops_per_s = 0;              // bf16 dense
  std::uint32_t copy_engines = 0;      // DMA engines; the sim still runs one copy per link direction at a time
  // An NVLink-class link to a peer device (a bridge or a switch), per direction;
  // 0: the device has none, and its peer copies run over PCIe at h2d_bytes_per_s
  // and link_latency_ns. Which pairs are linked is DevicesOptions::links's.
  double peer_bytes_per_s = 0;
  double peer_latency_ns = 0;          // per peer copy over that link
};

// Presets: "h200", "rtx4090", "rtx3090", "tiny". Unknown name: nullopt.
std::optional<DeviceProfile> find_profile(std::string_view name);
std::vector<std::string> profile_names();

}  // namespace ferry
