// DevicePool: mapping. The driver calls that map and unmap granules outside the
// lock, as each region's granule map (granule_map.hpp) decides them, and the byte
// counts (reserved, cached) that follow them.
#include "pool/device_pool_impl.hpp"

namespace ferry {

void DevicePool::Impl::cover(Region& r, std::uint64_t last) {
  if (last < r.place.granules()) return;
  // Growth is geometric, so steady-state work never allocates here.
  const std::uint64_t n = std::min<std::uint64_t>(std::max<std::uint64_t>(last + 1, 2 * r.place.granules()),
                                                  r.place.bytes() >> granule_shift);
  // Every array is reserved before any grows, so a throw leaves their lengths
  // equal; the cached list holds a granule at most once, so no push to it
  // allocates after this.
  r.place.reserve_granules(n);
  r.map.reserve(n);
  r.place.cover_granules(n);
  r.map.cover(n);
}

// Takes references on the granules under [addr, addr+size), mapping the ones
// that are not mapped; `fresh` granules of them are touched by no live block yet.
// Refuses (no_room, nothing changed) when the granules in use would exceed the
// capacity; cached granules elsewhere are unmapped to make room, so whether a
// placement fits depends on the blocks alone, never on what is cached.
// The driver calls run without the lock: the caller holds the allocator node at
// `addr`, so nobody places over it, and its fresh granules stay busy until the
// maps return, so nobody else uses them before they are mapped.
DevicePool::Impl::Referenced DevicePool::Impl::reference_granules(Region& r, std::uint64_t addr, std::uint64_t size, std::uint64_t fresh) {
  auto [first, last] = r.place.granule_span(addr, size);
  cover(r, last);
  if (r.map.span_busy(first, last)) return Referenced::busy;
  if (fresh == 0) {  // every granule is in use, so mapped already
    r.place.take_refs(first, last);
    return Referenced::yes;
  }
  const std::uint64_t unused = r.map.unused_in(r.place, first, last);  // no block, live or pending, touches them
  if (referenced_bytes() + unused * granule > capacity) return Referenced::no_room;
  // Runs of unmapped granules, mapped with one call each. Collected before
  // anything changes, so that an allocation that throws leaves no trace.
  std::vector<detail::GranuleMap::Run> runs;
  r.map.unmapped_runs(first, last, runs);
  const auto ri = static_cast<std::uint8_t>(&r - regions.data());
  if (!runs.empty()) mapping.push_back({ri, addr, size});
  // The runs count as reserved from here, so no other placement counts on their room.
  r.map.begin_map(runs);
  for (const auto& run : runs) st.reserved_bytes += run.second * granule;
  st.cached_bytes -= r.map.reused_cached(r.place, first, last) * granule;  // cached granules back in use
  r.place.take_refs(first, last);
  if (runs.empty()) return Referenced::yes;
  std::size_t runs_mapped = 0;
  Referenced outcome = Referenced::no_room;
  // An eviction whose unmap fails leaves its granule cached, at the front of the
  // list, so the next round evicts others first; a round per granule cached now
  // bounds the rounds (and ends in no_room).
  std::uint64_t rounds = st.cached_bytes / granule + 1;
  try {
    for (; rounds > 0; --rounds) {
      // Memory on its way out is on the device until its unmap returns: the
      // caller's own queued unmaps run before its maps, other callers' are in flight.
      const std::uint64_t others = unmapping_bytes() - queued.size() * granule;
      const std::uint64_t need = st.reserved_bytes + others;
      // Cached granules elsewhere make the room.
      if (need > capacity && !evict_cached(need - capacity, r, first, last)) {
        if (others > 0) outcome = Referenced::busy;  // their unmaps return room: wait for them
        break;
      }
      bool unmapped_all = false;
      without_lock([&](bool all) {
        unmapped_all = all;
        if (!all) return;  // the room counted on an unmap that failed: make it again
        for (; runs_mapped < runs.size(); ++runs_mapped) {
          const std::uint64_t at = r.place.base() + runs[runs_mapped].first * granule;
          const std::uint64_t bytes = runs[runs_mapped].second * granule;
          if (!driver_ok([&] { return backend.map(at, bytes); })) {
            for (std::size_t k = 0; k < runs_mapped; ++k)  // all or nothing
              (void)driver_ok([&] { return backend.unmap(r.place.base() + runs[k].first * granule, runs[k].second * granule); });
            return;
          }
        }
      });
      if (unmapped_all) {
        if (runs_mapped == runs.size()) outcome = Referenced::yes;
        break;
      }
    }
  } catch (const std::bad_alloc&) {  // queueing an eviction: the placement fails and rolls back
    outcome = Referenced::no_room;
  }
  st.maps += runs_mapped;  // successful calls, as counted before a rollback too
  mapping.erase(std::find_if(mapping.begin(), mapping.end(),
                             [&](const Mapping& m) { return m.region == ri && m.addr == addr; }));
  const bool mapped = outcome == Referenced::yes;
  const auto end = r.map.end_map(r.place, first, last, mapped);
  st.cached_bytes += end.to_cached * granule;
  if (!mapped) st.reserved_bytes -= end.fresh * granule;
  driver_done();
  if (mapped) st.peak_reserved_bytes = std::max(st.peak_reserved_bytes, st.reserved_bytes);
  return outcome;
}

// Queues the unmap of cached granules until `bytes` are released (true) or none
// is left (false), except granules [keep_first, keep_last] of `keep` (the
// placement under way). From the back of the list: the most recently cached first.
bool DevicePool::Impl::evict_cached(std::uint64_t bytes, const Region& keep, std::uint64_t keep_first,
                  std::uint64_t keep_last) {
  const std::uint64_t want = (bytes + granule - 1) / granule;
  std::uint64_t picked = 0;
  for (Region& r : regions) {
    if (picked >= want) break;
    const bool here = &r == &keep;  // elsewhere keep nothing: first > last
    picked += r.map.evict(r.place, want - picked, here ? keep_first : 1, here ? keep_last : 0,
                          [&](std::uint64_t g) { queued_unmap(r, g); });
  }
  return picked >= want;
}

// Queues the unmap of every mapped granule that no block touches (or, unless
// `all`, only down to the release threshold). O(granules that became cached
// since the last call), not O(capacity).
void DevicePool::Impl::unmap_unused(bool all) {
  for (Region& r : regions) {
    r.map.sweep(r.place, [&] { return all || st.cached_bytes > options.release_threshold; },
                [&](std::uint64_t g) { queued_unmap(r, g); });
  }
}

void DevicePool::Impl::commit_unmaps(const std::vector<Unmap>& jobs) {
  for (const Unmap& u : jobs) {
    regions[u.region].map.end_unmap(u.granule, u.ok);
    if (u.ok) {
      ++st.unmaps;
      continue;
    }
    st.reserved_bytes += granule;  // still mapped: cached again, evicted last
    st.cached_bytes += granule;
  }
  driver_done();
}

void DevicePool::Impl::await_driver() {
  if (!queued.empty()) {  // this caller's unmaps first, committed: others may need their room
    settle();
    return;
  }
  const std::uint32_t seen = driver_epoch.load(std::memory_order_relaxed);
  ++driver_waiters;
  without_lock([&](bool) { driver_epoch.wait(seen, std::memory_order_acquire); });
  --driver_waiters;
}

// Each region's allocator is sound and its granule arrays agree in length; sizes t's counts.
bool DevicePool::Impl::validate_regions(std::string* why, ValidateTally& t) const {
  for (const Region& r : regions) {
    std::string inner;
    if (!r.place.validate(&inner)) return fail(why, "region placement: " + inner);
    t.refs.emplace_back(r.place.granules(), 0);
    t.pending_refs.emplace_back(r.place.granules(), 0);
  }
  return true;
}

// Every granule's counts and flags agree with the blocks (t) and with the stats.
bool DevicePool::Impl::validate_granules(std::string* why, const ValidateTally& t) const {
  detail::GranuleMap::Tally granules;
  std::uint64_t busy = 0, unmapping = 0;
  for (std::size_t ri = 0; ri < regions.size(); ++ri) {
    const Region& r = regions[ri];
    for (std::uint64_t g = 0; g < r.place.granules(); ++g)
      if (r.place.ref_at(g) != t.refs[ri][g]) return fail(why, "granule reference count wrong");
    if (!r.map.validate(r.place, t.pending_refs[ri], granules, why)) return false;
    busy += r.map.busy_count();
    unmapping += r.map.unmapping_count();
  }
  if (granules.mapped * granule != st.reserved_bytes) return fail(why, "reserved_bytes disagrees with mapped granules");
  for (const Unmap& u : queued) {
    const std::uint8_t f = regions[u.region].map.flags(u.granule);
    if ((f & (detail::GranuleMap::kBusy | detail::GranuleMap::kMapped)) != detail::GranuleMap::kBusy)
      return fail(why, "a queued unmap is not busy");
  }
  if (granules.cached * granule != st.cached_bytes) return fail(why, "cached_bytes disagrees with unused mapped granules");
  if (st.reserved_bytes > capacity) return fail(why, "reserved exceeds capacity");
  return true;
}

}  // namespace ferry
