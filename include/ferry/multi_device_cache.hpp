// ferry — one offload cache across the devices of a Runtime (docs/scale.md).
//
// Each device has an OffloadCache of its own (offload_cache.hpp: its slots, its
// eviction, its leases); this one places entries on them and moves them between
// them:
//   * Placement: the device an entry goes to when a caller names none
//     (acquire(key, stream)). round_robin: the entry's definition index modulo
//     the device count, so layers defined in order alternate over the devices;
//     most_room: the device whose cache has the most free slots at that acquire
//     (the lowest index on a tie), kept for the entry while it stays resident.
//   * acquire(key, device, stream) on a device that does not hold the entry fills
//     that device's slot from another device that does (Runtime::copy_peer, which
//     leases both slots and verifies under the engine's policy, I2/I5) when the
//     cost model says the pair's link is faster than the host link
//     (cost_model.hpp: a PeerCopyOp against a CopyToDeviceOp of the entry's bytes
//     on the destination's profile); otherwise it uploads the host pieces. A pair
//     without a link, a backend without a profile: always the host.
//
// Thread safety: every method may be called from any thread (each device's cache
// is thread-safe; the placement table has its own mutex, never held across a
// cache call). acquire() blocks (bounded) as OffloadCache::acquire does, and while
// a peer copy completes.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/api.hpp"
#include "ferry/offload_cache.hpp"
#include "ferry/result.hpp"
#include "ferry/stream.hpp"

namespace ferry FERRY_API {

class Runtime;

enum class DevicePlacement : std::uint8_t { round_robin, most_room };
// "round_robin", "most_room" (the C ABI's and the bindings' names).
std::string_view to_string(DevicePlacement placement) noexcept;
// The placement named `text`. Errors: invalid_argument naming the text and the names.
Result<DevicePlacement> parse_device_placement(std::string_view text);

struct MultiDeviceCacheOptions {
  CacheOptions cache;  // each device's cache, `slots` slots on every device
  DevicePlacement placement = DevicePlacement::round_robin;
};

struct MultiDeviceCacheStats {
  std::vector<CacheStats> devices;  // each device's cache, in device order
  std::uint64_t peer_fills = 0;     // misses filled from another device's copy
  std::uint64_t host_fills = 0;     // misses uploaded from the host pieces
  std::uint64_t bytes_peer = 0;     // bytes the peer fills moved
};

// A pinned entry on one device: release(key, device) unpins it.
struct DeviceCacheRef {
  std::uint32_t device = 0;
  CacheRef ref;
  bool from_peer = false;  // this acquire filled the slot from another device's copy
};

class MultiDeviceCache {
 public:
  // One cache per device of `rt`, which must outlive this. Errors: as the
  // OffloadCache constructor's status() (slots == 0, a bad stream).
  static Result<std::unique_ptr<MultiDeviceCache>> create(Runtime& rt, MultiDeviceCacheOptions options);
  ~MultiDeviceCache();
  MultiDeviceCache(const MultiDeviceCache&) = delete;
  MultiDeviceCache& operator=(const MultiDeviceCache&) = delete;

  // Defines the entry on every device's cache (OffloadCache::define; the bytes
  // must outlive this). Errors: as define's. Never blocks.
  Result<void> define(CacheKey key, std::vector<std::span<const std::byte>> pieces);
  // The device the placement policy gives `key` now. Errors: invalid_argument
  // (undefined key). Never blocks.
  Result<std::uint32_t> placed(CacheKey key) const;
  // acquire(key, placed(key), stream).
  Result<DeviceCacheRef> acquire(CacheKey key, StreamId stream);
  // Makes `key` resident on `device` (a hit there; else a peer fill or a host
  // upload, as the header says), orders `stream` of that device after it, pins
  // it. Errors: invalid_argument (undefined key, no such device), and
  // OffloadCache::acquire's and Runtime::copy_peer's. On error nothing stays
  // pinned. Blocks (bounded).
  Result<DeviceCacheRef> acquire(CacheKey key, std::uint32_t device, StreamId stream);
  // Unpins one acquire of `key` on `device`. Errors: invalid_argument (no such
  // device; not pinned there). Never blocks.
  Result<void> release(CacheKey key, std::uint32_t device);

  std::uint32_t device_count() const noexcept;
  // Resident or in flight on `device` (false for no such device).
  bool resident(CacheKey key, std::uint32_t device) const;
  // The cache of `device` (< device_count()).
  OffloadCache& device_cache(std::uint32_t device);
  MultiDeviceCacheStats stats() const;
  // Every device's cache's validate(); `why` names the device.
  bool validate(std::string* why = nullptr) const;

 private:
  struct Impl;
  explicit MultiDeviceCache(std::unique_ptr<Impl> impl) noexcept;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry
