// The C ABI of one offload cache across devices (ferry.h, "Several devices:
// adopted streams on any device, and one offload cache across the devices"):
// ferry_multi_cache_* over the runtime's MultiDeviceCache.
#include <cstddef>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "capi/boundary.hpp"
#include "capi/struct_prefix.hpp"
#include "ferry/multi_device_cache.hpp"

namespace ferry::capi {
namespace {

// The runtime's cache across devices, or invalid_argument naming `fn`. The cache,
// once made, lives as long as `rt`: the pointer stays valid after the lock.
Result<MultiDeviceCache*> multi_cache_of(ferry_runtime rt, const char* fn) {
  std::lock_guard lock(rt->multi_cache_mu);
  if (!rt->multi_cache) {
    return make_error(ErrorCode::invalid_argument,
                      std::string(fn) + ": the runtime has no cache across devices (ferry_multi_cache_create)");
  }
  return rt->multi_cache.get();
}

}  // namespace
}  // namespace ferry::capi

using namespace ferry::capi;

ferry_status ferry_multi_cache_create(ferry_runtime rt, uint32_t slots, uint64_t slot_bytes, const char* placement) {
  return guarded("ferry_multi_cache_create", [&] {
    if (rt == nullptr) return null_argument("ferry_multi_cache_create", "rt");
    ferry::MultiDeviceCacheOptions options;
    options.cache.slots = slots;
    options.cache.slot_bytes = slot_bytes;
    if (placement != nullptr) {
      auto p = ferry::parse_device_placement(placement);
      if (!p.ok()) return fail(p.error());
      options.placement = *p;
    }
    // Held while the caches are made (never blocks): a second create sees the first.
    std::lock_guard lock(rt->multi_cache_mu);
    if (rt->multi_cache) {
      return fail(ferry::make_error(ferry::ErrorCode::invalid_argument,
                                    "ferry_multi_cache_create: the runtime has its cache across devices already"));
    }
    auto made = ferry::MultiDeviceCache::create(runtime_of(rt), options);
    if (!made.ok()) return fail(made.error());
    rt->multi_cache = std::move(made).value();
    return ok();
  });
}

ferry_status ferry_multi_cache_define(ferry_runtime rt, uint64_t key, const void* const* pieces,
                                      const uint64_t* piece_bytes, uint32_t count) {
  return guarded("ferry_multi_cache_define", [&] {
    if (rt == nullptr) return null_argument("ferry_multi_cache_define", "rt");
    if (pieces == nullptr && count != 0) return null_argument("ferry_multi_cache_define", "pieces");
    if (piece_bytes == nullptr && count != 0) return null_argument("ferry_multi_cache_define", "piece_bytes");
    auto cache = multi_cache_of(rt, "ferry_multi_cache_define");
    if (!cache.ok()) return fail(cache.error());
    std::vector<std::span<const std::byte>> spans;
    for (uint32_t i = 0; i < count; ++i) {
      if (pieces[i] == nullptr) return null_argument("ferry_multi_cache_define", "a piece");
      spans.emplace_back(static_cast<const std::byte*>(pieces[i]), piece_bytes[i]);
    }
    return done((*cache)->define(key, std::move(spans)));
  });
}

ferry_status ferry_multi_cache_placed(ferry_runtime rt, uint64_t key, uint32_t* device) {
  return guarded("ferry_multi_cache_placed", [&] {
    if (rt == nullptr) return null_argument("ferry_multi_cache_placed", "rt");
    if (device == nullptr) return null_argument("ferry_multi_cache_placed", "device");
    auto cache = multi_cache_of(rt, "ferry_multi_cache_placed");
    if (!cache.ok()) return fail(cache.error());
    auto d = (*cache)->placed(key);
    if (!d.ok()) return fail(d.error());
    *device = *d;
    return ok();
  });
}

ferry_status ferry_multi_cache_acquire(ferry_runtime rt, uint64_t key, uint32_t device, uint32_t stream,
                                       ferry_handle* slot, uint64_t* offsets, int* hit, int* from_peer) {
  return guarded("ferry_multi_cache_acquire", [&] {
    if (rt == nullptr) return null_argument("ferry_multi_cache_acquire", "rt");
    if (slot == nullptr) return null_argument("ferry_multi_cache_acquire", "slot");
    auto cache = multi_cache_of(rt, "ferry_multi_cache_acquire");
    if (!cache.ok()) return fail(cache.error());
    auto ref = (*cache)->acquire(key, device, stream);
    if (!ref.ok()) return fail(ref.error());
    const ferry::DeviceHandle h = ref->ref.slot;
    *slot = ferry_handle{h.pool, h.slot, h.generation};
    if (offsets != nullptr) {
      for (std::size_t i = 0; i < ref->ref.pieces.size(); ++i) offsets[i] = ref->ref.pieces[i].offset;
    }
    if (hit != nullptr) *hit = ref->ref.hit ? 1 : 0;
    if (from_peer != nullptr) *from_peer = ref->from_peer ? 1 : 0;
    return ok();
  });
}

ferry_status ferry_multi_cache_release(ferry_runtime rt, uint64_t key, uint32_t device) {
  return guarded("ferry_multi_cache_release", [&] {
    if (rt == nullptr) return null_argument("ferry_multi_cache_release", "rt");
    auto cache = multi_cache_of(rt, "ferry_multi_cache_release");
    if (!cache.ok()) return fail(cache.error());
    return done((*cache)->release(key, device));
  });
}

ferry_status ferry_get_multi_cache_stats_sized(ferry_runtime rt, ferry_multi_cache_stats* out, size_t struct_size) {
  constexpr const char* fn = "ferry_get_multi_cache_stats_sized";
  return guarded(fn, [&] {
    if (rt == nullptr) return null_argument(fn, "rt");
    if (out == nullptr) return null_argument(fn, "out");
    auto cache = multi_cache_of(rt, fn);
    if (!cache.ok()) return fail(cache.error());
    const ferry::MultiDeviceCacheStats s = (*cache)->stats();
    const ferry_multi_cache_stats value{sizeof(ferry_multi_cache_stats), s.peer_fills, s.host_fills, s.bytes_peer};
    return done(ferry::detail::write_prefix(value, out, ferry::detail::size_argument(struct_size),
                                            FERRY_MULTI_CACHE_STATS_V1_SIZE, fn, "ferry_multi_cache_stats"));
  });
}

ferry_status ferry_get_multi_cache_device_stats_sized(ferry_runtime rt, uint32_t device, ferry_cache_stats* out,
                                                      size_t struct_size) {
  constexpr const char* fn = "ferry_get_multi_cache_device_stats_sized";
  return guarded(fn, [&] {
    if (rt == nullptr) return null_argument(fn, "rt");
    if (out == nullptr) return null_argument(fn, "out");
    auto cache = multi_cache_of(rt, fn);
    if (!cache.ok()) return fail(cache.error());
    if (device >= (*cache)->device_count()) {
      return fail(ferry::make_error(ferry::ErrorCode::invalid_argument,
                                    std::string(fn) + ": no device " + std::to_string(device) + ": the runtime has " +
                                        std::to_string((*cache)->device_count()) + " device(s)"));
    }
    const ferry::CacheStats s = (*cache)->device_cache(device).stats();
    const ferry_cache_stats value{sizeof(ferry_cache_stats), s.hits, s.misses, s.evictions, s.uploads,
                                  s.bytes_uploaded, s.prefetches};
    return done(ferry::detail::write_prefix(value, out, ferry::detail::size_argument(struct_size),
                                            FERRY_CACHE_STATS_V1_SIZE, fn, "ferry_cache_stats"));
  });
}
