// ferry — the granule map (internal): what is mapped under one address range.
//
// Pure: no locks, no device, no backend, no byte counts. Per granule of a range:
// the pending placements that touch it (freed blocks whose work has not
// completed), whether physical memory is mapped under it, whether it is on the
// cached list, and whether a driver call on it is under way (busy). The live
// placements touching each granule are counted by the range's placement core,
// passed in where they matter (`live`). The map decides which granules to map
// and which to unmap; its owner runs the driver calls (outside its lock, on busy
// granules) and reports how they ended (end_map, end_unmap).
//
// Invariants (validate()):
//   granule g is in use   <=>  live.ref_at(g) > 0  or  pending_ref(g) > 0
//   in use                 =>  mapped, unless busy being unmapped (never: nobody
//                              unmaps a granule in use)
//   busy                   =>  (mapped <=> in use): a map runs for a placement that
//                              holds its references; an unmap for a granule nobody uses
//   fresh                  =>  busy (mapped by the placement under way)
//   mapped, not in use, not busy  =>  on the cached list (cached)
//   the cached list holds each granule at most once, exactly the listed ones
//   busy_count() == #busy, unmapping_count() == #(busy, not mapped)
// Not thread-safe: the owner serializes.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "pool/placement_core.hpp"

namespace ferry::detail {

class GranuleMap {
 public:
  static constexpr std::uint8_t kMapped = 1;  // physical memory mapped under it
  static constexpr std::uint8_t kListed = 2;  // on the cached list
  static constexpr std::uint8_t kFresh = 4;   // mapped by the begin_map under way
  // A driver call on it runs: with kMapped it is being mapped (in use by that
  // placement), without it unmapped (in use by nobody). Nobody places over it.
  static constexpr std::uint8_t kBusy = 8;

  // A run of granules to map with one call: the first, and how many.
  using Run = std::pair<std::uint64_t, std::uint64_t>;

  // Granules the map covers so far: a prefix of the range, as the core's counts.
  std::uint64_t granules() const noexcept { return flags_.size(); }
  // Reserves n granules (every array before any grows, so a throw changes
  // nothing), then covers them; the cached list never allocates after this.
  void reserve(std::uint64_t n) {
    pending_.reserve(n);
    flags_.reserve(n);
    cached_.reserve(n);
  }
  void cover(std::uint64_t n) {
    if (n <= flags_.size()) return;
    pending_.resize(n, 0);
    flags_.resize(n, 0);
  }

  // --- references ---------------------------------------------------------------

  std::uint32_t pending_ref(std::uint64_t g) const { return pending_[g]; }
  void take_pending(std::uint64_t first, std::uint64_t last) {
    for (std::uint64_t g = first; g <= last; ++g) ++pending_[g];
  }
  // Drops one pending reference of g; returns what is left.
  std::uint32_t drop_pending(std::uint64_t g) { return --pending_[g]; }
  bool in_use(const PlacementCore& live, std::uint64_t g) const {
    return live.ref_at(g) > 0 || pending_[g] > 0;
  }
  // Granules of [first, last] no placement, live or pending, touches.
  std::uint64_t unused_in(const PlacementCore& live, std::uint64_t first, std::uint64_t last) const {
    std::uint64_t n = 0;
    for (std::uint64_t g = first; g <= last; ++g) n += in_use(live, g) ? 0 : 1;
    return n;
  }

  // --- state --------------------------------------------------------------------

  std::uint8_t flags(std::uint64_t g) const { return flags_[g]; }
  bool mapped(std::uint64_t g) const { return flags_[g] & kMapped; }
  // Mapped, and nobody touches it: memory to evict or trim.
  bool cached(const PlacementCore& live, std::uint64_t g) const { return mapped(g) && !in_use(live, g); }
  std::uint64_t busy_count() const noexcept { return busy_; }
  std::uint64_t unmapping_count() const noexcept { return unmapping_; }
  // True when a driver call runs on a granule of [first, last].
  bool span_busy(std::uint64_t first, std::uint64_t last) const {
    if (busy_ == 0) return false;
    for (std::uint64_t g = first; g <= last; ++g)
      if (flags_[g] & kBusy) return true;
    return false;
  }
  const std::vector<std::uint32_t>& cached_list() const noexcept { return cached_; }

  // g became cached: it goes on the cached list (once).
  void list_cached(std::uint64_t g) {
    if (flags_[g] & kListed) return;
    flags_[g] |= kListed;
    cached_.push_back(static_cast<std::uint32_t>(g));
  }

  // --- mapping --------------------------------------------------------------------

  // The runs of unmapped granules in [first, last], in order.
  void unmapped_runs(std::uint64_t first, std::uint64_t last, std::vector<Run>& out) const;
  // Cached granules of [first, last] (mapped, unused, not busy) that the
  // placement taking their references now puts back in use.
  std::uint64_t reused_cached(const PlacementCore& live, std::uint64_t first, std::uint64_t last) const {
    std::uint64_t n = 0;
    for (std::uint64_t g = first; g <= last; ++g) n += (!(flags_[g] & kFresh) && !in_use(live, g)) ? 1 : 0;
    return n;
  }
  // The runs' granules count as mapped from here (fresh, busy) until end_map.
  void begin_map(const std::vector<Run>& runs);
  // How a placement over [first, last] whose maps ran ended: mapped (its fresh
  // granules become plain mapped), or not (they become unmapped again, and the
  // placement's live references in `live` are dropped, fresh and reused alike).
  struct MapEnd {
    std::uint64_t fresh = 0;      // granules begin_map marked
    std::uint64_t to_cached = 0;  // reused granules cached again (not mapped only)
  };
  MapEnd end_map(PlacementCore& live, std::uint64_t first, std::uint64_t last, bool mapped);

  // --- unmapping ----------------------------------------------------------------

  // Cached granule g goes to the driver: unmapped from here, busy until end_unmap.
  void begin_unmap(std::uint64_t g) {
    flags_[g] = static_cast<std::uint8_t>((flags_[g] & ~kMapped) | kBusy);
    ++busy_;
    ++unmapping_;
  }
  // g's unmap returned; a failed one leaves it mapped and cached again, at the
  // front of the cached list, so it is evicted last.
  void end_unmap(std::uint64_t g, bool ok);

  // Picks cached granules to unmap, from the back of the list (the most recently
  // cached first), until `want` are picked or none is left, skipping
  // [keep_first, keep_last] (a placement under way; keep_first > keep_last keeps
  // none): begin_unmap, then unmap(g) for each. Returns how many it picked.
  template <class Unmap>
  std::uint64_t evict(const PlacementCore& live, std::uint64_t want, std::uint64_t keep_first,
                      std::uint64_t keep_last, Unmap&& unmap) {
    std::uint64_t picked = 0;
    for (std::size_t i = cached_.size(); i-- > 0 && picked < want;) {
      const std::uint32_t g = cached_[i];
      const bool is_cached = cached(live, g);
      if (is_cached && g >= keep_first && g <= keep_last) continue;
      if (is_cached) {
        begin_unmap(g);
        unmap(g);
        ++picked;
      }
      flags_[g] &= static_cast<std::uint8_t>(~kListed);
      cached_[i] = cached_.back();
      cached_.pop_back();
    }
    return picked;
  }

  // Walks the cached list in order: a granule still cached is unmapped
  // (begin_unmap, unmap(g)) while wanted() says so, else it stays listed; stale
  // entries leave the list. O(granules that became cached since the last walk).
  template <class Wanted, class Unmap>
  void sweep(const PlacementCore& live, Wanted&& wanted, Unmap&& unmap) {
    std::size_t kept = 0;
    for (std::size_t i = 0; i < cached_.size(); ++i) {
      const std::uint32_t g = cached_[i];
      const bool is_cached = cached(live, g);
      if (is_cached && !wanted()) {
        cached_[kept++] = g;
        continue;
      }
      if (is_cached) {
        begin_unmap(g);
        unmap(g);
      }
      flags_[g] &= static_cast<std::uint8_t>(~kListed);
    }
    cached_.resize(kept);
  }

  // What validate counted, for the owner to check against its byte counts.
  struct Tally {
    std::uint64_t mapped = 0, cached = 0;
  };
  // The invariants above; `pending` the pending references counted from the
  // owner's pending placements (per granule, granules() of them).
  bool validate(const PlacementCore& live, const std::vector<std::uint32_t>& pending, Tally& t,
                std::string* why = nullptr) const;

 private:
  std::vector<std::uint32_t> pending_;  // pending placements touching each granule (stay mapped)
  std::vector<std::uint8_t> flags_;
  std::vector<std::uint32_t> cached_;  // granules that became cached (entries may be stale)
  std::uint64_t busy_ = 0;             // granules flagged kBusy
  std::uint64_t unmapping_ = 0;        // busy granules not mapped: being unmapped
};

}  // namespace ferry::detail
