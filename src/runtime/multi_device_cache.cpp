// MultiDeviceCache: one offload cache across the devices of a Runtime
// (multi_device_cache.hpp): placement, and peer fills chosen by the cost model.
#include "ferry/multi_device_cache.hpp"

#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>

#include "ferry/cost_model.hpp"
#include "ferry/make_backend.hpp"
#include "ferry/names.hpp"
#include "ferry/runtime.hpp"

namespace ferry {
namespace {

std::string key_text(CacheKey key) { return "cache entry " + std::to_string(key); }

// An entry's extent in its slot: its last piece's end.
std::uint64_t extent_of(const CacheRef& ref) {
  return ref.pieces.empty() ? 0 : ref.pieces.back().offset + ref.pieces.back().bytes;
}

constexpr NamedValue<DevicePlacement> kPlacementNames[] = {{DevicePlacement::round_robin, "round_robin"},
                                                           {DevicePlacement::most_room, "most_room"}};

}  // namespace

std::string_view to_string(DevicePlacement placement) noexcept {
  return name_in<DevicePlacement>(kPlacementNames, placement);
}

Result<DevicePlacement> parse_device_placement(std::string_view text) {
  return value_in<DevicePlacement>(kPlacementNames, text, "placement");
}

struct MultiDeviceCache::Impl {
  Runtime& rt;
  MultiDeviceCacheOptions options;
  std::vector<std::unique_ptr<OffloadCache>> caches;  // one per device, in device order
  std::vector<std::optional<DeviceProfile>> profiles;  // none: no cost model (a real device)

  mutable std::mutex mu;  // guards what follows; never held across a cache or copy call
  std::unordered_map<CacheKey, std::uint32_t> order;  // key -> definition index
  std::uint64_t peer_fills = 0, host_fills = 0, bytes_peer = 0;

  Impl(Runtime& r, MultiDeviceCacheOptions o) : rt(r), options(std::move(o)) {}

  Result<void> check_device(std::uint32_t device, const char* what) const {
    if (device < caches.size()) return {};
    return make_error(ErrorCode::invalid_argument, std::string(what) + ": device " + std::to_string(device) +
                                                       " is not one of the runtime's " +
                                                       std::to_string(caches.size()));
  }

  // Whether filling `to`'s slot from `from`'s copy is modeled faster than the
  // upload from the host; a pair without a link stages through the host, so never.
  bool peer_is_faster(std::uint32_t from, std::uint32_t to, std::uint64_t bytes) const {
    const PeerLink link = rt.link_between(from, to);
    if (link == PeerLink::none || !profiles[to]) return false;
    const PinnedQuery pinned = [](const std::byte*, std::uint64_t) { return true; };
    const DeviceRange dst{0, bytes};
    const std::uint64_t peer = modeled_ns(Op{PeerCopyOp{dst, nullptr, 0, link}}, *profiles[to], pinned);
    const std::uint64_t host = modeled_ns(Op{CopyToDeviceOp{dst, nullptr}}, *profiles[to], pinned);
    return peer < host;
  }

  std::uint32_t placed_locked(CacheKey key, std::uint32_t index) const {
    const auto n = static_cast<std::uint32_t>(caches.size());
    if (options.placement == DevicePlacement::round_robin) return index % n;
    for (std::uint32_t d = 0; d < n; ++d) {
      if (caches[d]->resident(key)) return d;
    }
    std::uint32_t best = 0;
    for (std::uint32_t d = 1; d < n; ++d) {
      if (caches[d]->occupied() < caches[best]->occupied()) best = d;
    }
    return best;
  }

  // The first device other than `to` holding `key` whose link makes a peer fill
  // faster; nullopt when none.
  std::optional<std::uint32_t> peer_source(CacheKey key, std::uint32_t to) const {
    for (std::uint32_t d = 0; d < caches.size(); ++d) {
      if (d == to || !caches[d]->resident(key)) continue;
      if (peer_is_faster(d, to, caches[d]->slot_bytes())) return d;
    }
    return std::nullopt;
  }

  // Fills `to`'s slot for `key` from `from`'s copy, pinned on `from` (on the
  // upload stream, which copy_peer's source leg runs on) until copy_peer returns;
  // copy_peer leases both slots (I2). nullopt: `from` lost the entry meanwhile.
  Result<std::optional<DeviceCacheRef>> fill_from(CacheKey key, std::uint32_t from, std::uint32_t to,
                                                  StreamId stream) {
    Result<std::optional<CacheRef>> source = caches[from]->acquire_if_resident(key, options.cache.upload_stream);
    if (!source.ok()) return std::move(source).error();
    if (!*source) return std::optional<DeviceCacheRef>();
    const DeviceHandle from_slot = (*source)->slot;
    const std::uint64_t bytes = extent_of(**source);
    bool filled = false;
    const OffloadCache::SlotFill fill = [&](DeviceHandle slot, StreamId s) -> Result<StreamPoint> {
      filled = true;
      Result<PeerCopyReceipt> c = rt.copy_peer(slot, 0, from_slot, 0, bytes, s);
      if (!c.ok()) return std::move(c).error();
      return c->done;
    };
    Result<CacheRef> got = caches[to]->acquire_filled(key, stream, fill);
    (void)caches[from]->release(key);  // pinned above: cannot fail
    if (!got.ok()) return std::move(got).error();
    if (filled) {
      std::lock_guard lock(mu);
      ++peer_fills;
      bytes_peer += bytes;
    }
    return std::optional<DeviceCacheRef>(DeviceCacheRef{to, std::move(*got), filled});
  }
};

MultiDeviceCache::MultiDeviceCache(std::unique_ptr<Impl> impl) noexcept : impl_(std::move(impl)) {}
MultiDeviceCache::~MultiDeviceCache() = default;

Result<std::unique_ptr<MultiDeviceCache>> MultiDeviceCache::create(Runtime& rt, MultiDeviceCacheOptions options) {
  auto impl = std::make_unique<Impl>(rt, std::move(options));
  Result<std::vector<BackendSpec>> specs = device_specs(rt.options().backend, rt.options().devices);
  for (std::uint32_t d = 0; d < rt.device_count(); ++d) {
    impl->caches.push_back(std::make_unique<OffloadCache>(rt.device(d).engine(), impl->options.cache));
    FERRY_TRY(impl->caches.back()->status());
    std::optional<DeviceProfile> profile;
    if (specs.ok() && d < specs->size() && rt.device(d).backend().info().profiled) {
      if (Result<DeviceProfile> p = spec_profile((*specs)[d]); p.ok()) profile = *p;
    }
    impl->profiles.push_back(std::move(profile));
  }
  return std::unique_ptr<MultiDeviceCache>(new MultiDeviceCache(std::move(impl)));
}

Result<void> MultiDeviceCache::define(CacheKey key, std::vector<std::span<const std::byte>> pieces) {
  Impl& p = *impl_;
  for (auto& cache : p.caches) FERRY_TRY(cache->define(key, pieces));
  std::lock_guard lock(p.mu);
  p.order.emplace(key, static_cast<std::uint32_t>(p.order.size()));
  return {};
}

Result<std::uint32_t> MultiDeviceCache::placed(CacheKey key) const {
  const Impl& p = *impl_;
  std::lock_guard lock(p.mu);
  auto it = p.order.find(key);
  if (it == p.order.end()) {
    return make_error(ErrorCode::invalid_argument, "placed: " + key_text(key) + " was never defined");
  }
  return p.placed_locked(key, it->second);
}

Result<DeviceCacheRef> MultiDeviceCache::acquire(CacheKey key, StreamId stream) {
  Result<std::uint32_t> device = placed(key);
  if (!device.ok()) return std::move(device).error();
  return acquire(key, *device, stream);
}

Result<DeviceCacheRef> MultiDeviceCache::acquire(CacheKey key, std::uint32_t device, StreamId stream) {
  Impl& p = *impl_;
  FERRY_TRY(p.check_device(device, ("acquire " + key_text(key)).c_str()));
  if (!p.caches[device]->resident(key)) {
    if (const std::optional<std::uint32_t> from = p.peer_source(key, device)) {
      Result<std::optional<DeviceCacheRef>> r = p.fill_from(key, *from, device, stream);
      if (!r.ok()) return std::move(r).error();
      if (*r) return std::move(**r);
    }
  }
  Result<CacheRef> got = p.caches[device]->acquire(key, stream);
  if (!got.ok()) return std::move(got).error();
  if (!got->hit) {  // this acquire uploaded it
    std::lock_guard lock(p.mu);
    ++p.host_fills;
  }
  return DeviceCacheRef{device, std::move(*got), false};
}

Result<void> MultiDeviceCache::release(CacheKey key, std::uint32_t device) {
  FERRY_TRY(impl_->check_device(device, ("release " + key_text(key)).c_str()));
  return impl_->caches[device]->release(key);
}

std::uint32_t MultiDeviceCache::device_count() const noexcept {
  return static_cast<std::uint32_t>(impl_->caches.size());
}

bool MultiDeviceCache::resident(CacheKey key, std::uint32_t device) const {
  return device < impl_->caches.size() && impl_->caches[device]->resident(key);
}

OffloadCache& MultiDeviceCache::device_cache(std::uint32_t device) { return *impl_->caches.at(device); }

MultiDeviceCacheStats MultiDeviceCache::stats() const {
  const Impl& p = *impl_;
  MultiDeviceCacheStats s;
  for (const auto& cache : p.caches) s.devices.push_back(cache->stats());
  std::lock_guard lock(p.mu);
  s.peer_fills = p.peer_fills;
  s.host_fills = p.host_fills;
  s.bytes_peer = p.bytes_peer;
  return s;
}

bool MultiDeviceCache::validate(std::string* why) const {
  const Impl& p = *impl_;
  for (std::uint32_t d = 0; d < p.caches.size(); ++d) {
    std::string problem;
    if (!p.caches[d]->validate(&problem)) {
      if (why != nullptr) *why = "device " + std::to_string(d) + "'s cache: " + problem;
      return false;
    }
  }
  return true;
}

}  // namespace ferry
