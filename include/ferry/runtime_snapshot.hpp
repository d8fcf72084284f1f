// ferry — one snapshot of every device of a Runtime (docs/scale.md): each
// device's pool snapshot (pool_snapshot.hpp) under its index, and their totals.
//
//   capacity == sum of devices[i].capacity
//   stats    == total_pool_stats(devices[i].stats)   (devices.hpp: peaks summed)
//
// Thread safety: as take_snapshot(const DevicePool&): each pool is read under its
// own lock, one device after another, so a runtime other threads are changing
// meanwhile is not seen at one instant. Never blocks on the device.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ferry/api.hpp"
#include "ferry/device_pool.hpp"
#include "ferry/pool_snapshot.hpp"

namespace ferry FERRY_API {

class Runtime;

struct RuntimeSnapshot {
  std::vector<PoolSnapshot> devices;  // devices[i]: device i's pool
  std::uint64_t capacity = 0;         // the devices' capacities summed
  PoolStats stats;                    // the devices' figures summed
};

// Reads every device's pool. `owners` names live blocks of any device: a handle
// labels the block it resolves to in its own device's pool (handles name their
// pool); stale handles are ignored.
RuntimeSnapshot take_snapshot(Runtime& rt, std::span<const NamedHandle> owners = {});

// One JSON object. One device: exactly snapshot_json of its pool (the one-device
// form, byte for byte). Several:
//   {"capacity", "stats": {the totals, PoolStats' fields},
//    "devices": [{"device": i, then snapshot_json(devices[i])'s keys}, ...]}
// so a reader of the one-device form finds the totals under the same keys.
std::string snapshot_json(const RuntimeSnapshot& snapshot);

}  // namespace ferry
