// The source hash cache (source_hash_cache.hpp) and the engine's calls that
// fill and empty it: register_immutable, register_generated, precompute_hash,
// unregister.
#include "transfer/source_hash_cache.hpp"

#include <iterator>

#include "ferry/content.hpp"
#include "transfer/engine_state.hpp"

namespace ferry {
namespace detail {

const SourceHashCache::Region* SourceHashCache::region_of(std::uintptr_t start, std::uint64_t bytes) const {
  auto it = regions_.upper_bound(start);
  if (it == regions_.begin()) return nullptr;
  --it;
  return fits(start - it->first, bytes, it->second.bytes) ? &it->second : nullptr;
}

std::uint64_t SourceHashCache::hash(const std::byte* ptr, std::uint64_t bytes) {
  const Key key{reinterpret_cast<std::uintptr_t>(ptr), bytes};
  bool cacheable = false;
  {
    std::lock_guard lock(mu_);
    if (auto it = hashes_.find(key); it != hashes_.end()) return it->second;
    cacheable = region_of(key.first, bytes) != nullptr;
  }
  // Hash without the lock: it costs host time proportional to the bytes.
  const std::uint64_t h = content_hash({ptr, bytes});
  if (cacheable) {
    std::lock_guard lock(mu_);
    hashes_.emplace(key, h);
  }
  return h;
}

void SourceHashCache::add_region(const std::byte* ptr, std::uint64_t bytes, RegionId id,
                                 std::optional<std::uint64_t> hash) {
  const auto start = reinterpret_cast<std::uintptr_t>(ptr);
  std::lock_guard lock(mu_);
  regions_[start] = Region{bytes, id, !hash.has_value()};
  if (hash) hashes_[{start, bytes}] = *hash;
}

bool SourceHashCache::inside_region(const std::byte* ptr, std::uint64_t bytes, bool immutable) const {
  std::lock_guard lock(mu_);
  const Region* r = bytes > 0 ? region_of(reinterpret_cast<std::uintptr_t>(ptr), bytes) : nullptr;
  return r != nullptr && !(immutable && r->generated);
}

void SourceHashCache::forget_region(RegionId id) {
  std::lock_guard lock(mu_);
  for (auto it = regions_.begin(); it != regions_.end(); ++it) {
    if (it->second.id != id) continue;
    const std::uintptr_t start = it->first, end = start + it->second.bytes;
    for (auto h = hashes_.lower_bound({start, 0}); h != hashes_.end() && h->first.first < end;) {
      h = hashes_.erase(h);
    }
    regions_.erase(it);
    return;
  }
}

}  // namespace detail

Result<RegionId> TransferEngine::register_immutable(std::byte* ptr, std::uint64_t bytes) {
  auto region = arena_.register_host(ptr, bytes);
  if (!region.ok()) return region;
  state_->source_hashes.add_region(ptr, bytes, *region, content_hash({ptr, bytes}));
  return region;
}

Result<RegionId> TransferEngine::register_generated(std::byte* ptr, std::uint64_t bytes) {
  auto region = arena_.register_host(ptr, bytes);
  if (!region.ok()) return region;
  state_->source_hashes.add_region(ptr, bytes, *region, std::nullopt);
  return region;
}

Result<void> TransferEngine::precompute_hash(const std::byte* ptr, std::uint64_t bytes) {
  // A generated region's bytes are present only while staged: a hash taken now could be of zeros.
  if (!state_->source_hashes.inside_region(ptr, bytes, /*immutable=*/true)) {
    return make_error(ErrorCode::invalid_argument,
                      "precompute_hash(" + std::to_string(bytes) +
                          " bytes): not inside a region registered with register_immutable");
  }
  (void)state_->source_hashes.hash(ptr, bytes);
  return {};
}

Result<void> TransferEngine::unregister(RegionId region) {
  state_->source_hashes.forget_region(region);
  return arena_.unregister_host(region);
}

}  // namespace ferry
