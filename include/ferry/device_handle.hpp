// ferry — the value that names a pool block (DevicePool, device_pool.hpp).
// Invariant I1 (docs/spec.md §2): a handle resolves only to the allocation it was
// returned for; a stale, foreign or forged one answers stale_handle.
#pragma once

#include <cstdint>

#include "ferry/api.hpp"

namespace ferry FERRY_API {

// (pool, slot, generation). {0,0,0} is the null handle and never resolves.
struct DeviceHandle {
  std::uint32_t pool = 0;
  std::uint32_t slot = 0;
  std::uint32_t generation = 0;
  friend bool operator==(const DeviceHandle&, const DeviceHandle&) = default;
};

}  // namespace ferry
