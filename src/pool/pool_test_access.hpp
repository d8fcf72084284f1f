// Test-only access to DevicePool's internals: states a test cannot reach through
// the API in reasonable time (a slot 2^32 frees old). Nothing outside tests/ calls it.
#pragma once

#include <cstdint>

#include "ferry/device_pool.hpp"

namespace ferry::detail {

// Hidden: linked into the tests from the static library, never exported by libferry.so.
struct FERRY_HIDDEN PoolTestAccess {
  // Sets the generation of a free (spare) slot, so the next allocation that takes
  // the slot hands it out at `generation`. False when the slot is not free or
  // `generation` is 0.
  static bool set_free_slot_generation(DevicePool& pool, std::uint32_t slot, std::uint32_t generation);
  // Callers asleep until another caller's map or unmap returns (a test waits for
  // one to be there before it lets the driver call go).
  static std::uint32_t driver_waiters(const DevicePool& pool);
};

}  // namespace ferry::detail
