// The transfer engine's cache of source hashes: the immutable host regions
// registered with TransferEngine::register_immutable, and the hashes of the
// ranges inside them that verify has needed, keyed by (address, bytes). Only
// ranges inside a registered region are cached, since only their bytes cannot
// change under the cache.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

#include "ferry/host_arena.hpp"

namespace ferry::detail {

// Invariant: every key of hashes_ lies inside one entry of regions_.
// Thread safety: every method may be called from any thread. Its own mutex is
// never held with another lock, nor while hashing.
class SourceHashCache {
 public:
  // The content_hash of [ptr, ptr + bytes): cached when the range lies inside a
  // registered region, hashed (host time proportional to the bytes) otherwise.
  std::uint64_t hash(const std::byte* ptr, std::uint64_t bytes);

  // Records region `id` over [ptr, ptr + bytes), whose content_hash is `hash`
  // (nullopt: the whole region's bytes are never present at once, so no hash of it
  // is cached; its sub-ranges are hashed on first use).
  void add_region(const std::byte* ptr, std::uint64_t bytes, RegionId id, std::optional<std::uint64_t> hash);
  // Whether [ptr, ptr + bytes) is non-empty and lies inside one registered region
  // (`immutable`: one registered with a hash, whose bytes are always present).
  bool inside_region(const std::byte* ptr, std::uint64_t bytes, bool immutable = false) const;
  // Forgets region `id` and every hash cached inside it (nothing if unknown).
  void forget_region(RegionId id);

 private:
  using Key = std::pair<std::uintptr_t, std::uint64_t>;  // (start, bytes)

  struct Region {
    std::uint64_t bytes = 0;
    RegionId id = 0;
    bool generated = false;  // registered without a hash: bytes present only while staged
  };
  // The registered region [start, start + bytes) lies inside, or null. Under mu_.
  const Region* region_of(std::uintptr_t start, std::uint64_t bytes) const;

  mutable std::mutex mu_;  // guards everything below
  std::map<Key, std::uint64_t> hashes_;
  std::map<std::uintptr_t, Region> regions_;  // by start
};

}  // namespace ferry::detail
