// ferry — a snapshot of a device pool: every reserved range (segment), which
// granules are mapped or cached in it, every block and its state, and the
// pool's statistics, as a value and as JSON (docs/spec.md §1).
//
//   per segment:  mapped_bytes == sum of mapped runs;  cached runs lie inside mapped runs
//   over all:     stats.reserved_bytes == sum of segments' mapped_bytes
//                 stats.allocated_bytes == sum of live blocks' bytes
//                 stats.pending_free_bytes == sum of pending_free blocks' bytes
// (exact when nothing else used the pool while the snapshot was taken).
//
// Thread safety: take_snapshot() reads the pool through its const observers
// (stats, segments, snapshot), each under the pool's lock; the three reads are
// not one atomic view, so a pool other threads are changing meanwhile may show
// a block that the statistics do not count yet. Never blocks on the device.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/api.hpp"
#include "ferry/device_pool.hpp"

namespace ferry FERRY_API {

struct PoolSnapshot {
  std::uint64_t capacity = 0;  // bytes the pool may map
  PoolStats stats;
  std::vector<SegmentInfo> segments;  // by address
  std::vector<BlockInfo> blocks;      // by address; live and pending_free
  // Who owns each block (e.g. a trace id), same index as `blocks`; "" unknown.
  std::vector<std::string> owners;
};

// A named handle, for labelling the blocks of a snapshot.
struct NamedHandle {
  std::string_view name;
  DeviceHandle handle;
};

// Reads the pool. `owners` names live blocks: each handle that resolves is
// matched to the live block at its address; stale handles are ignored.
PoolSnapshot take_snapshot(const DevicePool& pool, std::span<const NamedHandle> owners = {});

// One JSON object:
//   {"capacity", "stats": {PoolStats' fields},
//    "segments": [{"kind": "small"|"large"|"shared", "base", "bytes", "granule",
//                  "mapped_bytes", "cached_bytes", "mapped": [[addr, bytes]...],
//                  "cached": [[addr, bytes]...]}],
//    "blocks": [{"addr", "bytes", "state": "live"|"pending_free", "stream", "owner"?}]}
// Addresses and sizes are exact unsigned integers.
std::string snapshot_json(const PoolSnapshot& snapshot);

std::string_view to_string(SegmentInfo::Kind kind) noexcept;
std::string_view to_string(BlockInfo::State state) noexcept;

}  // namespace ferry
